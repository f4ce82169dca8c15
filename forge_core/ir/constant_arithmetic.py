"""Constant arithmetic evaluated with numpy before Relax's ``FoldConstant``.

``FoldConstant`` evaluates each call whose operands are all constants by
legalizing it and building the PrimFunc with LLVM: about 40 ms a call. A batch
norm that no convolution precedes (DenseNet's pre-activation blocks, a
transformer's scale) decomposes into a handful of such calls per channel
vector, and DenseNet-121's import spent 28 of its 33 s building 540 of them.

:func:`fold_arithmetic` evaluates those calls with numpy first, for the
operators whose result numpy computes bit for bit as TVM's code does: IEEE
``+ - * /``, ``sqrt``, negation, ``min``/``max`` on floating-point tensors,
and the layout operators (``expand_dims``, ``reshape``, ``permute_dims``,
``squeeze``, ``broadcast_to``) on any dtype. Anything else (integer division, transcendental
functions, casts) is left to ``FoldConstant``. A result whose shape or dtype is
not the one Relax inferred for the binding is left alone too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from forge_core.graph.index import _handle
from forge_core.ir.index_checks import clamped_takes
from forge_core.passes import map_bindings, replace_functions

_FLOAT = frozenset({"float16", "float32", "float64"})

_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.divide(np.ones((), x.dtype), np.sqrt(x))


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": _rsqrt,
    "relax.negative": np.negative,
}


def _ints(values: object) -> list[int] | None:
    if values is None:
        return None
    return [int(v) for v in values]  # type: ignore[attr-defined]


def _layout(name: str, call: relax.Call, x: np.ndarray) -> np.ndarray | None:
    attrs = call.attrs
    if name == "relax.expand_dims":
        result = x
        for axis in sorted(a % (x.ndim + len(attrs.axis)) for a in _ints(attrs.axis) or []):
            result = np.expand_dims(result, axis)
        return result
    if name == "relax.permute_dims":
        axes = _ints(attrs.axes)
        return np.transpose(x, axes)
    if name == "relax.squeeze":
        axes = _ints(attrs.axis)
        return np.squeeze(x, tuple(axes)) if axes is not None else np.squeeze(x)
    if name in ("relax.reshape", "relax.broadcast_to"):
        shape = call.args[1]
        if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
            return None
        dims = [int(d) for d in shape.values]
        return x.reshape(dims) if name == "relax.reshape" else np.broadcast_to(x, dims)
    return None


_LAYOUT = frozenset({"relax.expand_dims", "relax.permute_dims", "relax.squeeze", "relax.reshape",
                     "relax.broadcast_to"})


def _evaluate(call: relax.Call, operand: Callable[[relax.Expr], np.ndarray | None]) -> np.ndarray | None:
    if not isinstance(call.op, tvm.ir.Op):
        return None
    name = str(call.op.name)
    if name in _BINARY:
        a = operand(call.args[0])  # the second is read only when the first is known: no copy of a weight
        b = operand(call.args[1]) if a is not None else None
        if a is None or b is None or a.dtype != b.dtype or str(a.dtype) not in _FLOAT:
            return None
        return _BINARY[name](a, b)
    if name in _UNARY:
        x = operand(call.args[0])
        if x is None or str(x.dtype) not in _FLOAT:
            return None
        return _UNARY[name](x)
    if name in _LAYOUT:
        x = operand(call.args[0])
        return None if x is None else _layout(name, call, x)
    return None


def _matches(value: np.ndarray, ty: object) -> bool:
    """Whether ``value`` has the static shape and dtype Relax inferred (``ty``)."""
    if not isinstance(ty, relax.TensorType) or str(ty.dtype) != str(value.dtype):
        return False
    shape = ty.shape
    if not isinstance(shape, relax.ShapeExpr):
        return False
    dims = list(shape.values)
    return all(isinstance(d, tvm.tirx.IntImm) for d in dims) and [int(d) for d in dims] == list(value.shape)


def _fold_function(func: relax.Function) -> tuple[relax.Function, int]:
    known: dict[int, np.ndarray] = {}

    def operand(expr: relax.Expr) -> np.ndarray | None:
        if isinstance(expr, tvm.ir.GenericConst):
            value = expr.value
            return value.numpy() if isinstance(value, tvm.runtime.Tensor) else None
        if isinstance(expr, relax.Var):
            return known.get(_handle(expr))
        return None

    folded = 0

    def fold(binding: relax.Binding) -> relax.Binding:
        nonlocal folded
        value = binding.value
        if not (isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call)):
            return binding
        try:
            with np.errstate(all="ignore"):  # 1/0 is inf, as TVM's code computes it, without a warning
                result = _evaluate(value, operand)
        except (ValueError, TypeError, IndexError):
            result = None  # numpy refused it: FoldConstant decides
        if result is None:
            return binding
        result = np.ascontiguousarray(result)
        if not _matches(result, binding.var.ty):
            return binding
        known[_handle(binding.var)] = result
        folded += 1
        return relax.VarBinding(binding.var, relax.const(result, str(result.dtype)))

    body = map_bindings(func.body, fold)
    if not folded:
        return func, 0
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs), folded


def fold_arithmetic(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the constant arithmetic and layout calls described above bound to their values.

    The bindings stay (bound to constants); ``FoldConstant`` then propagates
    them into their readers and drops what is dead.
    """
    updated = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            new, folded = _fold_function(func)
            if folded:
                updated[gv] = new
    return replace_functions(mod, updated)


# Relax's FoldConstant legalizes a ``dynamic_strided_slice`` (a Slice whose ends are computed at run time) to
# find its shape, keeps the legalized calls, and drops the PrimFunc they call (its ``shape_func``): the module
# then fails to build ("There is no definition of I.GlobalVar("shape_func")"). Such calls are held out of it.
_HELD_OPS = ("relax.dynamic_strided_slice",)
_HELD_PREFIX = "forge.held_op."


@relax.expr_functor.mutator
class _HoldCalls(relax.expr_functor.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, hold: bool) -> None:
        super().__init__(mod)
        self.hold = hold

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's name)
        call = super().visit_call_(call)
        if self.hold and isinstance(call.op, tvm.ir.Op) and str(call.op.name) in _HELD_OPS:
            return relax.call_pure_packed(_HELD_PREFIX + str(call.op.name), *call.args, ty_args=call.ty)
        if not self.hold and isinstance(call.op, tvm.ir.Op) and str(call.op.name) == "relax.call_pure_packed":
            callee = call.args[0]
            name = str(getattr(callee, "global_symbol", ""))
            if name.startswith(_HELD_PREFIX):
                return relax.Call(tvm.ir.Op.get(name[len(_HELD_PREFIX):]), list(call.args[1:]))
        return call


def _held(mod: tvm.IRModule, hold: bool) -> tvm.IRModule:
    updated = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            body = _HoldCalls(mod, hold).visit_expr(func.body)
            if not body.same_as(func.body):
                updated[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    return replace_functions(mod, updated) if updated else mod


def fold_constant(mod: tvm.IRModule) -> tvm.IRModule:
    """Relax's ``FoldConstant`` on a module of Relax operators, with the calls it would break held out of it.

    Its takes are bounded first (:func:`~forge_core.ir.index_checks.clamped_takes`): ``FoldConstant`` lowers
    every call it meets, and TVM logged "fast mode segfaults" for each lookup of every imported model."""
    return relax.transform.Normalize()(_held(relax.transform.FoldConstant()(_held(clamped_takes(mod), True)), False))
