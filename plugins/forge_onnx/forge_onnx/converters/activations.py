"""Activations TVM's ONNX importer lacks or lowers too early."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_onnx.converters import ConverterContext


def celu(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = inputs[0]
    dtype = str(x.ty.dtype)
    alpha = relax.const(float(attrs.get("alpha", 1.0)), dtype)
    zero = relax.const(0.0, dtype)
    one = relax.const(1.0, dtype)
    negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)), one))
    return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(zero, negative))


def _clip_bound(bound: Any, dtype: str, lowest: bool) -> relax.Expr | None:
    """A Clip bound as a Relax expression; None when absent or NaN (ONNX: no bound)."""
    if bound is None:
        return None
    if isinstance(bound, tvm.ir.GenericConst):
        value = bound.value.numpy()
        if value.size == 1 and np.isnan(value).all():
            return None
        return relax.const(value.reshape(()).astype(dtype), dtype)
    if dtype.startswith(("float", "bfloat")):
        unbounded = relax.const(-np.inf if lowest else np.inf, dtype)
        return relax.op.where(relax.op.isnan(bound), unbounded, bound)
    return bound


def clip(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Clip(x, lo, hi) = min(max(x, lo), hi), with Relax's maximum and minimum.

    TVM's converter emits TE functions (``call_tir``) at import, which
    ``ToMixedPrecision`` (``set_float16``) rejects; these operators stay
    high-level until legalization and fuse like any elementwise op.
    """
    x = inputs[0]
    dtype = str(x.ty.dtype)
    if context.opset < 11:
        lo = relax.const(float(attrs.get("min", -np.inf)), dtype)
        hi = relax.const(float(attrs.get("max", np.inf)), dtype)
    else:
        lo = _clip_bound(inputs[1] if len(inputs) > 1 else None, dtype, lowest=True)
        hi = _clip_bound(inputs[2] if len(inputs) > 2 else None, dtype, lowest=False)
    if lo is not None:
        x = relax.op.maximum(x, lo)
    if hi is not None:
        x = relax.op.minimum(x, hi)
    return x


CONVERTERS = {"Celu": celu, "Clip": clip}
