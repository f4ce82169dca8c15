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
from forge_core.passes import replace_functions

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
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call):
                try:
                    with np.errstate(all="ignore"):  # 1/0 is inf, as TVM's code computes it, without a warning
                        result = _evaluate(value, operand)
                except (ValueError, TypeError, IndexError):
                    result = None  # numpy refused it: FoldConstant decides
                if result is not None:
                    result = np.ascontiguousarray(result)
                    if _matches(result, binding.var.ty):
                        known[_handle(binding.var)] = result
                        binding = relax.VarBinding(binding.var, relax.const(result, str(result.dtype)))
                        folded += 1
            bindings.append(binding)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    if not folded:
        return func, 0
    body = relax.SeqExpr(blocks, func.body.body)
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
# FoldConstant also legalizes every other operator call of a dataflow block (TE, then a PrimFunc), constant or
# not, before it looks at the arguments: 1.4 of Inception-v1's 2.2 s of import. A call with an argument that
# is no constant and cannot become one is held out of it too, as a packed call of this name and its index.
_HELD_PREFIX = "forge.held_call."
_NEVER_HELD = ("relax.call_tir", "relax.call_pure_packed")


def _may_be_constant(expr: relax.Expr, constant: set[int]) -> bool:
    """False for a variable not in ``constant``, a tuple holding one, and a nested call; True for the rest
    (constants, shapes, scalars, strings, data types, functions)."""
    if isinstance(expr, relax.Var):
        return _handle(expr) in constant
    if isinstance(expr, relax.Tuple):
        return all(_may_be_constant(field, constant) for field in expr.fields)
    return not isinstance(expr, relax.Call)


def _calls_to_hold(func: relax.Function, legalize_all: bool) -> set[int]:
    """The operator calls of ``func`` that FoldConstant must not see (:data:`_HELD_OPS`) and, unless
    ``legalize_all``, those it cannot fold."""
    constant: set[int] = set()
    held: set[int] = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(binding, relax.VarBinding):
                continue
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                    and str(value.op.name) not in _NEVER_HELD:
                if str(value.op.name) in _HELD_OPS or (
                        not legalize_all and not all(_may_be_constant(a, constant) for a in value.args)):
                    held.add(_handle(value))
                    continue
            if (isinstance(value, relax.Call) and all(_may_be_constant(a, constant) for a in value.args)) \
                    or _may_be_constant(value, constant):
                constant.add(_handle(binding.var))
    return held


@relax.expr_functor.mutator
class _HoldCalls(relax.expr_functor.PyExprMutator):
    """Hides the calls of ``held`` behind packed calls named by their index in ``originals``."""

    def __init__(self, mod: tvm.IRModule, held: set[int], originals: list[relax.Call]) -> None:
        super().__init__(mod)
        self.held, self.originals = held, originals

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's name)
        hold = _handle(call) in self.held
        call = super().visit_call_(call)
        if not hold:
            return call
        self.originals.append(call)
        # FoldConstant still puts a shape in place of a variable bound to it, in this call as in every other.
        return relax.call_pure_packed(f"{_HELD_PREFIX}{len(self.originals) - 1}", *call.args, ty_args=call.ty)


@relax.expr_functor.mutator
class _ReleaseCalls(relax.expr_functor.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, originals: list[relax.Call]) -> None:
        super().__init__(mod)
        self.originals = originals

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's name)
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and str(call.op.name) == "relax.call_pure_packed":
            name = str(getattr(call.args[0], "global_symbol", ""))
            if name.startswith(_HELD_PREFIX):
                original = self.originals[int(name[len(_HELD_PREFIX):])]
                return relax.Call(original.op, list(call.args[1:]), original.attrs, original.ty_args)
        return call


def _rewrite(mod: tvm.IRModule, mutator: Callable[[relax.Function], relax.expr_functor.PyExprMutator]) -> tvm.IRModule:
    updated = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            body = mutator(func).visit_expr(func.body)
            if not body.same_as(func.body):
                updated[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    return replace_functions(mod, updated) if updated else mod


def fold_constant(mod: tvm.IRModule, *, legalize_all: bool = False) -> tvm.IRModule:
    """Relax's ``FoldConstant`` on a module of Relax operators, with the calls it would break, and those it
    cannot fold, held out of it.

    With ``legalize_all``, FoldConstant still legalizes every call it is given (constant or not), as it
    does on its own: a call that TVM cannot lower then fails here. The import passes ask for that once,
    so that such a call fails on import, where the frontend names the node it comes from.
    """
    originals: list[relax.Call] = []
    held = _rewrite(mod, lambda func: _HoldCalls(mod, _calls_to_hold(func, legalize_all), originals))
    folded = relax.transform.FoldConstant()(held)
    return relax.transform.Normalize()(_rewrite(folded, lambda func: _ReleaseCalls(folded, originals)))
