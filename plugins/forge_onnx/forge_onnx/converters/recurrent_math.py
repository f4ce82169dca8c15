"""The recurrent operators' activation functions as TIR expressions that vectorize.

LLVM has no vector ``exp``/``tanh``: TVM's plain lowering calls the C library
once per element, which would cost more than a recurrent step's matrix
product. In float32, ``exp`` here is Cephes' ``expf`` (Cody-Waite range
reduction, a degree-5 polynomial) and ``tanh`` Cephes' ``tanhf``. Measured
against float64 (``tests/test_onnx_recurrent.py``): ``exp`` within 1 ulp of
the correctly rounded value, ``tanh`` 1.3, ``sigmoid`` = 1/(1+exp(-x)) 2.2
(numpy's float32 ``exp``: 2.3 ulps; 1/(1+exp(-x)) with it: 2.7). So the kernels
that use them are exact to float32 precision at every ``opt_level``. Other
float types, and the rare activations' ``log`` (Softplus), use TVM's
(the C library's) functions.

Activations follow ONNX's ``activations``/``activation_alpha``/``activation_beta``
as onnxruntime reads them: only the functions that take an alpha (or beta)
consume one from the list, in order; a missing one gets the default of the ONNX
operator of that name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import tirx

from forge_core.errors import ModelImportError

Expr = tvm.ir.Expr

# Cephes expf: exp(x) = 2^n * exp(r), r = x - n ln2 in [-ln2/2, ln2/2], ln2 split in two (Cody-Waite).
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Inputs clamped so that 2^n stays a normal float: exp(88.376) ~ 2.4e38, exp(-87.337) ~ 1.2e-38.
_EXP_HI = 88.3762626647949
_EXP_LO = -87.3365447505531
# Cephes tanhf: an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above.
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
_TANH_SMALL = 0.625


def dtype_of(x: Expr) -> str:
    return str(x.ty.dtype)


def like(value: float, x: Expr) -> Expr:
    """``value`` as a constant of ``x``'s type."""
    return tirx.const(value, dtype_of(x))


def _horner(coefficients: tuple[float, ...], x: Expr) -> Expr:
    result: Expr = like(coefficients[0], x)
    for c in coefficients[1:]:
        result = result * x + like(c, x)
    return result


def let(value: Expr, body: Callable[[Expr], Expr], name: str = "v") -> Expr:
    """``body(v)`` with ``v`` bound to ``value`` once (an expression used several times is computed once)."""
    if isinstance(value, (tirx.Var, tirx.FloatImm, tirx.IntImm)):
        return body(value)
    var = tirx.Var(name, value.ty.dtype)
    return tirx.Let(var, value, body(var))


def exp(x: Expr) -> Expr:
    """e^x; in float32 clamped to the normal range (the clamp changes nothing a sigmoid or tanh can see).

    Other float types use TVM's ``exp`` (the C library's, per element).
    """
    if dtype_of(x) != "float32":
        return tirx.exp(x)
    const = lambda v: like(v, x)  # noqa: E731
    clamped = tirx.max(tirx.min(x, const(_EXP_HI)), const(_EXP_LO))

    def reduced(x: Expr) -> Expr:
        def scaled(n: Expr) -> Expr:
            scale = tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("int32", n) + 127, 23))
            poly = let(x - n * const(_LN2_HI) - n * const(_LN2_LO),
                       lambda r: _horner(_EXP_POLY, r) * r * r + r + const(1.0), "r")
            return poly * scale

        return let(tirx.floor(x * const(_LOG2E) + const(0.5)), scaled, "n")

    return let(clamped, reduced, "x")


def sigmoid(x: Expr) -> Expr:
    return like(1.0, x) / (like(1.0, x) + exp(-x))


def tanh(x: Expr) -> Expr:
    """tanh(x); TVM's for float types other than float32."""
    if dtype_of(x) != "float32":
        return tirx.tanh(x)
    const = lambda v: like(v, x)  # noqa: E731

    def of(x: Expr) -> Expr:
        def split(magnitude: Expr) -> Expr:
            small = let(x * x, lambda squared: x + x * squared * _horner(_TANH_POLY, squared), "x2")
            large = let(const(1.0) - const(2.0) / (exp(magnitude + magnitude) + const(1.0)),
                        lambda large: tirx.Select(x < const(0.0), -large, large), "t")
            return tirx.Select(magnitude < const(_TANH_SMALL), small, large)

        return let(tirx.abs(x), split, "ax")

    return let(x, of, "x")


@dataclass(frozen=True)
class Activation:
    """One ONNX recurrent activation: its lower-case name and the alpha/beta it takes (None when unused)."""

    name: str
    alpha: float | None = None
    beta: float | None = None

    def __call__(self, x: Expr) -> Expr:
        return _FUNCTIONS[self.name](x, 0.0 if self.alpha is None else self.alpha,
                                     0.0 if self.beta is None else self.beta)


def _elu(x: Expr, alpha: float, _beta: float) -> Expr:
    return tirx.Select(x >= like(0.0, x), x, like(alpha, x) * (exp(x) - like(1.0, x)))


def _softplus(x: Expr, _alpha: float, _beta: float) -> Expr:
    # log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|).
    return tirx.max(x, like(0.0, x)) + tirx.log(like(1.0, x) + exp(-tirx.abs(x)))


def _hardsigmoid(x: Expr, alpha: float, beta: float) -> Expr:
    return tirx.max(like(0.0, x), tirx.min(like(1.0, x), like(alpha, x) * x + like(beta, x)))


_FUNCTIONS: dict[str, Callable[[Expr, float, float], Expr]] = {
    "sigmoid": lambda x, a, b: sigmoid(x),
    "tanh": lambda x, a, b: tanh(x),
    "relu": lambda x, a, b: tirx.max(x, like(0.0, x)),
    "leakyrelu": lambda x, a, b: tirx.Select(x >= like(0.0, x), x, like(a, x) * x),
    "thresholdedrelu": lambda x, a, b: tirx.Select(x > like(a, x), x, like(0.0, x)),
    "hardsigmoid": _hardsigmoid,
    "affine": lambda x, a, b: like(a, x) * x + like(b, x),
    "scaledtanh": lambda x, a, b: like(a, x) * tanh(like(b, x) * x),
    "softsign": lambda x, a, b: x / (like(1.0, x) + tirx.abs(x)),
    "softplus": _softplus,
    "elu": _elu,
}

# (takes alpha, takes beta, default alpha, default beta), as ONNX's operators of those names define them.
_PARAMETERS: dict[str, tuple[bool, bool, float, float]] = {
    "sigmoid": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0), "relu": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0), "softplus": (False, False, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0), "thresholdedrelu": (True, False, 1.0, 0.0), "elu": (True, False, 1.0, 0.0),
    "hardsigmoid": (True, True, 0.2, 0.5), "affine": (True, True, 1.0, 0.0), "scaledtanh": (True, True, 1.0, 1.0),
}


def activations(names: list[str], alphas: list[float], betas: list[float]) -> list[Activation]:
    """``names`` with their alpha/beta, each list consumed in order by the functions that take one.

    Raises ValueError for a function ONNX does not define.
    """
    alpha_list, beta_list = list(alphas), list(betas)
    result = []
    for raw in names:
        name = raw.lower()
        if name not in _PARAMETERS:
            raise ModelImportError(f"unsupported recurrent activation {raw!r}")
        takes_alpha, takes_beta, default_alpha, default_beta = _PARAMETERS[name]
        alpha = (alpha_list.pop(0) if alpha_list else default_alpha) if takes_alpha else None
        beta = (beta_list.pop(0) if beta_list else default_beta) if takes_beta else None
        result.append(Activation(name, None if alpha is None else float(alpha), None if beta is None else float(beta)))
    return result
