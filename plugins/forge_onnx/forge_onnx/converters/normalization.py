"""LayerNormalization with its optional Mean and InvStdDev outputs, on any axis."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from tvm import relax

from forge_onnx.converters import ConverterContext


def layer_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                        context: ConverterContext) -> relax.Expr:
    """LayerNormalization: normalize over dims axis..end; Mean and InvStdDev when the node asks for them."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = x.ty.ndim
    axis = int(attrs.get("axis", -1)) % rank
    epsilon = float(attrs.get("epsilon", 1e-5))
    dtype = str(x.ty.dtype)
    stash = onnx.helper.tensor_dtype_to_np_dtype(int(attrs.get("stash_type", onnx.TensorProto.FLOAT)))
    axes = list(range(axis, rank))
    if context.outputs == 1 and axis == rank - 1 and bias is not None and str(np.dtype(stash)) == dtype:
        return relax.op.nn.layer_norm(x, scale, bias, axes=[-1], epsilon=epsilon)
    compute = str(np.dtype(stash))
    xs = bb.emit(relax.op.astype(x, compute)) if compute != dtype else x
    mean = bb.emit(relax.op.mean(xs, axis=axes, keepdims=True))
    centered = bb.emit(relax.op.subtract(xs, mean))
    variance = bb.emit(relax.op.mean(relax.op.multiply(centered, centered), axis=axes, keepdims=True))
    inv_std = bb.emit(relax.op.rsqrt(relax.op.add(variance, relax.const(epsilon, compute))))
    normalized = bb.emit(relax.op.multiply(centered, inv_std))
    if compute != dtype:
        normalized = bb.emit(relax.op.astype(normalized, dtype))
    y = bb.emit(relax.op.multiply(normalized, scale))
    if bias is not None:
        y = bb.emit(relax.op.add(y, bias))
    if context.outputs == 1:
        return y
    return relax.Tuple([y, mean, inv_std])


def rms_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                      context: ConverterContext) -> relax.Expr:
    """RMSNormalization: x / sqrt(mean(x^2 over dims axis..end) + epsilon) * scale."""
    x, scale = inputs[0], inputs[1]
    rank = x.ty.ndim
    axes = list(range(int(attrs.get("axis", -1)) % rank, rank))
    epsilon = float(attrs.get("epsilon", 1e-5))
    dtype = str(x.ty.dtype)
    compute = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(attrs.get("stash_type", onnx.TensorProto.FLOAT)))))
    xs = bb.emit(relax.op.astype(x, compute)) if compute != dtype else x
    mean_square = bb.emit(relax.op.mean(relax.op.multiply(xs, xs), axis=axes, keepdims=True))
    normalized = bb.emit(relax.op.multiply(xs, relax.op.rsqrt(relax.op.add(mean_square,
                                                                             relax.const(epsilon, compute)))))
    if compute != dtype:
        normalized = bb.emit(relax.op.astype(normalized, dtype))
    return relax.op.multiply(normalized, scale)


CONVERTERS = {"LayerNormalization": layer_normalization, "RMSNormalization": rms_normalization}
