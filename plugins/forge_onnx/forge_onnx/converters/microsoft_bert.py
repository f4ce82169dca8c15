"""The transformer operators of onnxruntime's ``com.microsoft`` domain, as its transformer optimizer
(``onnxruntime.transformers.optimizer.optimize_model``) writes them: ``Attention``,
``EmbedLayerNormalization`` and ``SkipLayerNormalization``.

TVM's converters of these three took static shapes only (a model exported with a dynamic batch or sequence
failed with ``'Var' object has no attribute 'value'``), and two computed wrong numbers without a word:
``SkipLayerNormalization``'s optional outputs (the mean, the inverse standard deviation and the
``input_skip_bias_sum`` the optimizer chains into the next residual) were the scalar 0, and ``Attention``'s
2D mask was added as if it were ``[sequence, total]`` rather than ``[batch, total]``. Each converter here is
the computation of onnxruntime's CPU kernel (``contrib_ops/cpu/bert``), over dynamic dims:

* ``Attention``: ``softmax(scale * Q K^T + mask + attention_bias) V`` from one packed QKV projection
  (``qkv_hidden_sizes`` for unequal V), with a ``past`` state concatenated before the keys and values and the
  ``present`` output, ``unidirectional`` (causal), and every mask format onnxruntime's CPU kernel takes: 1D
  end positions ``[batch]``, end and start positions ``[2 * batch]``, a raw 2D mask ``[batch, total]`` and a
  3D one ``[batch, sequence, total]`` (a 0 adds ``mask_filter_value``, -10000 by default; causal positions
  add it too, or replace it under a 3D mask). Rotary embeddings and a shared past/present buffer are refused
  by name, as is the 4D Megatron mask that onnxruntime's CPU kernel refuses.
* ``EmbedLayerNormalization``: word, position (given ids, or 0..S-1) and segment embeddings summed, then a
  layer norm; ``mask_index`` counts each row's ones; ``embedding_sum`` is the sum before the norm. Ids out
  of their table's range stop the run with an error naming the node (onnxruntime refuses them too).
* ``SkipLayerNormalization``: layer norm of ``input + skip (+ bias)``, ``beta`` optional; its outputs are the
  normed value, the mean and inverse standard deviation (``[..., 1]``), and the sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm_ffi
from tvm import relax, tirx

from forge_core.errors import InvalidModelError, ModelImportError
from forge_core.runtime.signature import RUN_TIME_CHECK
from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import static_or_symbolic_dims

DOMAIN = "com.microsoft"


def _const(value: Any, dtype: str) -> relax.Expr:
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _input(inputs: list[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _dims(x: relax.Expr, rank: int, what: str, node: str, op: str) -> list[Any]:
    dims = static_or_symbolic_dims(x)
    if dims is None or len(dims) != rank:
        raise InvalidModelError(f"{op} {node!r}: {what} must have rank {rank}, given {x.ty}")
    return dims


def _static(dim: Any) -> int | None:
    return int(dim) if isinstance(dim, (int, tirx.IntImm)) else None


# ----------------------------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------------------------


def _heads(bb: relax.BlockBuilder, x: relax.Expr, batch: Any, seq: Any, heads: int, size: int) -> relax.Expr:
    """``[batch, seq, heads * size]`` -> ``[batch, heads, seq, size]``."""
    x = bb.normalize(relax.op.reshape(x, [batch, seq, heads, size]))
    return bb.normalize(relax.op.permute_dims(x, [0, 2, 1, 3]))


def _positions(extent: Any) -> relax.Expr:
    """``[0, 1, ..., extent - 1]`` as int64, ``extent`` static or symbolic."""
    return relax.op.arange(0, extent, 1, "int64")


def _mask_bias(bb: relax.BlockBuilder, mask: relax.Expr, batch: Any, seq: Any, total: Any, filter_value: float,
               node: str) -> tuple[relax.Expr, bool]:
    """The additive bias of onnxruntime's mask formats, broadcastable to ``[batch, heads, seq, total]``; and
    whether it was a 3D mask (under which a causal mask replaces rather than adds)."""
    dims = static_or_symbolic_dims(mask)
    if dims is None:
        raise ModelImportError(f"Attention {node!r}: the mask's rank must be known at import, given {mask.ty}")
    zero, masked = _const(0.0, "float32"), _const(filter_value, "float32")
    if len(dims) in (2, 3):
        bias = relax.op.where(relax.op.greater(mask, _const(0, str(mask.ty.dtype))), zero, masked)
        shape = [batch, 1, 1, total] if len(dims) == 2 else [batch, 1, seq, total]
        return bb.normalize(relax.op.reshape(bias, shape)), len(dims) == 3
    if len(dims) == 1:
        ends = bb.normalize(relax.op.astype(mask, "int64"))
        both = _static(dims[0]) is not None and _static(batch) is not None and _static(dims[0]) == 2 * _static(batch)
        if not both and not (_static(dims[0]) is not None and _static(dims[0]) == _static(batch)) \
                and not tvm_ffi.structural_equal(dims[0], batch):
            raise ModelImportError(
                f"Attention {node!r}: a 1D mask_index must have batch ({batch}) or 2 * batch entries (end, then "
                f"start positions), given {dims[0]}; with a dynamic batch, only the end positions are supported")
        keys = bb.normalize(relax.op.reshape(_positions(total), [1, total]))
        if both:
            starts = bb.normalize(relax.op.strided_slice(ends, [0], [batch], [2 * _static(batch)]))
            ends = bb.normalize(relax.op.strided_slice(ends, [0], [0], [batch]))
        outside = relax.op.greater_equal(keys, relax.op.reshape(ends, [batch, 1]))
        if both:
            outside = relax.op.logical_or(outside, relax.op.less(keys, relax.op.reshape(starts, [batch, 1])))
        bias = relax.op.where(outside, masked, zero)
        return bb.normalize(relax.op.reshape(bias, [batch, 1, 1, total])), False
    raise ModelImportError(
        f"Attention {node!r}: a {len(dims)}D mask is not supported (onnxruntime's CPU kernel takes 1D mask_index "
        "[batch] or [2 * batch], a 2D raw mask [batch, total] or a 3D one [batch, sequence, total]; its 4D "
        "Megatron mask is refused by onnxruntime's CPU kernel as well)")


def attention(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
              context: ConverterContext) -> relax.Expr:
    """com.microsoft Attention (see the module docstring)."""
    node = context.node
    for name in ("do_rotary", "past_present_share_buffer"):
        if int(attrs.get(name, 0)):
            raise ModelImportError(f"Attention {node!r}: {name}=1 is not supported (onnxruntime's optimizer writes "
                                   "it for its own decoding loops); export the model without it")
    if _input(inputs, 6) is not None:
        raise ModelImportError(f"Attention {node!r}: past_sequence_length (a shared past/present buffer) is not "
                               "supported")
    x, weight, bias, mask, past, attention_bias = (_input(inputs, i) for i in range(6))
    batch, seq, hidden_in = _dims(x, 3, "the input", node, "Attention")
    weight_dims = [_static(d) for d in _dims(weight, 2, "the weights", node, "Attention")]
    if None in weight_dims:
        raise ModelImportError(f"Attention {node!r}: the weights' shape must be static, given {weight.ty}")
    heads = int(attrs["num_heads"]) if "num_heads" in attrs else 0
    sizes = [int(s) for s in attrs.get("qkv_hidden_sizes", [])] or [weight_dims[1] // 3] * 3
    if heads <= 0 or len(sizes) != 3 or sizes[0] != sizes[1] or sum(sizes) != weight_dims[1] \
            or any(s % heads for s in sizes):
        raise InvalidModelError(
            f"Attention {node!r}: num_heads {heads} and qkv_hidden_sizes {sizes} do not fit weights of shape "
            f"{weight_dims} (Q and K sizes equal, each a multiple of num_heads, summing to the weights' columns)")
    head_qk, head_v = sizes[0] // heads, sizes[2] // heads
    dtype = str(x.ty.dtype)
    if dtype != "float32":
        raise ModelImportError(f"Attention {node!r}: {dtype} inputs are not supported (float32 only)")
    qkv = relax.op.matmul(x, weight)
    if bias is not None:
        qkv = relax.op.add(qkv, bias)
    qkv = bb.normalize(qkv)
    q, k, v = (bb.normalize(relax.op.strided_slice(qkv, [2], [start], [start + size]))
               for start, size in ((0, sizes[0]), (sizes[0], sizes[1]), (sizes[0] + sizes[1], sizes[2])))
    q, k, v = _heads(bb, q, batch, seq, heads, head_qk), _heads(bb, k, batch, seq, heads, head_qk), \
        _heads(bb, v, batch, seq, heads, head_v)
    past_length: Any = 0
    if past is not None:
        past_dims = _dims(past, 5, "past", node, "Attention")
        past_length = past_dims[3]
        past_k = bb.normalize(relax.op.squeeze(relax.op.strided_slice(past, [0], [0], [1]), [0]))
        past_v = bb.normalize(relax.op.squeeze(relax.op.strided_slice(past, [0], [1], [2]), [0]))
        k = bb.normalize(relax.op.concat([past_k, k], axis=2))
        v = bb.normalize(relax.op.concat([past_v, v], axis=2))
    total = seq + past_length if past is not None else seq
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(head_qk))
    scores = relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])), _const(scale, dtype))
    filter_value = float(attrs.get("mask_filter_value", -10000.0))
    additive, three_d = (None, False) if mask is None else _mask_bias(bb, mask, batch, seq, total, filter_value, node)
    if int(attrs.get("unidirectional", 0)):
        # Query i (after the past) sees keys 0 .. past + i.
        rows = relax.op.reshape(_positions(seq), [seq, 1])
        if past is not None:
            rows = relax.op.add(rows, _past_offset(past_length))
        later = bb.normalize(relax.op.greater(relax.op.reshape(_positions(total), [1, total]), rows))
        causal = relax.op.where(later, _const(filter_value, dtype), _const(0.0, dtype))
        if additive is None:
            additive = causal
        elif three_d:
            additive = relax.op.where(later, _const(filter_value, dtype), additive)
        else:
            additive = relax.op.add(additive, causal)
    if additive is not None:
        scores = relax.op.add(scores, additive)
    if attention_bias is not None:
        scores = relax.op.add(scores, attention_bias)
    probabilities = bb.normalize(relax.op.nn.softmax(bb.normalize(scores), axis=-1))
    out = bb.normalize(relax.op.permute_dims(relax.op.matmul(probabilities, v), [0, 2, 1, 3]))
    out = bb.normalize(relax.op.reshape(out, [batch, seq, sizes[2]]))
    if context.outputs == 1:
        return out
    present = bb.normalize(relax.op.stack([k, v], axis=0)) if head_v == head_qk else None
    if present is None:
        raise ModelImportError(f"Attention {node!r}: a present output needs equal K and V head sizes")
    return relax.Tuple([out, present])


def _past_offset(past_length: Any) -> relax.Expr:
    value = _static(past_length)
    if value is not None:
        return _const(np.full((1, 1), value, "int64"), "int64")
    return relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([past_length])), [1, 1])


# ----------------------------------------------------------------------------------------------------------
# EmbedLayerNormalization and SkipLayerNormalization
# ----------------------------------------------------------------------------------------------------------


def _checked_ids(bb: relax.BlockBuilder, ids: relax.Expr, rows: int, what: str, node: str) -> relax.Expr:
    """``ids`` as int64, with a run-time check that each lies in ``[0, rows)`` (an embedding table's rows)."""
    ids = bb.normalize(relax.op.astype(ids, "int64"))
    outside = relax.op.logical_or(relax.op.less(ids, _const(0, "int64")),
                                  relax.op.greater_equal(ids, _const(rows, "int64")))
    fine = bb.emit(relax.op.equal(relax.op.sum(relax.op.astype(outside, "int64")), _const(0, "int64")))
    bb.emit(relax.op.assert_op(fine, [], f"{RUN_TIME_CHECK}EmbedLayerNormalization {node!r}: every {what} must "
                                         f"lie in [0, {rows}), the rows of its embedding table"))
    return ids


def _layer_norm(x: relax.Expr, gamma: relax.Expr, beta: relax.Expr | None, epsilon: float) -> relax.Expr:
    beta = beta if beta is not None else relax.op.zeros_like(gamma)
    return relax.op.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=epsilon)


def embed_layer_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                              context: ConverterContext) -> relax.Expr:
    """com.microsoft EmbedLayerNormalization (see the module docstring)."""
    node = context.node
    ids, segments, words, positions, segment_table, gamma, beta, mask, position_ids = (
        _input(inputs, i) for i in range(9))
    batch, seq = _dims(ids, 2, "input_ids", node, "EmbedLayerNormalization")
    tables = {"word": words, "position": positions, "segment": segment_table}
    rows = {}
    for name, table in tables.items():
        if table is None:
            continue
        dims = [_static(d) for d in _dims(table, 2, f"the {name} embedding", node, "EmbedLayerNormalization")]
        if dims[0] is None:
            raise ModelImportError(f"EmbedLayerNormalization {node!r}: the {name} embedding's rows must be static")
        rows[name] = dims[0]
    total = relax.op.take(words, _checked_ids(bb, ids, rows["word"], "input id", node), axis=0)
    if position_ids is None:
        fine = bb.emit(relax.op.less_equal(relax.op.shape_to_tensor(relax.ShapeExpr([seq])),
                                           _const([rows["position"]], "int64")))
        bb.emit(relax.op.assert_op(relax.op.squeeze(fine, [0]), [], (
            f"{RUN_TIME_CHECK}EmbedLayerNormalization {node!r}: the sequence is longer than its position "
            f"embedding's {rows['position']} rows")))
        position_rows = relax.op.take(positions, _positions(seq), axis=0)
    else:
        position_rows = relax.op.take(positions, _checked_ids(bb, position_ids, rows["position"], "position id",
                                                              node), axis=0)
    total = relax.op.add(total, position_rows)
    if segments is not None and segment_table is not None:
        total = relax.op.add(total, relax.op.take(segment_table, _checked_ids(bb, segments, rows["segment"],
                                                                              "segment id", node), axis=0))
    total = bb.normalize(total)
    out = bb.normalize(_layer_norm(total, gamma, beta, float(attrs.get("epsilon", 1e-12))))
    if mask is not None:
        ones = relax.op.equal(mask, _const(1, str(mask.ty.dtype)))
        mask_index = relax.op.sum(relax.op.astype(ones, "int32"), axis=[1])
    else:
        mask_index = relax.op.zeros_like(relax.op.sum(relax.op.astype(ids, "int32"), axis=[1]))
    outputs = [out, bb.normalize(mask_index), total]
    return out if context.outputs == 1 else relax.Tuple(outputs[:context.outputs])


def skip_layer_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                             context: ConverterContext) -> relax.Expr:
    """com.microsoft SkipLayerNormalization (see the module docstring)."""
    x, skip, gamma, beta, bias = (_input(inputs, i) for i in range(5))
    total = relax.op.add(x, skip)
    if bias is not None:
        total = relax.op.add(total, bias)
    total = bb.normalize(total)
    epsilon = float(attrs.get("epsilon", 1e-12))
    out = bb.normalize(_layer_norm(total, gamma, beta, epsilon))
    if context.outputs == 1:
        return out
    mean = bb.normalize(relax.op.mean(total, axis=[-1], keepdims=True))
    centred = relax.op.subtract(total, mean)
    variance = relax.op.mean(relax.op.multiply(centred, centred), axis=[-1], keepdims=True)
    inverse = bb.normalize(relax.op.rsqrt(relax.op.add(variance, _const(epsilon, str(total.ty.dtype)))))
    return relax.Tuple([out, mean, inverse, total][:context.outputs])


CONVERTERS = {"Attention": attention, "EmbedLayerNormalization": embed_layer_normalization,
              "SkipLayerNormalization": skip_layer_normalization}
