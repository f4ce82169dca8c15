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
        raise ValueError("Attention needs static Q, K and V shapes")
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
            raise ValueError("Attention needs a static attn_mask shape")
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
    if causal or left >= 0 or right >= 0:
        allowed = _window_mask(q_len, kv_len, past_len, causal, left, right)
        frontier = _const(np.where(allowed, 0, -np.inf), dtype)
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
        fully_masked = bb.emit(relax.op.equal(relax.op.max(bias, axis=-1, keepdims=True),
                                              _const(-np.inf, dtype)))
        probabilities = bb.emit(relax.op.where(fully_masked, _const(0, str(probabilities.ty.dtype)),
                                               probabilities))
    if mode == 3:
        qk_output = probabilities
    probabilities = bb.emit(relax.op.astype(probabilities, dtype))
    qk_output = bb.emit(relax.op.astype(qk_output, dtype))
    output = bb.emit(relax.op.matmul(probabilities, v))
    if rank == 3:
        output = bb.emit(relax.op.permute_dims(output, [0, 2, 1, 3]))
        output = bb.emit(relax.op.reshape(output, [batch, q_len, q_heads * static_shape(v)[3]]))
    return relax.Tuple([output, present_key, present_value, qk_output])


CONVERTERS = {"Attention": attention}
