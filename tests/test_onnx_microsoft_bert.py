"""onnxruntime's transformer operators of ``com.microsoft`` (forge_onnx/converters/microsoft_bert.py) against
onnxruntime: each operator alone over its inputs' forms (causal attention with a past state among them), with
the batch and sequence dynamic, and whole BERT models from ``transformers`` as onnxruntime's transformer
optimizer saves them. (Its GPT-2 fusion no longer matches the graphs transformers 5 exports: nothing fused.)"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

import forge
from forge_core.errors import ForgeError

VI = oh.make_tensor_value_info
OPSETS = [oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]
MS = "com.microsoft"


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "bert_ops", inputs, outputs, initializer=initializers)
    return oh.make_model(graph, opset_imports=OPSETS, ir_version=8)


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    from forge_core.compiler.compile import compile_to_function

    ir = forge.from_onnx(model)
    arrays = [feeds[name] for name in ir.input_names]
    # The inference function, and the compiled path (Forge's schedules, opt_level 3).
    for path, run in (("inference function", ir.get_inference_function()), ("compiled", compile_to_function(ir))):
        got = run(*arrays)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.shape == w.shape, f"{path}, output {index}: {g.shape} != {w.shape}"
            assert g.dtype == w.dtype, f"{path}, output {index}: {g.dtype} != {w.dtype}"
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max()) + 1e-6,
                                       err_msg=f"{path}, output {index}")


HIDDEN, HEADS = 16, 4


def _attention(rng, mask_shape=None, mask_type=TensorProto.INT32, past=False, bias_input=False,
               sizes=None, batch="batch", **attrs):
    """Attention over ``x [batch, seq, 12]``; symbolic batch and sequence; its optional inputs as asked."""
    q, k, v = sizes or (HIDDEN, HIDDEN, HIDDEN)
    inits = [nh.from_array((rng.standard_normal((12, q + k + v)) / np.sqrt(12)).astype(np.float32), "w"),
             nh.from_array((rng.standard_normal(q + k + v) * 0.1).astype(np.float32), "b")]
    names = ["x", "w", "b", "mask" if mask_shape else "", "past" if past else "", "bias" if bias_input else ""]
    while names[-1] == "":
        names.pop()
    inputs = [VI("x", TensorProto.FLOAT, [batch, "seq", 12])]
    if mask_shape:
        inputs.append(VI("mask", mask_type, mask_shape))
    if past:
        inputs.append(VI("past", TensorProto.FLOAT, [2, "batch", HEADS, "past_seq", k // HEADS]))
    if bias_input:
        inputs.append(VI("bias", TensorProto.FLOAT, ["batch", HEADS, "seq", "seq"]))
    outputs = [VI("y", TensorProto.FLOAT, None)] + ([VI("present", TensorProto.FLOAT, None)] if past else [])
    node = oh.make_node("Attention", names, [o.name for o in outputs], domain=MS, num_heads=HEADS,
                        **({"qkv_hidden_sizes": list(sizes)} if sizes else {}), **attrs)
    return _model([node], inputs, outputs, inits)


RNG = np.random.default_rng(0)


def _x(batch, seq):
    return RNG.standard_normal((batch, seq, 12)).astype(np.float32)


def test_attention_without_a_mask_at_two_sequence_lengths():
    model = _attention(RNG)
    _check(model, {"x": _x(2, 7)})
    _check(model, {"x": _x(1, 13)})


def test_attention_with_a_raw_2d_mask_and_right_padding():
    mask = np.ones((3, 9), np.int32)
    mask[0, 6:] = 0
    mask[2, :2] = 0
    _check(_attention(RNG, ["batch", "seq"]), {"x": _x(3, 9), "mask": mask})


def test_attention_with_a_3d_mask_and_causal():
    mask = (RNG.random((2, 6, 6)) > 0.3).astype(np.int32)
    _check(_attention(RNG, ["batch", "seq", "seq"]), {"x": _x(2, 6), "mask": mask})
    _check(_attention(RNG, ["batch", "seq", "seq"], unidirectional=1), {"x": _x(2, 6), "mask": mask})


def test_attention_with_end_positions_and_with_start_and_end_positions():
    _check(_attention(RNG, ["batch"]), {"x": _x(3, 8), "mask": np.array([8, 5, 1], np.int32)})
    model = _attention(RNG, [6], batch=3)  # 2 * batch entries, ends then starts
    _check(model, {"x": _x(3, 8), "mask": np.array([8, 5, 7, 0, 2, 3], np.int32)})


def test_attention_causal_with_past_and_present():
    past = RNG.standard_normal((2, 2, HEADS, 5, HIDDEN // HEADS)).astype(np.float32)
    mask = np.ones((2, 9), np.int32)
    mask[1, :3] = 0
    model = _attention(RNG, ["batch", "total"], past=True, unidirectional=1)
    _check(model, {"x": _x(2, 4), "mask": mask, "past": past})
    _check(_attention(RNG, past=True, unidirectional=1), {"x": _x(2, 1), "past": past})


def test_attention_with_unequal_v_size_a_scale_a_filter_value_and_an_attention_bias():
    bias = RNG.standard_normal((2, HEADS, 5, 5)).astype(np.float32)
    mask = np.ones((2, 5), np.int32)
    mask[0, 3:] = 0
    model = _attention(RNG, ["batch", "seq"], bias_input=True, sizes=(16, 16, 8), scale=0.3,
                       mask_filter_value=-1000.0)
    _check(model, {"x": _x(2, 5), "mask": mask, "bias": bias})


@pytest.mark.parametrize(("attrs", "message"), [({"do_rotary": 1}, "do_rotary"),
                                                ({"past_present_share_buffer": 1}, "past_present_share_buffer")])
def test_attention_refuses_what_it_does_not_compute_by_name(attrs, message):
    with pytest.raises(ForgeError, match=message):
        forge.from_onnx(_attention(RNG, **attrs))


def _embed(rng, segment=True, mask=True, position_ids=False, outputs=2):
    inits = [nh.from_array(rng.standard_normal((30, HIDDEN)).astype(np.float32), "words"),
             nh.from_array(rng.standard_normal((12, HIDDEN)).astype(np.float32), "positions"),
             nh.from_array((rng.random(HIDDEN) + 0.5).astype(np.float32), "gamma"),
             nh.from_array((rng.standard_normal(HIDDEN) * 0.1).astype(np.float32), "beta")]
    if segment:
        inits.append(nh.from_array(rng.standard_normal((2, HIDDEN)).astype(np.float32), "segments"))
    names = ["ids", "segment_ids" if segment else "", "words", "positions", "segments" if segment else "",
             "gamma", "beta", "mask" if mask else "", "position_ids" if position_ids else ""]
    while names[-1] == "":
        names.pop()
    inputs = [VI("ids", TensorProto.INT32, ["batch", "seq"])]
    inputs += [VI("segment_ids", TensorProto.INT32, ["batch", "seq"])] if segment else []
    inputs += [VI("mask", TensorProto.INT32, ["batch", "seq"])] if mask else []
    inputs += [VI("position_ids", TensorProto.INT32, ["batch", "seq"])] if position_ids else []
    outs = [VI("y", TensorProto.FLOAT, None), VI("mask_index", TensorProto.INT32, None),
            VI("embedding_sum", TensorProto.FLOAT, None)][:outputs]
    node = oh.make_node("EmbedLayerNormalization", names, [o.name for o in outs], domain=MS, epsilon=1e-5)
    return _model([node], inputs, outs, inits)


def _ids(batch, seq, rows):
    return RNG.integers(0, rows, (batch, seq)).astype(np.int32)


@pytest.mark.parametrize(("segment", "mask", "position_ids", "outputs"), [
    (True, True, False, 2), (False, False, False, 2), (True, False, True, 3), (False, True, True, 3)])
def test_embed_layer_normalization(segment, mask, position_ids, outputs):
    model = _embed(RNG, segment, mask, position_ids, outputs)
    for batch, seq in ((2, 7), (3, 12)):
        feeds = {"ids": _ids(batch, seq, 30)}
        if segment:
            feeds["segment_ids"] = _ids(batch, seq, 2)
        if mask:
            feeds["mask"] = (np.arange(seq)[None, :] < RNG.integers(1, seq + 1, (batch, 1))).astype(np.int32)
        if position_ids:
            feeds["position_ids"] = _ids(batch, seq, 12)
        _check(model, feeds)


def test_embed_layer_normalization_stops_on_an_id_out_of_range():
    function = forge.from_onnx(_embed(RNG, segment=False, mask=False)).get_inference_function()
    with pytest.raises(ForgeError, match="input id must lie in \\[0, 30\\)"):
        function(np.array([[1, 2, 30]], np.int32))
    with pytest.raises(ForgeError, match="longer than its position embedding's 12 rows"):
        function(_ids(1, 13, 30))


@pytest.mark.parametrize(("beta", "bias", "outputs"), [(True, True, 1), (False, False, 1), (True, True, 4),
                                                       (False, True, 4), (True, False, 4)])
def test_skip_layer_normalization_and_its_optional_outputs(beta, bias, outputs):
    inits = [nh.from_array((RNG.random(HIDDEN) + 0.5).astype(np.float32), "gamma")]
    inits += [nh.from_array((RNG.standard_normal(HIDDEN) * 0.1).astype(np.float32), "beta")] if beta else []
    inits += [nh.from_array((RNG.standard_normal(HIDDEN) * 0.1).astype(np.float32), "bias")] if bias else []
    names = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    while names[-1] == "":
        names.pop()
    outs = [VI(name, TensorProto.FLOAT, None) for name in ("y", "mean", "inv_std_var", "sum")][:outputs]
    node = oh.make_node("SkipLayerNormalization", names, [o.name for o in outs], domain=MS, epsilon=1e-5)
    model = _model([node], [VI("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
                            VI("skip", TensorProto.FLOAT, ["batch", "seq", HIDDEN])], outs, inits)
    x = RNG.standard_normal((2, 5, HIDDEN)).astype(np.float32) * 2 + 1
    _check(model, {"x": x, "skip": RNG.standard_normal((2, 5, HIDDEN)).astype(np.float32)})


# ----------------------------------------------------------------------------------------------------------
# Whole models, as onnxruntime's transformer optimizer saves them
# ----------------------------------------------------------------------------------------------------------


def _optimized(tmp_path, model: torch.nn.Module, example: tuple, names: list[str], outputs: list[str],
               model_type: str, heads: int, hidden: int) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model

    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, str(path), input_names=names, output_names=outputs, opset_version=17,
                          dynamo=False, dynamic_axes={name: {0: "batch", 1: "sequence"} for name in names})
        optimized = optimize_model(str(path), model_type=model_type, num_heads=heads, hidden_size=hidden)
    optimized.save_model_to_file(str(tmp_path / "optimized.onnx"))
    return onnx.load(tmp_path / "optimized.onnx")


class _Bert(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
def test_bert_as_the_transformer_optimizer_saves_it(tmp_path, activation):
    """EmbedLayerNormalization, Attention on its mask_index, SkipLayerNormalization, and BiasGelu (gelu) or
    FastGelu (gelu_new, the tanh form), at a batch and sequence other than the export's."""
    from transformers import BertConfig, BertModel

    from hf_models import randomize

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vocab_size=100, max_position_embeddings=64, hidden_act=activation)
    config._attn_implementation = "eager"  # the pattern the optimizer fuses into Attention
    model = _Bert(randomize(BertModel(config), 0)).eval()
    example = (torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64),
               torch.zeros(2, 16, dtype=torch.int64))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    optimized = _optimized(tmp_path, model, example, names, ["hidden", "pooled"], "bert", 4, 64)
    fused = Counter((n.domain, n.op_type) for n in optimized.graph.node)
    gelu = "BiasGelu" if activation == "gelu" else "FastGelu"
    for op in ("Attention", "EmbedLayerNormalization", "SkipLayerNormalization", gelu):
        assert fused[(MS, op)] >= 1, fused
    feeds = {"input_ids": RNG.integers(0, 100, (3, 11)), "attention_mask": np.ones((3, 11), np.int64),
             "token_type_ids": RNG.integers(0, 2, (3, 11))}
    feeds["attention_mask"][1, 7:] = 0
    _check(optimized, feeds, rtol=1e-4)
