"""Range over lengths known symbolically, so that positions keep the sequence's own dim; OneHot's depth in
any of the forms ONNX allows."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

from forge_core.errors import InvalidModelError, UnsupportedFeatureError
from forge_onnx.converters import ConverterContext
from forge_onnx.symbolic_values import dims_analyzer, prim_dtype, symbolic_ints


def _scalar_dtype(value: Any) -> str:
    if tvm.ir.is_prim_expr(value):
        return prim_dtype(value)
    return str(value.ty.dtype)


def range_(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Range: ``arange(start, limit, delta)`` over the dims themselves when the bounds are shape arithmetic.

    ``Range(0, Shape(ids)[1], 1)`` then has the shape (sequence,), where TVM's converter would give it a
    new dim of its own (its length computed at run time), which no later broadcast could match with the
    sequence. Constant, float and unknown bounds, and lengths not provably >= 0, go to TVM's converter.
    """
    dtype = _scalar_dtype(inputs[0])
    values = [symbolic_ints(bb, value) for value in inputs]
    if not dtype.startswith("int") or any(v is None or len(v) != 1 for v in values):
        return context.tvm_convert("Range", inputs)
    start, limit, delta = (v[0] for v in values)
    analyzer = dims_analyzer(start, limit, delta)
    start, limit, delta = (analyzer.simplify(v) for v in (start, limit, delta))
    if all(isinstance(v, tirx.IntImm) for v in (start, limit, delta)) or not isinstance(delta, tirx.IntImm) \
            or int(delta.value) == 0:
        return context.tvm_convert("Range", inputs)
    ascending = int(delta.value) > 0
    if not analyzer.can_prove(limit >= start if ascending else start >= limit):
        return context.tvm_convert("Range", inputs)  # a length ONNX clamps at 0
    return relax.op.arange(start, limit, delta, dtype)


def one_hot(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """OneHot with a constant depth, which may be a one-element tensor (``[30]``, Paddle2ONNX) or of a float
    type, as ONNX allows; the output of the values' dtype (TVM's converter gave float64 for float32 values)."""
    indices, depth, values = inputs[0], inputs[1], inputs[2]
    if not isinstance(depth, tvm.ir.GenericConst) or not isinstance(values, tvm.ir.GenericConst):
        raise UnsupportedFeatureError("OneHot with a depth or values computed at run time is not supported; they "
                                      "must be constants (initializers or Constant nodes)")
    depth_values = np.asarray(depth.value.numpy()).reshape(-1)
    if depth_values.size != 1:
        raise InvalidModelError(f"OneHot's depth must hold one value; it holds {depth_values.size}")
    count = int(depth_values[0])
    dtype = str(values.ty.dtype)
    off, on = np.asarray(values.value.numpy()).reshape(-1)[:2].tolist()
    make = tvm.tirx.FloatImm if "float" in dtype else tvm.tirx.IntImm
    index_dtype = str(indices.ty.dtype)
    # ONNX counts a negative index from the end; an index outside [-depth, depth) gives a row of off values.
    extent = relax.const(count, index_dtype)
    indices = bb.emit(relax.op.where(relax.op.less(indices, relax.const(0, index_dtype)),
                                     relax.op.add(indices, extent), indices))
    return relax.op.one_hot(indices, relax.prim_value(make(dtype, on)), relax.prim_value(make(dtype, off)), count,
                            int(attrs.get("axis", -1)))


CONVERTERS = {"Range": range_, "OneHot": one_hot}
