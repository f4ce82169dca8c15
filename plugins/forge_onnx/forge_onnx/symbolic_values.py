"""Small integer tensors known symbolically at import: shape arithmetic on dynamic dims.

Exported graphs compute positions and masks from the input's shape
(``Shape -> Gather -> Range(0, sequence)``). TVM's converters carry those
values as tensors, so a length computed from them becomes a fresh symbolic dim
that Relax cannot relate to ``sequence``, and a later broadcast or matmul
between the two has no known shape. Forge evaluates such values over the
Relax bindings, as expressions of the dims themselves, so that converters can
use ``sequence`` where the graph means it.
"""

from __future__ import annotations

import tvm
from tvm import relax, sym, tirx

# Shape arithmetic works on scalars and on short shape vectors.
MAX_ELEMENTS = 8
MAX_DEPTH = 64

Values = list[tvm.ir.Expr]

_BINARY = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.floor_divide": tirx.floordiv,
    "relax.maximum": tirx.max,
    "relax.minimum": tirx.min,
}
_SAME_VALUES = {"relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.astype"}


def _is_int(dtype: object) -> bool:
    return str(dtype).startswith(("int", "uint"))


def prim_dtype(value: tvm.ir.Expr) -> str:
    """A scalar expression's dtype (a variable has it in its type only)."""
    return str(getattr(value, "dtype", None) or value.ty)


def _as_int64(value: tvm.ir.Expr) -> tvm.ir.Expr:
    return value if prim_dtype(value) == "int64" else tirx.Cast("int64", value)


def _constant_values(constant: relax.Expr) -> Values | None:
    array = constant.value.numpy()
    if not _is_int(array.dtype) or array.size > MAX_ELEMENTS:
        return None
    return [tirx.IntImm("int64", int(v)) for v in array.reshape(-1)]


def _broadcast(a: Values, b: Values) -> tuple[Values, Values] | None:
    if len(a) == len(b):
        return a, b
    if len(a) == 1:
        return a * len(b), b
    if len(b) == 1:
        return a, b * len(a)
    return None


def _call_values(bb: relax.BlockBuilder, call: relax.Call, depth: int) -> Values | None:
    name = call.op.name
    if name == "relax.shape_to_tensor":
        return symbolic_ints(bb, call.args[0], depth + 1)
    if name in _SAME_VALUES:
        if name == "relax.astype" and not _is_int(call.attrs.dtype):
            return None
        return symbolic_ints(bb, call.args[0], depth + 1)
    if name == "relax.negative":
        values = symbolic_ints(bb, call.args[0], depth + 1)
        return None if values is None else [-v for v in values]
    if name in _BINARY:
        left, right = (symbolic_ints(bb, a, depth + 1) for a in call.args)
        pair = None if left is None or right is None else _broadcast(left, right)
        return None if pair is None else [_BINARY[name](a, b) for a, b in zip(*pair)]
    if name == "relax.take":
        data, indices = symbolic_ints(bb, call.args[0], depth + 1), call.args[1]
        if data is None or not isinstance(indices, tvm.ir.GenericConst) or call.args[0].ty.ndim != 1:
            return None
        positions = _constant_values(indices)
        if positions is None or any(not -len(data) <= int(p) < len(data) for p in positions):
            return None
        return [data[int(p)] for p in positions]
    if name == "relax.concat" and isinstance(call.args[0], relax.Tuple):
        parts = [symbolic_ints(bb, f, depth + 1) for f in call.args[0].fields]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    return None


def symbolic_ints(bb: relax.BlockBuilder, expr: relax.Expr, depth: int = 0) -> Values | None:
    """The flat int64 values of a small integer tensor, shape or scalar, as expressions; None when unknown."""
    if depth > MAX_DEPTH or expr is None:
        return None
    if isinstance(expr, relax.ShapeExpr):
        return [_as_int64(v) for v in expr.values]
    if tvm.ir.is_prim_expr(expr):  # a scalar value, e.g. Gather of a dim from a shape
        return [_as_int64(expr)] if _is_int(prim_dtype(expr)) else None
    if isinstance(expr, tvm.ir.GenericConst):
        return _constant_values(expr)
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and not _is_int(ty.dtype):
        return None
    if isinstance(expr, relax.Var):
        bound = bb.lookup_binding(expr)
        return None if bound is None else symbolic_ints(bb, bound, depth + 1)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        values = _call_values(bb, expr, depth)
        if values is None or len(values) > MAX_ELEMENTS or _element_count(expr) != len(values):
            return None  # e.g. a broadcast of (2, 1) with (1, 2): four elements, not two
        return values
    return None


def _element_count(expr: relax.Expr) -> int | None:
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.ShapeType):
        return None if ty.ndim < 0 else ty.ndim  # a shape value: one element a dim
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    count = 1
    for dim in ty.shape.values:
        if not isinstance(dim, tirx.IntImm):
            return None
        count *= int(dim.value)
    return count


def dims_analyzer(*exprs: tvm.ir.Expr) -> sym.Analyzer:
    """An analyzer that knows every variable in ``exprs`` is a dim, so at least 0."""
    analyzer = sym.Analyzer()
    for expr in exprs:
        for var in tirx.analysis.undefined_vars(expr):
            analyzer.update(var, sym.ConstIntBound(0, sym.ConstIntBound.POS_INF), override=True)
    return analyzer
