"""ONNX Attention (opset 23+): scaled dot-product attention with masks, causal, caches and GQA.

Follows the ONNX specification and its reference implementation: ``scale``
(default ``1/sqrt(head_size)``) is applied as ``sqrt(scale)`` to both Q and K;
a boolean mask marks allowed positions, a float mask is added; ``is_causal``
aligns bottom-right with the past cache; ``softcap`` comes before the mask; a
row with every key masked yields zeros; grouped-query attention repeats each
key/value head (``h0, h0, h1, h1, ...``). Shapes must be static.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from tvm import relax

from forge_core.errors import ModelImportError
from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import static_shape


def _const(value: Any, dtype: str) -> relax.Expr:
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _to_4d(bb: relax.BlockBuilder, x: relax.Expr, heads: int) -> relax.Expr:
    batch, seq, hidden = static_shape(x)
    x = bb.emit(relax.op.reshape(x, [batch, seq, heads, hidden // heads]))
    return bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))


def _window_mask(q_len: int, kv_len: int, offset: int, causal: bool, left: int, right: int) -> np.ndarray:
    i = np.arange(q_len).reshape(-1, 1) + offset
    j = np.arange(kv_len).reshape(1, -1)
    allowed = np.ones((q_len, kv_len), dtype=bool)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= (i - j) <= left
    if right >= 0:
        allowed &= (j - i) <= right
    return allowed


def attention(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
              context: ConverterContext) -> relax.Expr:
    """Attention: softmax(Q K^T * scale + mask) V, ONNX opset 23-25."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask = inputs[3] if len(inputs) > 3 else None
    past_key = inputs[4] if len(inputs) > 4 else None
    past_value = inputs[5] if len(inputs) > 5 else None
    nonpad = inputs[6] if len(inputs) > 6 else None
    if any(static_shape(t) is None for t in (q, k, v)):
        raise ModelImportError("Attention needs static Q, K and V shapes")
    io_dtype = str(q.ty.dtype)
    if io_dtype in ("float16", "bfloat16"):
        # Compute in float32, as the reference does through numpy, and round once at the end.
        q, k, v = (bb.emit(relax.op.astype(t, "float32")) for t in (q, k, v))
        past_key, past_value = ((bb.emit(relax.op.astype(t, "float32")) if t is not None else None)
                                for t in (past_key, past_value))
        if mask is not None and str(mask.ty.dtype) != "bool":
            mask = bb.emit(relax.op.astype(mask, "float32"))
    dtype = str(q.ty.dtype)
    rank = len(static_shape(q))
    if rank == 3:
        q_heads, kv_heads = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
        q, k, v = _to_4d(bb, q, q_heads), _to_4d(bb, k, kv_heads), _to_4d(bb, v, kv_heads)
    batch, q_heads, q_len, head_size = static_shape(q)
    kv_heads = static_shape(k)[1]

    scale = attrs.get("scale")
    scale = float(scale) if scale is not None else 1.0 / np.sqrt(head_size)
    root = _const(np.sqrt(scale), dtype)
    past_len = 0
    if past_key is not None:
        past_len = static_shape(past_key)[2]
        k = bb.emit(relax.op.concat([past_key, k], axis=2))
        v = bb.emit(relax.op.concat([past_value, v], axis=2))
    present_key, present_value = k, v
    kv_len = static_shape(k)[2]

    # The additive bias: masks, causal frontier, sliding window, padding.
    causal = bool(attrs.get("is_causal", 0))
    left, right = int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1))
    bias: relax.Expr | None = None
    if mask is not None:
        mask_shape = static_shape(mask)
        if mask_shape is None:
            raise ModelImportError("Attention needs a static attn_mask shape")
        pad = kv_len - mask_shape[-1]
        if str(mask.ty.dtype) == "bool":
            if pad > 0:
                mask = bb.emit(relax.op.concat(
                    [mask, _const(np.zeros(mask_shape[:-1] + [pad], bool), "bool")], axis=-1))
            bias = bb.emit(relax.op.where(mask, _const(0, dtype), _const(-np.inf, dtype)))
        else:
            if pad > 0:
                mask = bb.emit(relax.op.concat(
                    [mask, _const(np.full(mask_shape[:-1] + [pad], -np.inf), dtype)], axis=-1))
            bias = mask
    if (causal or left >= 0 or right >= 0) and nonpad is None:
        allowed = _window_mask(q_len, kv_len, past_len, causal, left, right)
        frontier = _const(np.where(allowed, 0, -np.inf), dtype)
        bias = frontier if bias is None else bb.emit(relax.op.add(bias, frontier))
    elif causal or left >= 0 or right >= 0:
        # External cache: the frontier of batch b sits at nonpad_kv_seqlen[b] - q_len.
        offset = bb.emit(relax.op.subtract(relax.op.reshape(relax.op.astype(nonpad, "int64"), [batch, 1, 1, 1]),
                                           _const(q_len, "int64")))
        position = bb.emit(relax.op.add(_const(np.arange(q_len).reshape(1, 1, q_len, 1), "int64"), offset))
        key = _const(np.arange(kv_len).reshape(1, 1, 1, kv_len), "int64")
        distance = bb.emit(relax.op.subtract(position, key))  # p - j
        allowed = None
        conditions = []
        if causal:
            conditions.append(relax.op.greater_equal(distance, _const(0, "int64")))
        if left >= 0:
            conditions.append(relax.op.less_equal(distance, _const(left, "int64")))
        if right >= 0:
            conditions.append(relax.op.less_equal(relax.op.negative(distance), _const(right, "int64")))
        for condition in conditions:
            allowed = condition if allowed is None else relax.op.logical_and(allowed, condition)
        frontier = bb.emit(relax.op.where(allowed, _const(0, dtype), _const(-np.inf, dtype)))
        bias = frontier if bias is None else bb.emit(relax.op.add(bias, frontier))
    if nonpad is not None:
        positions = _const(np.arange(kv_len).reshape(1, 1, 1, kv_len), "int64")
        lengths = bb.emit(relax.op.reshape(relax.op.astype(nonpad, "int64"), [batch, 1, 1, 1]))
        valid = bb.emit(relax.op.less(positions, lengths))
        padding = bb.emit(relax.op.where(valid, _const(0, dtype), _const(-np.inf, dtype)))
        bias = padding if bias is None else bb.emit(relax.op.add(bias, padding))

    if q_heads != kv_heads and q_heads % kv_heads == 0:
        k = bb.emit(relax.op.repeat(k, q_heads // kv_heads, axis=1))
        v = bb.emit(relax.op.repeat(v, q_heads // kv_heads, axis=1))

    scores = bb.emit(relax.op.matmul(relax.op.multiply(q, root),
                                     relax.op.permute_dims(relax.op.multiply(k, root), [0, 1, 3, 2])))
    qk_output = scores
    softcap = attrs.get("softcap")
    if softcap is not None and float(softcap) > 0:
        cap = _const(float(softcap), dtype)
        scores = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(scores, cap)), cap))
        qk_output = scores
    with_bias = scores if bias is None else bb.emit(relax.op.add(scores, bias))
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    if mode == 2:
        qk_output = with_bias
    precision = attrs.get("softmax_precision")
    logits = with_bias
    if precision is not None:
        logits = bb.emit(relax.op.astype(logits, str(onnx.helper.tensor_dtype_to_np_dtype(int(precision)))))
    probabilities = bb.emit(relax.op.nn.softmax(logits, axis=-1))
    if bias is not None:
        # A row whose every key is masked (TVM's max starts from the lowest finite value, so count instead).
        open_keys = bb.emit(relax.op.astype(relax.op.not_equal(bias, _const(-np.inf, dtype)), "int32"))
        fully_masked = bb.emit(relax.op.equal(relax.op.max(open_keys, axis=-1, keepdims=True), _const(0, "int32")))
        probabilities = bb.emit(relax.op.where(fully_masked, _const(0, str(probabilities.ty.dtype)),
                                               probabilities))
    if mode == 3:
        qk_output = probabilities
    probabilities = bb.emit(relax.op.astype(probabilities, dtype))
    qk_output = bb.emit(relax.op.astype(qk_output, io_dtype))
    output = bb.emit(relax.op.matmul(probabilities, v))
    if rank == 3:
        output = bb.emit(relax.op.permute_dims(output, [0, 2, 1, 3]))
        output = bb.emit(relax.op.reshape(output, [batch, q_len, q_heads * static_shape(v)[3]]))
    if io_dtype != dtype:
        output, present_key, present_value = (bb.emit(relax.op.astype(t, io_dtype))
                                              for t in (output, present_key, present_value))
    return relax.Tuple([output, present_key, present_value, qk_output])


def rotary_embedding(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                     context: ConverterContext) -> relax.Expr:
    """RotaryEmbedding (opset 23): rotate (halves or interleaved pairs of) each head by the cos/sin caches."""
    x, cos_cache, sin_cache = inputs[0], inputs[1], inputs[2]
    position_ids = inputs[3] if len(inputs) > 3 else None
    shape = static_shape(x)
    if shape is None:
        raise ModelImportError("RotaryEmbedding needs a static input shape")
    if len(shape) == 4:
        x = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))  # [batch, seq, heads, head]
    else:
        heads = int(attrs["num_heads"])
        x = bb.emit(relax.op.reshape(x, [shape[0], shape[1], heads, shape[2] // heads]))
    batch, seq, heads, head = static_shape(x)
    rotary = int(attrs.get("rotary_embedding_dim", 0)) or head
    interleaved = bool(attrs.get("interleaved", 0))
    if position_ids is not None:
        cos_cache = bb.emit(relax.op.take(cos_cache, position_ids, axis=0))
        sin_cache = bb.emit(relax.op.take(sin_cache, position_ids, axis=0))
    cos = bb.emit(relax.op.expand_dims(cos_cache, 2))  # [batch, seq, 1, rotary/2]
    sin = bb.emit(relax.op.expand_dims(sin_cache, 2))
    rotate = bb.emit(relax.op.strided_slice(x, axes=[3], begin=[0], end=[rotary]))
    if interleaved:
        x1 = bb.emit(relax.op.strided_slice(rotate, axes=[3], begin=[0], end=[rotary], strides=[2]))
        x2 = bb.emit(relax.op.strided_slice(rotate, axes=[3], begin=[1], end=[rotary], strides=[2]))
    else:
        halves = bb.emit(relax.op.split(rotate, 2, axis=-1))
        x1, x2 = bb.emit(relax.TupleGetItem(halves, 0)), bb.emit(relax.TupleGetItem(halves, 1))
    real = bb.emit(relax.op.subtract(relax.op.multiply(cos, x1), relax.op.multiply(sin, x2)))
    imag = bb.emit(relax.op.add(relax.op.multiply(sin, x1), relax.op.multiply(cos, x2)))
    if interleaved:
        pairs = bb.emit(relax.op.stack([real, imag], axis=-1))
        rotated = bb.emit(relax.op.reshape(pairs, [batch, seq, heads, rotary]))
    else:
        rotated = bb.emit(relax.op.concat([real, imag], axis=-1))
    if rotary < head:
        rest = bb.emit(relax.op.strided_slice(x, axes=[3], begin=[rotary], end=[head]))
        rotated = bb.emit(relax.op.concat([rotated, rest], axis=-1))
    if len(shape) == 4:
        return relax.op.permute_dims(rotated, [0, 2, 1, 3])
    return relax.op.reshape(rotated, shape)


CONVERTERS = {"Attention": attention, "RotaryEmbedding": rotary_embedding}
