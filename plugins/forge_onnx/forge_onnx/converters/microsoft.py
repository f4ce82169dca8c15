"""onnxruntime's ``com.microsoft`` operators that its graph optimizers write into saved models.

A model saved after onnxruntime's optimizations (``SessionOptions.optimized_model_filepath``, the transformer
optimizer) holds fused operators of its contrib domain: a convolution with its activation (``FusedConv``), a
matmul with its transposes and scale (``FusedMatMul``), ``QuickGelu``, and the RMS norms of
decoder models (``SkipSimplifiedLayerNormalization``; ``SimplifiedLayerNormalization`` is registered by
onnxruntime in ONNX's default domain), and ``DynamicQuantizeLSTM``, which its ``quantize_dynamic`` writes. Each is the composition onnxruntime's CPU kernel computes. The transformer
optimizer's ``Attention``, ``EmbedLayerNormalization`` and ``SkipLayerNormalization`` are in
``microsoft_bert.py``; ``Gelu``, ``FastGelu`` and ``BiasGelu`` keep TVM's converters, which take dynamic dims.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from forge_core.errors import InvalidModelError, ModelImportError
from forge_onnx.converters import ConverterContext, attr_text, constant_value

DOMAIN = "com.microsoft"


def _activation(x: relax.Expr, name: str, params: list[float], node: str) -> relax.Expr:
    dtype = str(x.ty.dtype)

    def const(value: float) -> relax.Expr:
        return relax.const(np.asarray(value, dtype=dtype), dtype)

    if name == "Relu":
        return relax.op.nn.relu(x)
    if name == "Tanh":
        return relax.op.tanh(x)
    if name == "Sigmoid":
        return relax.op.sigmoid(x)
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return relax.op.where(relax.op.less(x, const(0.0)), relax.op.multiply(x, const(alpha)), x)
    if name == "Clip":
        low, high = (params + [-np.inf, np.inf][len(params):])[:2] if params else (-np.inf, np.inf)
        return relax.op.minimum(relax.op.maximum(x, const(low)), const(high))
    if name == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2] if params else (0.2, 0.5)
        linear = relax.op.add(relax.op.multiply(x, const(alpha)), const(beta))
        return relax.op.minimum(relax.op.maximum(linear, const(0.0)), const(1.0))
    raise InvalidModelError(f"FusedConv {node!r}: activation {name!r} is not one onnxruntime fuses "
                            "(Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid)")


def fused_conv(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
               context: ConverterContext) -> relax.Expr:
    """FusedConv: activation(Conv(X, W, B) + Z), Z optional (onnxruntime's Conv + Add + activation fusion)."""
    conv_attrs = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
    conv_inputs = list(inputs[:3]) + [None] * (3 - len(inputs[:3]))
    y = bb.normalize(context.tvm_convert("Conv", conv_inputs, conv_attrs))
    if len(inputs) > 3 and inputs[3] is not None:
        y = bb.normalize(relax.op.add(y, inputs[3]))
    name = attr_text(attrs.get("activation"), "")
    if not name:
        return y
    return _activation(y, name, [float(p) for p in attrs.get("activation_params", [])], context.node)


def fused_matmul(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                 context: ConverterContext) -> relax.Expr:
    """FusedMatMul: alpha * op(A) @ op(B), op transposing the last two axes where transA / transB say."""
    if int(attrs.get("transBatchA", 0)) or int(attrs.get("transBatchB", 0)):
        raise ModelImportError(f"FusedMatMul {context.node!r}: transBatchA / transBatchB are not supported")
    a, b = inputs[0], inputs[1]

    def transposed(x: relax.Expr) -> relax.Expr:
        rank = x.ty.ndim
        if rank < 2:
            raise InvalidModelError(f"FusedMatMul {context.node!r}: a transposed operand needs rank 2 or more, "
                                    f"given {x.ty}")
        return relax.op.permute_dims(x, [*range(rank - 2), rank - 1, rank - 2])

    if int(attrs.get("transA", 0)):
        a = transposed(a)
    if int(attrs.get("transB", 0)):
        b = transposed(b)
    y = bb.normalize(relax.op.matmul(a, b))
    alpha = float(attrs.get("alpha", 1.0))
    if alpha == 1.0:
        return y
    dtype = str(y.ty.dtype)
    return relax.op.multiply(y, relax.const(np.asarray(alpha, dtype=dtype), dtype))


def quick_gelu(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
               context: ConverterContext) -> relax.Expr:
    """QuickGelu: x * sigmoid(alpha * x), alpha 1.702 by default (CLIP's activation)."""
    x = inputs[0]
    dtype = str(x.ty.dtype)
    alpha = relax.const(np.asarray(float(attrs.get("alpha", 1.702)), dtype=dtype), dtype)
    return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, alpha)))


def _rms_norm(x: relax.Expr, gamma: relax.Expr, epsilon: float, node: str) -> tuple[relax.Expr, relax.Expr]:
    """(x * gamma / sqrt(mean(x^2, last axis) + epsilon), the inverse RMS), computed in float32 as onnxruntime's
    kernel does for float16 inputs."""
    dtype = str(x.ty.dtype)
    wide = relax.op.astype(x, "float32") if dtype != "float32" else x
    mean_square = relax.op.mean(relax.op.multiply(wide, wide), axis=[-1], keepdims=True)
    inverse = relax.op.rsqrt(relax.op.add(mean_square, relax.const(np.float32(epsilon), "float32")))
    normalized = relax.op.multiply(wide, inverse)
    if dtype != "float32":
        normalized = relax.op.astype(normalized, dtype)
    return relax.op.multiply(normalized, gamma), inverse


def simplified_layer_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                                   context: ConverterContext) -> relax.Expr:
    """SimplifiedLayerNormalization (RMS norm over the last axis): x / sqrt(mean(x^2) + epsilon) * scale."""
    axis = int(attrs.get("axis", -1))
    if axis not in (-1, inputs[0].ty.ndim - 1):
        raise ModelImportError(f"SimplifiedLayerNormalization {context.node!r}: only the last axis is supported, given "
                               f"axis {axis}")
    y, inverse = _rms_norm(inputs[0], inputs[1], float(attrs.get("epsilon", 1e-5)), context.node)
    if context.outputs == 1:
        return y
    return relax.Tuple([y, bb.normalize(inverse)][:context.outputs])


def skip_simplified_layer_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                                        context: ConverterContext) -> relax.Expr:
    """SkipSimplifiedLayerNormalization: RMS norm of input + skip (+ bias); outputs the normed value, then the
    mean (unused: empty), the inverse RMS and the sum, as onnxruntime's kernel does."""
    total = relax.op.add(inputs[0], inputs[1])
    if len(inputs) > 3 and inputs[3] is not None:
        total = relax.op.add(total, inputs[3])
    total = bb.normalize(total)
    y, inverse = _rms_norm(total, inputs[2], float(attrs.get("epsilon", 1e-5)), context.node)
    if context.outputs == 1:
        return y
    outputs = [y, relax.const(np.zeros((0,), "float32"), "float32"), bb.normalize(inverse), total]
    return relax.Tuple(outputs[:context.outputs])


def _integer_gates(weights: Any, scale: Any, zero_point: Any, name: str, node: str) -> tuple[relax.Expr, np.ndarray]:
    """An int8/uint8 weight ``[dirs, rows, 4 * hidden]`` with its scale and zero point (per direction, or per
    gate row ``[dirs, 4 * hidden]``): the integers less the zero point as the ``[dirs, 4 * hidden, rows]`` (int32)
    that LSTM takes, and the scale of each of those rows ``[dirs, 4 * hidden]`` (float32)."""
    values = [constant_value(v) for v in (weights, scale, zero_point)]
    if any(v is None for v in values):
        raise ModelImportError(f"DynamicQuantizeLSTM {node!r}: {name}, its scale and zero point must be constants "
                               "of the model (onnxruntime's quantize_dynamic writes them as initializers)")
    q, s, z = values
    if q.ndim != 3 or s.shape not in ((q.shape[0],), (q.shape[0], q.shape[2])) or s.shape != z.shape:
        raise InvalidModelError(
            f"DynamicQuantizeLSTM {node!r}: {name} has shape {q.shape} with scale {s.shape} and zero point "
            f"{z.shape}; expected [dirs, rows, 4*hidden] with [dirs] or [dirs, 4*hidden]")
    along = (q.shape[0], 1, 1) if s.ndim == 1 else (q.shape[0], 1, q.shape[2])
    centered = q.astype(np.int32) - z.astype(np.int32).reshape(along)
    scales = np.broadcast_to(s.astype(np.float32).reshape(along[0], along[2]), (q.shape[0], q.shape[2]))
    return relax.const(np.ascontiguousarray(centered.transpose(0, 2, 1))), np.ascontiguousarray(scales)


def dynamic_quantize_lstm(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                          context: ConverterContext) -> relax.Expr:
    """onnxruntime's ``quantize_dynamic`` of an LSTM: its int8 weights ``W`` and ``R`` (transposed, with their
    scales and zero points), computed as onnxruntime's CPU kernel does.

    ``X`` (over every step run) and, at every step, each direction's hidden state are quantized to uint8 with
    the scale and zero point of their range; the products are integer, scaled back to float32; the gates are
    float32. onnxruntime splits the batch among its threads when it has several rows, each part quantized on
    its own, so its numbers then change with its thread count: Forge quantizes the whole batch, as onnxruntime
    on one thread.
    """
    from forge_onnx.converters.recurrent import WeightScales, lstm

    padded = list(inputs) + [None] * (12 - len(inputs))
    x, w, r, b, lengths, h0, c0, peepholes, w_scale, w_zero, r_scale, r_zero = padded[:12]
    weights, w_scales = _integer_gates(w, w_scale, w_zero, "W", context.node)
    recurrence, r_scales = _integer_gates(r, r_scale, r_zero, "R", context.node)
    return lstm(bb, [x, weights, recurrence, b, lengths, h0, c0, peepholes], attrs, context,
                WeightScales(w_scales, r_scales))


CONVERTERS = {"FusedConv": fused_conv, "FusedMatMul": fused_matmul, "QuickGelu": quick_gelu,
              "SkipSimplifiedLayerNormalization": skip_simplified_layer_normalization,
              "DynamicQuantizeLSTM": dynamic_quantize_lstm}

DEFAULT_DOMAIN_CONVERTERS = {"SimplifiedLayerNormalization": simplified_layer_normalization}
"""onnxruntime registers SimplifiedLayerNormalization in ONNX's default domain."""
