"""QLinearMatMul: integer matrix product, requantized with round-half-to-even as ONNX specifies."""

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


CONVERTERS = {"QLinearMatMul": qlinear_matmul}
