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


def _log1p(e: relax.Expr, dtype: str) -> relax.Expr:
    """log(1 + e) for 0 <= e <= 1, accurate where ``e`` is small; Relax has no ``log1p``.

    ``log(1 + e)`` keeps none of the digits of ``e`` below the float's
    epsilon. Below 0.1 the series ``e - e^2/2 + ... + e^7/7`` is used
    (relative error under 2e-8); above it ``log(1 + e)`` rounds by at most
    1e-6 relative. No cancellation trick is used: TVM's simplifier folds
    ``(1 + e) - 1`` into ``e`` inside fused kernels.
    """
    series = relax.const(1.0 / 7.0, dtype)
    for k in range(6, 0, -1):
        series = relax.op.subtract(relax.const(1.0 / k, dtype), relax.op.multiply(e, series))
    series = relax.op.multiply(e, series)
    direct = relax.op.log(relax.op.add(relax.const(1.0, dtype), e))
    return relax.op.where(relax.op.less(e, relax.const(0.1, dtype)), series, direct)


def softplus(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Softplus(x) = max(x, 0) + log1p(exp(-|x|)), exact in both tails.

    TVM's converter computes ``log(1 + exp(-|x|))``, which is off by 0.1%
    near ``x = -9`` in float32 and rounds to 0 below ``x = -17``.
    """
    x = inputs[0]
    dtype = str(x.ty.dtype)
    tail = relax.op.exp(relax.op.negative(relax.op.abs(x)))
    return relax.op.add(relax.op.maximum(x, relax.const(0.0, dtype)), _log1p(tail, dtype))


def mish(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Mish(x) = x * tanh(softplus(x)) = x * n / (n + 2), n = e^x (e^x + 2).

    The rational form has no cancellation: TVM's ``tanh`` and
    ``log(1 + exp(x))`` both round a tiny softplus to 0, which made every
    output below ``x = -17`` zero. ``x`` is capped at 20 inside ``exp``,
    where ``n / (n + 2)`` is 1 in float32, so large inputs do not overflow.
    """
    x = inputs[0]
    dtype = str(x.ty.dtype)
    t = relax.op.exp(relax.op.minimum(x, relax.const(20.0, dtype)))
    n = relax.op.multiply(t, relax.op.add(t, relax.const(2.0, dtype)))
    return relax.op.multiply(x, relax.op.divide(n, relax.op.add(n, relax.const(2.0, dtype))))


CONVERTERS = {"Celu": celu, "Clip": clip, "Mish": mish, "Softplus": softplus}
