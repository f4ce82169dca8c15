"""float16 that says when it cannot hold: ``set_float16`` keeps out-of-range values in float32.

TVM's ``ToMixedPrecision`` stores convolution and matmul outputs, and the
elementwise chains that follow them, in float16, whose largest finite value is
65504. A model whose activations grow past it (a ResNet-50 whose logits reach
1.3e5, an attention mask of ``finfo(float32).min``) gave inf, then NaN, and
nothing said so.

Before the conversion the float32 model runs on this machine's CPU, every float
tensor it computes watched, on random inputs with the inputs' shapes and
dtypes (normal floats, integers 0 or 1; every dynamic dim at 1, then at 32
where the model takes it, the larger value kept). A binding
whose largest finite magnitude passes :data:`LIMIT` (a quarter of 65504: a
margin for inputs larger than the samples) stays in float32, and so does
every convolution or matmul that reads it (they would cast it to float16);
each is named in the compile log. TVM's pass keeps a call to anything but an
operator in its input dtypes, so those bindings are hidden from it as calls to
placeholders (:class:`relax.ExternFunc`) and put back after it. So are the
operators that take a plain value argument (``triu``'s diagonal), which TVM's
pass cannot type ("Expected TensorType, but got T.int64"): they compute in
their own dtype.

Where the check cannot run (the float32 model does not build or run on the
CPU), the compile log says the values were not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

logger = logging.getLogger("forge.compile")

FLOAT16_MAX = 65504.0
LIMIT = FLOAT16_MAX / 4
"""A binding whose largest finite magnitude on the samples passes this stays in float32."""

DYNAMIC_SIZES = (32,)
"""Beside 1, the sizes every dynamic dim takes in the check (values that grow with a length or a batch: sums
over a sequence, a batch's statistics); a size the model does not take is skipped."""

_PLACEHOLDER = "forge.float32_kept."
_ALWAYS = 0  # TVM's TMixedPrecisionPolicy: kAlways (conv2d, matmul: float16 inputs), kFollow = 1, kNever = none


def _policy(call: relax.Call) -> int | None:
    if not isinstance(call.op, tvm.ir.Op):
        return None
    value = call.op.get_attr("TMixedPrecisionPolicy")
    return None if value is None else int(value)


def _is_float32_tensor(expr: relax.Expr) -> bool:
    info = expr.ty
    return isinstance(info, relax.TensorType) and info.dtype == "float32"


def _bindings(func: relax.Function) -> list[relax.VarBinding]:
    return [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]


def _vars_in(expr: relax.Expr) -> list[relax.Var]:
    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Tuple):
        return [v for field in expr.fields for v in _vars_in(field)]
    return []


def measure(mod: tvm.IRModule, opt_level: int = 2, seed: int = 0) -> dict[str, float]:
    """The largest finite magnitude of each float32 tensor that an operator computes in ``main``, by binding
    name, on random inputs (run on this machine's CPU)."""
    from forge_core.compiler.pipeline import build
    from forge_core.ir.introspection import input_specs
    from forge_core.passes import keeping_match_casts
    from forge_core.runtime.signature import DYNAMIC_DIM, random_inputs
    from forge_core.targets.parsing import resolve_target

    plain = relax.transform.ToNonDataflow()(mod)
    func = plain["main"]
    watched = [b.var for b in _bindings(func)
               if isinstance(b.value, relax.Call) and _policy(b.value) is not None and _is_float32_tensor(b.var)]
    if not watched:
        return {}
    result = func.body.body
    body = relax.BlockBuilder().normalize(relax.SeqExpr(func.body.blocks, relax.Tuple([result, *watched])))
    watching = tvm.IRModule(dict(plain.functions), attrs=plain.attrs)
    watching["main"] = relax.Function(func.params, body, None, func.is_pure, func.attrs)
    watching = keeping_match_casts(relax.transform.Normalize()(watching), relax.transform.ConvertToDataflow())
    specs = input_specs(list(func.params))
    executable = build(watching, resolve_target("llvm"), opt_level)
    vm = tvm.runtime.vm.VirtualMachine(executable, tvm.cpu())
    dynamic = any(spec.shape is not None and DYNAMIC_DIM in spec.shape for spec in specs)
    ranges: dict[str, float] = {}
    for size in (1, *DYNAMIC_SIZES) if dynamic else (1,):
        try:
            outputs = vm["main"](*[tvm.runtime.tensor(a) for a in random_inputs(specs, seed, dynamic_size=size)])
        except Exception as exc:  # noqa: BLE001 - a size the model does not take (the first size raises on)
            if size == 1:
                raise
            logger.debug("set_float16's range check: dynamic dims of %d do not run (%s)", size, exc)
            continue
        for var, value in zip(watched, list(outputs)[1:]):
            array = value.numpy()
            finite = np.abs(array[np.isfinite(array)])
            ranges[var.name] = max(ranges.get(var.name, 0.0), float(finite.max()) if finite.size else 0.0)
    return ranges


def kept_in_float32(mod: tvm.IRModule, ranges: dict[str, float]) -> list[str]:
    """The bindings of ``main`` that stay in float32: those past :data:`LIMIT`, and the convolutions and
    matmuls that read one (in binding order)."""
    out_of_range = {name for name, value in ranges.items() if value > LIMIT}
    kept: list[str] = []
    for binding in _bindings(mod["main"]):
        value, name = binding.value, binding.var.name
        if not isinstance(value, relax.Call) or _policy(value) is None:
            continue
        reads_kept = _policy(value) == _ALWAYS and any(
            v.name in out_of_range for arg in value.args for v in _vars_in(arg))
        if name in out_of_range or reads_kept:
            out_of_range.add(name)
            kept.append(name)
    return kept


def _value_argument(arg: relax.Expr) -> bool:
    """An argument that is a plain value (``triu``'s diagonal, ``clip``'s bounds), not a Relax expression."""
    return isinstance(getattr(arg, "ty", None), tvm.ir.PrimType)


def takes_values(call: relax.Expr) -> bool:
    """Whether ``call`` is an operator with a plain value argument, which ``ToMixedPrecision`` cannot type."""
    return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and any(map(_value_argument, call.args))


@mutator
class _Hide(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, names: set[str]) -> None:
        super().__init__(mod)
        self.names = names
        self.hidden: dict[str, relax.Call] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: N802 (TVM's name)
        value = binding.value
        if not isinstance(value, relax.Call) or (binding.var.name not in self.names and not takes_values(value)):
            return super().visit_var_binding_(binding)
        # the placeholder takes the Relax arguments alone; the plain values wait in the hidden call
        args = [self.visit_expr(arg) for arg in value.args if not _value_argument(arg)]
        symbol = f"{_PLACEHOLDER}{len(self.hidden)}"
        self.hidden[symbol] = value
        call = self.builder_.normalize(relax.Call(relax.ExternFunc(symbol), args, None, [binding.var.ty]))
        new_var = type(binding.var)(binding.var.name, binding.var.ty)
        self.builder_.emit_normalized(relax.VarBinding(new_var, call))
        self.set_var_remap(binding.var, new_var)
        return None


@mutator
class _Restore(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, hidden: dict[str, relax.Call]) -> None:
        super().__init__(mod)
        self.hidden = hidden

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's name)
        args = [self.visit_expr(arg) for arg in call.args]
        if isinstance(call.op, relax.ExternFunc) and str(call.op.global_symbol) in self.hidden:
            original = self.hidden[str(call.op.global_symbol)]
            given = iter(args)
            merged = [arg if _value_argument(arg) else next(given) for arg in original.args]
            return self.builder_.normalize(relax.Call(original.op, merged, original.attrs, original.ty_args))
        if all(new.same_as(old) for new, old in zip(args, call.args)):
            return call
        return self.builder_.normalize(relax.Call(call.op, args, call.attrs, call.ty_args))


def convert_keeping_range(mod: tvm.IRModule, convert: Callable[[tvm.IRModule], tvm.IRModule],
                          params: Mapping[str, Any] | None = None, opt_level: int = 2) -> tvm.IRModule:
    """``convert(mod)`` (TVM's mixed-precision conversion), with the bindings whose values leave float16's range
    kept in float32 and named in the log. ``params``: weights held outside ``mod`` (bound for the check only)."""
    from forge_core.ir import weights

    try:
        ranges = measure(weights.bind_params(mod, dict(params)) if params else mod, opt_level)
    except Exception as exc:  # noqa: BLE001 - a model the CPU build or run refuses: said, then converted as is
        logger.warning("set_float16: the float32 values were not checked against float16's range (the check runs "
                       "the model on the CPU, which failed: %s); a value past 65504 would become inf",
                       str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
        return _convert_hiding(mod, convert, [])
    kept = kept_in_float32(mod, ranges)
    result = _convert_hiding(mod, convert, kept)
    if not kept:
        return result
    shown = ", ".join(f"{name} ({ranges[name]:.3g})" if name in ranges and ranges[name] > LIMIT
                      else f"{name} (reads one)" for name in kept[:12])
    logger.warning("set_float16: %d operator%s stay in float32, their values (on random inputs) past float16's "
                   "safe range (|x| > %g; float16 ends at 65504): %s%s", len(kept), "" if len(kept) == 1 else "s",
                   LIMIT, shown, f", and {len(kept) - 12} more" if len(kept) > 12 else "")
    return result


def _convert_hiding(mod: tvm.IRModule, convert: Callable[[tvm.IRModule], tvm.IRModule],
                    kept: list[str]) -> tvm.IRModule:
    """``convert(mod)`` with the bindings named in ``kept``, and the operators that take plain values, hidden
    from it (they stay in their dtypes)."""
    hide = _Hide(mod, set(kept))
    hidden_main = hide.visit_expr(mod["main"])
    if not hide.hidden:
        return convert(mod)
    hidden = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    hidden["main"] = hidden_main
    converted = convert(hidden)
    restored = _Restore(converted, hide.hidden).visit_expr(converted["main"])
    result = tvm.IRModule(dict(converted.functions), attrs=converted.attrs)
    result["main"] = restored
    return relax.transform.Normalize()(result)

