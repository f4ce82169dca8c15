"""Quantized matrix products.

* QLinearMatMul: integer matrix product, requantized with round-half-to-even as ONNX specifies.
* MatMulInteger (what onnxruntime's ``quantize_dynamic`` writes, after a
  ``DynamicQuantizeLinear``): with a constant int8 right-hand side whose zero
  point is 0 and a uint8 left-hand side with one zero point ``z``, the product
  is ``u @ w - z * colsum(w)``, exactly: ``matmul(uint8, int8 constant)`` is
  the form the VNNI rule (``Int8Matmul``) takes, and the zero point's term is
  a constant vector times a scalar. Other operands go to TVM's converter
  (every operand widened to int32 first).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from forge_onnx.converters import ConverterContext


def _centered(bb: relax.BlockBuilder, x: relax.Expr, zero_point: relax.Expr) -> relax.Expr:
    return bb.emit(relax.op.subtract(relax.op.astype(x, "int32"), relax.op.astype(zero_point, "int32")))


def _row_scale(bb: relax.BlockBuilder, scale: relax.Expr) -> relax.Expr:
    """A per-row scale [M] of the left operand broadcasts as [M, 1] (as float32)."""
    as_float = bb.emit(relax.op.astype(scale, "float32"))
    if scale.ty.ndim == 1:
        return bb.emit(relax.op.expand_dims(as_float, -1))
    return as_float


def round_half_even(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    dtype = str(x.ty.dtype)
    floor = bb.emit(relax.op.floor(x))
    fraction = bb.emit(relax.op.subtract(x, floor))
    half = relax.const(0.5, dtype)
    odd = bb.emit(relax.op.floor_mod(floor, relax.const(2.0, dtype)))
    tie = bb.emit(relax.op.add(floor, odd))
    up = bb.emit(relax.op.add(floor, relax.const(1.0, dtype)))
    return bb.emit(relax.op.where(relax.op.greater(fraction, half), up,
                                  relax.op.where(relax.op.less(fraction, half), floor, tie)))


def qlinear_matmul(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """QLinearMatMul: saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp)."""
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    out_dtype = str(y_zp.ty.dtype)
    product = bb.emit(relax.op.matmul(_centered(bb, a, a_zp), _centered(bb, b, b_zp), out_dtype="int32"))
    scale = bb.emit(relax.op.divide(relax.op.multiply(_row_scale(bb, a_scale),
                                                      relax.op.astype(b_scale, "float32")),
                                     relax.op.astype(y_scale, "float32")))
    scaled = bb.emit(relax.op.multiply(relax.op.astype(product, "float32"), scale))
    rounded = round_half_even(bb, scaled)
    shifted = bb.emit(relax.op.add(rounded, relax.op.astype(y_zp, "float32")))
    info = np.iinfo(out_dtype)
    return relax.op.astype(relax.op.clip(shifted, float(info.min), float(info.max)), out_dtype)


def _scalar_zero(zero_point: Any) -> bool:
    """An absent zero point, or a constant one equal to 0 everywhere."""
    if zero_point is None:
        return True
    value = getattr(zero_point, "value", None)
    return value is not None and hasattr(value, "numpy") and not np.any(value.numpy())


def matmul_integer(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """MatMulInteger: ``(a - a_zp) @ (b - b_zp)`` in int32; as ``u8 @ i8 - z * colsum(b)`` when it can."""
    a, b, *zero_points = [*inputs, None, None][:4]
    a_zp, b_zp = zero_points[0], zero_points[1]
    weight = getattr(b, "value", None)
    if weight is None or not hasattr(weight, "numpy") or str(b.ty.dtype) != "int8" or b.ty.ndim != 2 \
            or str(a.ty.dtype) != "uint8" or not _scalar_zero(b_zp) \
            or (a_zp is not None and (a_zp.ty.ndim not in (0, 1) or a_zp.ty.ndim == 1 and
                                      [int(d) for d in a_zp.ty.shape.values] != [1])):
        return context.tvm_convert("MatMulInteger", inputs)
    product = bb.emit(relax.op.matmul(a, b, out_dtype="int32"))
    if a_zp is None or _scalar_zero(a_zp):
        return product
    column_sums = relax.const(weight.numpy().astype(np.int64).sum(axis=0).astype(np.int32))
    zero_point = bb.emit(relax.op.reshape(relax.op.astype(a_zp, "int32"), []))
    return relax.op.subtract(product, relax.op.multiply(zero_point, column_sums))


CONVERTERS = {"QLinearMatMul": qlinear_matmul, "MatMulInteger": matmul_integer}
