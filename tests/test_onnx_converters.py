"""Forge's own ONNX converters and rewrites, each checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_factory import IR_VERSION, make_model
from onnx import TensorProto, helper, numpy_helper

import forge
import forge_onnx.backend as backend
from forge_core.plugin_manager import get_plugin_manager

RNG = np.random.default_rng(0)
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def check(model, feeds, rtol=1e-5, atol=1e-5):
    expected = ort_run(model, feeds)
    got = backend.prepare(model).run([feeds[i.name] for i in model.graph.input
                                      if i.name not in {t.name for t in model.graph.initializer}])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def test_forge_converters_are_registered_through_the_hook():
    converters = get_plugin_manager().converters("onnx")
    for op in ("Celu", "Shape", "Size", "Constant", "Attention", "NegativeLogLikelihoodLoss",
               "SoftmaxCrossEntropyLoss"):
        assert converters[("", op)].plugin == "onnx"


def test_celu():
    model = make_model([helper.make_node("Celu", ["x"], ["y"], alpha=0.5)], [vi("x", FLOAT, [4, 5])],
                       [vi("y", FLOAT, [4, 5])])
    check(model, {"x": RNG.standard_normal((4, 5)).astype(np.float32)})


def test_shape_and_size_become_constants_that_fold():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["s"], ["sf"], to=FLOAT),
        helper.make_node("Cast", ["n"], ["nf"], to=FLOAT),
        helper.make_node("Div", ["sf", "nf"], ["y"]),  # TVM's Shape value cannot feed Div
    ]
    model = make_model(nodes, [vi("x", FLOAT, [2, 3, 4])], [vi("y", FLOAT, [2]), vi("s", INT64, [2])])
    check(model, {"x": np.zeros((2, 3, 4), np.float32)})
    ir = forge.from_onnx(model)
    assert ir.operators == {}  # everything folded to constants


@pytest.mark.parametrize("attribute, value, dtype", [
    ("value_float", 2.5, FLOAT), ("value_floats", [1.0, 2.0], FLOAT), ("value_int", 7, INT64),
    ("value_ints", [3, 4, 5], INT64),
])
def test_constant_value_attributes(attribute, value, dtype):
    nodes = [helper.make_node("Constant", [], ["c"], **{attribute: value}),
             helper.make_node("Add", ["x", "c"], ["y"])]
    shape = [] if not isinstance(value, list) else [len(value)]
    model = make_model(nodes, [vi("x", dtype, shape)], [vi("y", dtype, shape)])
    x = np.ones(shape, dtype=helper.tensor_dtype_to_np_dtype(dtype))
    check(model, {"x": x})


def test_constant_sparse_value():
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0, 6.0], np.float32), "v"),
                                       numpy_helper.from_array(np.array([1, 4], np.int64), "i"), [2, 3])
    nodes = [helper.make_node("Constant", [], ["c"], sparse_value=sparse), helper.make_node("Add", ["x", "c"], ["y"])]
    model = make_model(nodes, [vi("x", FLOAT, [2, 3])], [vi("y", FLOAT, [2, 3])])
    check(model, {"x": np.zeros((2, 3), np.float32)})


def _attention_model(q, k, v, mask=None, past=None, opset=23, **attrs):
    inputs = [vi("q", FLOAT, list(q.shape)), vi("k", FLOAT, list(k.shape)), vi("v", FLOAT, list(v.shape))]
    names = ["q", "k", "v"]
    feeds = {"q": q, "k": k, "v": v}
    if mask is not None or past is not None:
        names.append("mask" if mask is not None else "")
        if mask is not None:
            inputs.append(vi("mask", BOOL if mask.dtype == bool else FLOAT, list(mask.shape)))
            feeds["mask"] = mask
    if past is not None:
        names += ["past_key", "past_value"]
        inputs += [vi("past_key", FLOAT, list(past[0].shape)), vi("past_value", FLOAT, list(past[1].shape))]
        feeds.update(past_key=past[0], past_value=past[1])
    outputs = ["y", "present_key", "present_value"] if past is not None else ["y"]
    node = helper.make_node("Attention", names, outputs, **attrs)
    ranks = [q.ndim] + [4] * (len(outputs) - 1)
    infos = [vi(o, FLOAT, [f"{o}_{d}" for d in range(rank)]) for o, rank in zip(outputs, ranks)]
    model = helper.make_model(helper.make_graph([node], "att", inputs, infos),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    return model, feeds


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_attention_4d_with_bool_mask_and_causal():
    mask = RNG.random((1, 2, 5, 5)) > 0.3
    mask[..., np.arange(5), np.arange(5)] = True  # no fully masked row (onnxruntime gives NaN, ONNX's reference 0)
    model, feeds = _attention_model(rand(1, 2, 5, 8), rand(1, 2, 5, 8), rand(1, 2, 5, 8), mask=mask, is_causal=1)
    check(model, feeds)


def test_attention_3d_grouped_query_with_scale_and_softcap():
    model, feeds = _attention_model(rand(2, 4, 16), rand(2, 6, 8), rand(2, 6, 8), q_num_heads=4, kv_num_heads=2,
                                    scale=0.3, softcap=2.0)
    check(model, feeds)


def test_attention_with_past_cache_and_float_mask():
    past = (rand(1, 2, 3, 4), rand(1, 2, 3, 4))
    model, feeds = _attention_model(rand(1, 2, 2, 4), rand(1, 2, 2, 4), rand(1, 2, 2, 4),
                                    mask=rand(1, 1, 2, 5), past=past, is_causal=1)
    check(model, feeds)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_weight", [False, True])
def test_negative_log_likelihood_loss(reduction, with_weight):
    inputs = [vi("x", FLOAT, [4, 5, 2]), vi("t", INT64, [4, 2])]
    names = ["x", "t"]
    feeds = {"x": rand(4, 5, 2), "t": np.array([[0, 1], [4, 2], [3, 1], [2, 2]], np.int64)}
    if with_weight:
        inputs.append(vi("w", FLOAT, [5]))
        names.append("w")
        feeds["w"] = RNG.random(5).astype(np.float32)
    node = helper.make_node("NegativeLogLikelihoodLoss", names, ["y"], reduction=reduction, ignore_index=2)
    model = make_model([node], inputs, [vi("y", FLOAT, [4, 2] if reduction == "none" else [])], opset=13)
    check(model, feeds)


def test_softmax_cross_entropy_loss_with_log_prob():
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["loss", "log_prob"], reduction="mean")
    model = make_model([node], [vi("x", FLOAT, [3, 4]), vi("t", INT64, [3])],
                       [vi("loss", FLOAT, []), vi("log_prob", FLOAT, [3, 4])], opset=13)
    check(model, {"x": rand(3, 4), "t": np.array([1, 0, 3], np.int64)})


def test_sum_is_rewritten_into_adds():
    node = helper.make_node("Sum", ["a", "b", "c"], ["y"], name="total")
    model = make_model([node], [vi(n, FLOAT, [2, 3]) for n in "abc"], [vi("y", FLOAT, [2, 3])])
    feeds = {n: rand(2, 3) for n in "abc"}
    check(model, feeds)
    assert forge.from_onnx(model).operators == {"add": 2}


def test_backend_binds_value_inputs_and_compiles_per_value():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [vi("x", FLOAT, [2, 6]), vi("shape", INT64, [2])], [vi("y", FLOAT, ["a", "b"])])
    rep = backend.prepare(model)
    x = rand(2, 6)
    for shape in ([3, 4], [4, 3], [3, 4]):
        (y,) = rep.run([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(y, x.reshape(shape))
    assert len(rep._compiled) == 2
