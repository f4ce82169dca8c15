"""Range over lengths known symbolically, so that positions keep the sequence's own dim."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, tirx

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


CONVERTERS = {"Range": range_}
