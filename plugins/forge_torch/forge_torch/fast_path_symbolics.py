"""ONNX symbolics for PyTorch's fused inference fast paths, so that TorchScript holding them exports.

In eval mode with gradients off, ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` (self-attention, ``batch_first``) call fused kernels,
``aten::_transformer_encoder_layer_fwd`` and ``aten::_native_multi_head_attention``.
``torch.jit.trace`` records them as they are, and the TorchScript ONNX exporter
has no symbolic for them. A module already traced cannot be traced again
without them, so Forge decomposes them into standard ONNX operators while it
exports: the in-projection, scaled dot-product attention, the out-projection
and, for the encoder layer, its two layer norms (pre- or post-norm) and its
ReLU or exact-GELU feed-forward.

Masks follow the fused kernels, not the Python path: the mask reaching them is
additive (``F._canonical_mask`` made it so), but they read every non-zero entry
as "masked out"; ``mask_type`` 0 is an (L, S) attention mask, 1 an (N, S) key
padding mask, 2 a merged (N, H, L, S) mask. A row whose keys are all masked is
NaN in PyTorch's kernel and the mean of the values here.

The symbolics are registered only while Forge exports (:func:`registered`), and
never over a symbolic the user registered for the same op: an export of the
same trace with ``torch.onnx.export`` alone still fails as before.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.onnx import symbolic_helper

from forge_core.errors import ModelImportError

ENCODER_LAYER = "aten::_transformer_encoder_layer_fwd"
MULTI_HEAD_ATTENTION = "aten::_native_multi_head_attention"

# The exporter picks, for an export at opset n, the symbolic registered at the highest opset <= n. The
# decomposition below adapts to the export's opset (LayerNormalization from 17, ReduceMean's axes input from 18).
_REGISTERED_AT = 9


def _dtype_of(value: Any) -> torch.dtype:
    scalar = symbolic_helper._try_get_scalar_type(value)
    return scalar.dtype() if scalar is not None else torch.float32


def _scalar(g: Any, number: float, dtype: torch.dtype) -> Any:
    return g.op("Constant", value_t=torch.tensor(number, dtype=dtype))


def _ints(g: Any, values: list[int]) -> Any:
    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))


def _linear(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """x @ weight.T + bias, as nn.Linear."""
    return g.op("Add", g.op("MatMul", x, g.op("Transpose", weight, perm_i=[1, 0])), bias)


def _packed_part(g: Any, packed: Any, index: int, embed_dim: int, weight: bool) -> Any:
    """Rows ``index * E .. (index + 1) * E`` of a packed (3E, E) in-projection weight or (3E,) bias."""
    shape = [3, embed_dim, -1] if weight else [3, embed_dim]
    index_value = g.op("Constant", value_t=torch.tensor(index, dtype=torch.int64))  # 0-d: the axis goes away
    return g.op("Gather", g.op("Reshape", packed, _ints(g, shape)), index_value, axis_i=0)


def _reduce_mean_last(g: Any, x: Any) -> Any:
    if g.opset >= 18:
        return g.op("ReduceMean", x, _ints(g, [-1]), keepdims_i=1)
    return g.op("ReduceMean", x, axes_i=[-1], keepdims_i=1)


def _layer_norm(g: Any, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    if g.opset >= 17:
        return g.op("LayerNormalization", x, weight, bias, axis_i=-1, epsilon_f=eps)
    dtype = _dtype_of(x)
    centred = g.op("Sub", x, _reduce_mean_last(g, x))
    variance = _reduce_mean_last(g, g.op("Mul", centred, centred))
    normed = g.op("Div", centred, g.op("Sqrt", g.op("Add", variance, _scalar(g, eps, dtype))))
    return g.op("Add", g.op("Mul", normed, weight), bias)


def _gelu(g: Any, x: Any) -> Any:
    """Exact GELU, x * (1 + erf(x / sqrt(2))) / 2, as the fused kernel computes it."""
    dtype = _dtype_of(x)
    erf = g.op("Erf", g.op("Div", x, _scalar(g, math.sqrt(2.0), dtype)))
    return g.op("Mul", g.op("Mul", x, _scalar(g, 0.5, dtype)), g.op("Add", erf, _scalar(g, 1.0, dtype)))


def _constant_int(value: Any) -> int | None:
    if value is None or symbolic_helper._is_none(value):
        return None
    return int(symbolic_helper._maybe_get_const(value, "i"))


def _attention(g: Any, query: Any, key: Any, value: Any, embed_dim: int, heads: int, qkv_weight: Any,
               qkv_bias: Any, proj_weight: Any, proj_bias: Any, mask: Any, mask_type: int | None) -> tuple[Any, Any]:
    """Multi-head attention as the fused kernels compute it: (output (N, L, E), probabilities (N, H, L, S))."""
    if embed_dim % heads:
        raise ModelImportError(f"{MULTI_HEAD_ATTENTION}: embed_dim {embed_dim} is not a multiple of num_heads {heads}")
    head_dim = embed_dim // heads
    dtype = _dtype_of(query)

    def heads_of(x: Any, index: int, perm: list[int]) -> Any:
        projected = _linear(g, x, _packed_part(g, qkv_weight, index, embed_dim, True),
                            _packed_part(g, qkv_bias, index, embed_dim, False))
        return g.op("Transpose", g.op("Reshape", projected, _ints(g, [0, -1, heads, head_dim])), perm_i=perm)

    q = g.op("Mul", heads_of(query, 0, [0, 2, 1, 3]), _scalar(g, 1.0 / math.sqrt(head_dim), dtype))
    k = heads_of(key, 1, [0, 2, 3, 1])
    v = heads_of(value, 2, [0, 2, 1, 3])
    scores = g.op("MatMul", q, k)
    if mask is not None and not symbolic_helper._is_none(mask):
        if mask_type == 1:
            mask = g.op("Reshape", mask, _ints(g, [0, 1, 1, -1]))
        elif mask_type not in (0, 2):
            raise ModelImportError(f"{MULTI_HEAD_ATTENTION}: unknown mask_type {mask_type} (0, 1 or 2 expected)")
        masked = g.op("Cast", mask, to_i=symbolic_helper.cast_pytorch_to_onnx["Bool"])
        lowest = _scalar(g, torch.finfo(dtype).min, dtype)
        probabilities = g.op("Softmax", g.op("Where", masked, lowest, scores), axis_i=-1)
        probabilities = g.op("Where", masked, _scalar(g, 0.0, dtype), probabilities)
    else:
        probabilities = g.op("Softmax", scores, axis_i=-1)
    context = g.op("Transpose", g.op("MatMul", probabilities, v), perm_i=[0, 2, 1, 3])
    context = g.op("Reshape", context, _ints(g, [0, -1, embed_dim]))
    return _linear(g, context, proj_weight, proj_bias), probabilities


@symbolic_helper.parse_args("v", "i", "i", "v", "v", "v", "v", "b", "b", "f",
                            "v", "v", "v", "v", "v", "v", "v", "v", "v", "v")
def transformer_encoder_layer(g: Any, src: Any, embed_dim: int, num_heads: int, qkv_weight: Any, qkv_bias: Any,
                              proj_weight: Any, proj_bias: Any, use_gelu: bool, norm_first: bool, eps: float,
                              norm1_weight: Any, norm1_bias: Any, norm2_weight: Any, norm2_bias: Any,
                              ffn1_weight: Any, ffn1_bias: Any, ffn2_weight: Any, ffn2_bias: Any,
                              mask: Any = None, mask_type: Any = None) -> Any:
    """``aten::_transformer_encoder_layer_fwd``: one nn.TransformerEncoderLayer (batch first), decomposed."""
    kind = _constant_int(mask_type)

    def self_attention(x: Any) -> Any:
        out, _ = _attention(g, x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                            mask, kind)
        return out

    def feed_forward(x: Any) -> Any:
        hidden = _linear(g, x, ffn1_weight, ffn1_bias)
        hidden = _gelu(g, hidden) if use_gelu else g.op("Relu", hidden)
        return _linear(g, hidden, ffn2_weight, ffn2_bias)

    if norm_first:
        x = g.op("Add", src, self_attention(_layer_norm(g, src, norm1_weight, norm1_bias, eps)))
        return g.op("Add", x, feed_forward(_layer_norm(g, x, norm2_weight, norm2_bias, eps)))
    x = _layer_norm(g, g.op("Add", src, self_attention(src)), norm1_weight, norm1_bias, eps)
    return _layer_norm(g, g.op("Add", x, feed_forward(x)), norm2_weight, norm2_bias, eps)


@symbolic_helper.parse_args("v", "v", "v", "i", "i", "v", "v", "v", "v", "v", "b", "b", "v")
def native_multi_head_attention(g: Any, query: Any, key: Any, value: Any, embed_dim: int, num_heads: int,
                                qkv_weight: Any, qkv_bias: Any, proj_weight: Any, proj_bias: Any, mask: Any = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: Any = None) -> tuple[Any, Any]:
    """``aten::_native_multi_head_attention``: nn.MultiheadAttention's fast path, decomposed.

    The second output is the attention probabilities, averaged over the heads when ``average_attn_weights``
    (unused, and so dropped from the graph, when the model ignores it).
    """
    out, probabilities = _attention(g, query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                    proj_bias, mask, _constant_int(mask_type))
    if average_attn_weights:
        probabilities = _reduce_mean_heads(g, probabilities)
    return out, probabilities


def _reduce_mean_heads(g: Any, x: Any) -> Any:
    if g.opset >= 18:
        return g.op("ReduceMean", x, _ints(g, [1]), keepdims_i=0)
    return g.op("ReduceMean", x, axes_i=[1], keepdims_i=0)


SYMBOLICS = {ENCODER_LAYER: transformer_encoder_layer, MULTI_HEAD_ATTENTION: native_multi_head_attention}


@contextlib.contextmanager
def registered(opset: int) -> Iterator[None]:
    """Register the fast-path symbolics for an export at ``opset``, and remove them afterwards.

    An op for which a symbolic already exists at that opset (the user's own, or a later PyTorch's) is left
    alone. Afterwards the exporter's registry is as it was: an op it had never heard of is dropped from it
    whole (unregistering alone leaves an empty entry, on which a later export fails with "min() arg is an
    empty sequence" instead of naming the op).
    """
    from torch.onnx._internal.torchscript_exporter import registration

    registry = registration.registry
    added: dict[str, bool] = {}  # name -> whether the registry had no entry for it before
    for name, symbolic in SYMBOLICS.items():
        if not registry.is_registered_op(name, opset):
            added[name] = registry.get_function_group(name) is None
            torch.onnx.register_custom_op_symbolic(name, symbolic, _REGISTERED_AT)
    try:
        yield
    finally:
        for name, was_unknown in added.items():
            torch.onnx.unregister_custom_op_symbolic(name, _REGISTERED_AT)
            if was_unknown:
                registry._registry.pop(name, None)
