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

import functools
import operator
from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, sym, tirx

# Shape arithmetic works on scalars and on short shape vectors.
MAX_ELEMENTS = 8
MAX_DEPTH = 64

Values = list[tvm.ir.Expr]

def _divide(a: tvm.ir.Expr, b: tvm.ir.Expr) -> tvm.ir.Expr:
    """ONNX's Div: integers truncate (C's division), floats divide."""
    return tirx.truncdiv(a, b) if _is_int(prim_dtype(a)) else tirx.Div(a, b)


_BINARY = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.floor_divide": tirx.floordiv,
    "relax.divide": _divide,
    "relax.maximum": tirx.max,
    "relax.minimum": tirx.min,
}
_BINARY.update({  # comparisons: the conditions of where (TVM's Gather normalizes negative indices with one)
    "relax.less": lambda a, b: a < b,
    "relax.greater": lambda a, b: a > b,
    "relax.less_equal": lambda a, b: a <= b,
    "relax.greater_equal": lambda a, b: a >= b,
    "relax.equal": tirx.EQ,
    "relax.not_equal": tirx.NE,
})


def _rounded(round_float: Callable[[tvm.ir.Expr], tvm.ir.Expr]) -> Callable[[tvm.ir.Expr], tvm.ir.Expr]:
    return lambda v: v if _is_int(prim_dtype(v)) else round_float(v)


def _finite(value: tvm.ir.Expr) -> bool:
    """Whether a float expression of dims is finite for every value of them: casts of integers, float constants,
    and sums, differences, products, divisions by a nonzero constant, floors and ceilings of such."""
    if isinstance(value, (tirx.FloatImm, tirx.IntImm)):
        return bool(np.isfinite(float(value.value)))
    if isinstance(value, tirx.Cast):
        return _is_int(prim_dtype(value.value)) or _finite(value.value)
    if isinstance(value, tirx.Var):
        return _is_int(prim_dtype(value))
    if isinstance(value, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Max, tirx.Min)):
        return _finite(value.a) and _finite(value.b)
    if isinstance(value, tirx.Div):
        return _finite(value.a) and isinstance(value.b, tirx.FloatImm) and float(value.b.value) != 0.0
    if isinstance(value, tvm.ir.Call) and getattr(value.op, "name", "") in ("prim.ceil", "prim.floor", "prim.round"):
        return all(_finite(arg) for arg in value.args)
    return False


def _isfinite(value: tvm.ir.Expr) -> tvm.ir.Expr:
    # TVM's Cast from float to int guards against inf and nan; on shape arithmetic that cannot make either, the
    # guard folds away (its isnan and fabs do not lower as shape expressions)
    return tirx.const(True, "bool") if _finite(value) else tirx.isfinite(value)


_UNARY = {
    "relax.negative": lambda v: -v,
    "relax.floor": _rounded(tirx.floor),
    "relax.ceil": _rounded(tirx.ceil),
    "relax.isfinite": _isfinite,
    "relax.logical_not": tirx.Not,
}


def _tuple_ints(expr: relax.Expr) -> list[int] | None:
    """The ints of a tuple of integer constants (strided_slice's axes, begin, end, strides)."""
    fields = getattr(expr, "fields", None) if isinstance(expr, relax.Tuple) else getattr(expr, "values", None)
    if fields is None:
        return None
    values = []
    for field in fields:
        if not isinstance(field, tirx.IntImm) and tvm.ir.is_prim_expr(getattr(field, "value", None)):
            field = field.value  # a PrimValue
        if not isinstance(field, tirx.IntImm):
            return None
        values.append(int(field.value))
    return values
_FLOATS = ("float16", "float32", "float64")
_SAME_VALUES = {"relax.reshape", "relax.squeeze", "relax.expand_dims"}


def _is_int(dtype: object) -> bool:
    return str(dtype).startswith(("int", "uint"))


def prim_dtype(value: tvm.ir.Expr) -> str:
    """A scalar expression's dtype (a variable has it in its type only)."""
    return str(getattr(value, "dtype", None) or value.ty)


def _as_int64(value: tvm.ir.Expr) -> tvm.ir.Expr:
    return value if prim_dtype(value) == "int64" else tirx.Cast("int64", value)


def _constant_values(constant: relax.Expr) -> Values | None:
    array = constant.value.numpy()
    if array.size > MAX_ELEMENTS:
        return None
    if _is_int(array.dtype):
        return [tirx.IntImm("int64", int(v)) for v in array.reshape(-1)]
    if str(array.dtype) in _FLOATS:  # a scale in shape arithmetic: Cast(dim, float) * 0.5 -> Cast(int64)
        return [tirx.FloatImm(str(array.dtype), float(v)) for v in array.reshape(-1)]
    return None


def _same_kind(values: Values) -> bool:
    """All integers or all floats of one type: TIR's arithmetic does not mix them."""
    return len({prim_dtype(v) for v in values}) == 1


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
    if name == "relax.shape_of":
        ty = call.args[0].ty
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            return [_as_int64(v) for v in ty.shape.values]
        return None
    if name == "relax.shape_to_tensor":
        return symbolic_ints(bb, call.args[0], depth + 1)
    if name == "relax.astype":
        values = symbolic_ints(bb, call.args[0], depth + 1)
        dtype = str(call.attrs.dtype)
        if values is None or not (_is_int(dtype) or dtype in _FLOATS):
            return None
        # ONNX's Cast from float to integer truncates toward zero, as TIR's cast does.
        return [_as_int64(v) if _is_int(dtype) else tirx.Cast(dtype, v) for v in values]
    if name in _SAME_VALUES:
        return symbolic_ints(bb, call.args[0], depth + 1)
    if name in _UNARY:
        values = symbolic_ints(bb, call.args[0], depth + 1)
        return None if values is None else [_UNARY[name](v) for v in values]
    if name in ("relax.prod", "relax.sum") and call.args[0].ty.ndim == 1:
        values = symbolic_ints(bb, call.args[0], depth + 1)
        if not values:
            return None
        return [functools.reduce(operator.mul if name == "relax.prod" else operator.add, values)]
    if name in _BINARY:
        left, right = (symbolic_ints(bb, a, depth + 1) for a in call.args)
        pair = None if left is None or right is None else _broadcast(left, right)
        if pair is None or not _same_kind(pair[0] + pair[1]):
            return None
        return [_BINARY[name](a, b) for a, b in zip(*pair)]
    if name == "relax.where":
        parts = [symbolic_ints(bb, a, depth + 1) for a in call.args]
        if any(p is None for p in parts):
            return None
        size = max(len(p) for p in parts)
        if any(len(p) not in (1, size) for p in parts) or not _same_kind(parts[1] + parts[2]):
            return None
        cond, yes, no = (p * size if len(p) == 1 else p for p in parts)
        return [tirx.Select(c, a, b) for c, a, b in zip(cond, yes, no)]
    if name == "relax.take":
        # TVM's Gather wraps the indices in where(i < 0, i + n, i): they fold to constants here.
        data, indices = symbolic_ints(bb, call.args[0], depth + 1), symbolic_ints(bb, call.args[1], depth + 1)
        if data is None or indices is None or call.args[0].ty.ndim != 1:
            return None
        positions = [sym.Analyzer().simplify(p) for p in indices]
        if any(not isinstance(p, tirx.IntImm) or not -len(data) <= int(p.value) < len(data) for p in positions):
            return None
        return [data[int(p.value)] for p in positions]
    if name == "relax.strided_slice" and call.args[0].ty.ndim == 1:
        data = symbolic_ints(bb, call.args[0], depth + 1)
        bounds = [_tuple_ints(a) for a in call.args[1:5]] if len(call.args) >= 4 else None
        if data is None or bounds is None or any(b is None for b in bounds[:3]):
            return None
        axes, begin, end = bounds[:3]
        step = bounds[3] if len(bounds) > 3 and bounds[3] is not None else [1]
        if axes != [0] or len(begin) != 1 or len(end) != 1 or len(step) != 1 or step[0] == 0:
            return None
        return data[slice(begin[0], end[0], step[0])]
    if name == "relax.concat" and isinstance(call.args[0], relax.Tuple):
        parts = [symbolic_ints(bb, f, depth + 1) for f in call.args[0].fields]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    return None


def symbolic_ints(bb: relax.BlockBuilder, expr: relax.Expr, depth: int = 0) -> Values | None:
    """The flat int64 values of a small integer tensor, shape or scalar, as expressions; None when unknown.

    On the way, float values take part where shape arithmetic scales a dim (``Cast(w, float) * 0.5``, then
    ``Cast`` back, which truncates as ONNX's does); a result that is not integer is None.
    """
    values = _symbolic_values(bb, expr, depth)
    if values is None or (depth == 0 and not all(_is_int(prim_dtype(v)) for v in values)):
        return None
    return values


def _symbolic_values(bb: relax.BlockBuilder, expr: relax.Expr, depth: int = 0) -> Values | None:
    if depth > MAX_DEPTH or expr is None:
        return None
    if isinstance(expr, relax.ShapeExpr):
        return [_as_int64(v) for v in expr.values]
    if tvm.ir.is_prim_expr(expr):  # a scalar value, e.g. Gather of a dim from a shape
        return [_as_int64(expr)] if _is_int(prim_dtype(expr)) else None
    if isinstance(expr, tvm.ir.GenericConst):
        return _constant_values(expr)
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and not (_is_int(ty.dtype) or str(ty.dtype) in (*_FLOATS, "bool")):
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
