"""Forge's own ONNX converters and rewrites, each checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_factory import IR_VERSION, make_model, onnxruntime_int8_references
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


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_3d_with_position_ids(interleaved):
    """Also guards the Elementwise schedule: inlining its concatenate into the reshape gave wrong values."""
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], num_heads=4,
                            interleaved=interleaved)
    model = helper.make_model(helper.make_graph(
        [node], "rope",
        [vi("x", FLOAT, [2, 3, 32]), vi("cos", FLOAT, [50, 4]), vi("sin", FLOAT, [50, 4]), vi("pos", INT64, [2, 3])],
        [vi("y", FLOAT, [2, 3, 32])]), opset_imports=[helper.make_opsetid("", 23)], ir_version=IR_VERSION)
    angles = RNG.random((50, 4)) * 6
    feeds = {"x": rand(2, 3, 32), "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32),
             "pos": np.array([[0, 5, 7], [49, 2, 3]], np.int64)}
    check(model, feeds)


def _one_node(op, inputs, outputs, opset=22, initializers=(), **attrs):
    node = helper.make_node(op, [n for n, *_ in inputs] + [i.name for i in initializers],
                            [n for n, *_ in outputs], **attrs)
    graph = helper.make_graph([node], op.lower(), [vi(n, e, s) for n, e, s in inputs],
                              [vi(n, e, s) for n, e, s in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


@pytest.mark.parametrize("op", ["Cosh", "Sinh"])
def test_hyperbolic_functions(op):
    model = _one_node(op, [("x", FLOAT, [3, 7])], [("y", FLOAT, [3, 7])])
    check(model, {"x": rand(3, 7)})


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization(p):
    model = _one_node("LpNormalization", [("x", FLOAT, [4, 6])], [("y", FLOAT, [4, 6])], opset=17, p=p, axis=1)
    x = rand(4, 6)
    x[2] = 0  # a zero row stays zero
    check(model, {"x": x})


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cum_prod(exclusive, reverse):
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    model = _one_node("CumProd", [("x", FLOAT, [3, 5])], [("y", FLOAT, [3, 5])], opset=26, initializers=[axis],
                      exclusive=exclusive, reverse=reverse)
    x = rand(3, 5)
    expected = np.flip(x, 1) if reverse else x
    expected = np.cumprod(expected, axis=1)
    if exclusive:
        expected = np.concatenate([np.ones((3, 1), np.float32), expected[:, :-1]], axis=1)
    expected = np.flip(expected, 1) if reverse else expected
    (y,) = backend.prepare(model).run([x])  # onnxruntime lacks CumProd: numpy is the reference here
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_functions(op, periodic):
    size = numpy_helper.from_array(np.array(10, np.int64), "size")
    model = _one_node(op, [], [("y", FLOAT, [10])], opset=17, initializers=[size], periodic=periodic)
    check(model, {})


def test_is_inf_directions():
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0], np.float32)
    for attrs in ({}, {"detect_negative": 0}, {"detect_positive": 0}):
        model = _one_node("IsInf", [("x", FLOAT, [5])], [("y", BOOL, [5])], opset=20, **attrs)
        check(model, {"x": x})


def test_pow_with_mixed_types():
    model = _one_node("Pow", [("x", FLOAT, [4]), ("e", INT64, [4])], [("y", FLOAT, [4])], opset=15)
    check(model, {"x": np.array([1.5, 2, 3, 0.5], np.float32), "e": np.array([2, 3, 0, 4], np.int64)})
    model = _one_node("Pow", [("x", INT64, [3]), ("e", FLOAT, [3])], [("y", INT64, [3])], opset=15)
    check(model, {"x": np.array([2, 3, 4], np.int64), "e": np.array([2.0, 3.0, 0.5], np.float32)})


def test_reverse_sequence():
    model = _one_node("ReverseSequence", [("x", FLOAT, [4, 3]), ("lens", INT64, [3])], [("y", FLOAT, [4, 3])],
                      opset=10, time_axis=0, batch_axis=1)
    check(model, {"x": rand(4, 3), "lens": np.array([4, 2, 1], np.int64)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_rms_normalization(axis):
    model = _one_node("RMSNormalization", [("x", FLOAT, [2, 3, 4]), ("s", FLOAT, [2, 3, 4][axis:] if axis else
                                                                            [2, 3, 4])],
                      [("y", FLOAT, [2, 3, 4])], opset=23, axis=axis, epsilon=1e-5)
    shape = [2, 3, 4][axis:] if axis else [2, 3, 4]
    check(model, {"x": rand(2, 3, 4), "s": rand(*shape)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_layer_normalization_with_mean_and_inverse_std(axis):
    shape = [2, 3, 4][axis:] if axis else [2, 3, 4]
    model = _one_node("LayerNormalization", [("x", FLOAT, [2, 3, 4]), ("s", FLOAT, shape), ("b", FLOAT, shape)],
                      [("y", FLOAT, [2, 3, 4]), ("mean", FLOAT, None), ("inv_std", FLOAT, None)], opset=17,
                      axis=axis)
    for out in model.graph.output[1:]:
        out.type.tensor_type.shape.Clear()
        for d in ([2, 3, 4][:axis % 3] + [1] * (3 - axis % 3)):
            out.type.tensor_type.shape.dim.add().dim_value = d
    check(model, {"x": rand(2, 3, 4), "s": rand(*shape), "b": rand(*shape)})


def test_center_crop_pad():
    shape = numpy_helper.from_array(np.array([5, 2], np.int64), "shape")
    model = _one_node("CenterCropPad", [("x", FLOAT, [3, 4, 6])], [("y", FLOAT, [3, 5, 2])], opset=18,
                      initializers=[shape], axes=[1, 2])
    x = rand(3, 4, 6)
    (y,) = backend.prepare(model).run([x])  # onnxruntime lacks CenterCropPad: numpy is the reference here
    expected = np.zeros((3, 5, 2), np.float32)
    expected[:, 0:4, :] = x[:, :, 2:4]
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_with_axes_and_aspect_ratio_policy(policy):
    sizes = numpy_helper.from_array(np.array([8, 9], np.int64), "sizes")  # common scale 1.5 or 2: whole sizes
    node_inputs = [("x", FLOAT, [1, 2, 4, 6])]
    model = _one_node("Resize", node_inputs, [("y", FLOAT, ["a", "b", "c", "d"])], opset=19,
                      initializers=[sizes], mode="nearest", axes=[2, 3], keep_aspect_ratio_policy=policy)
    model.graph.node[0].input[:] = ["x", "", "", "sizes"]
    check(model, {"x": rand(1, 2, 4, 6)})


@pytest.mark.parametrize("nearest_mode,scales,as_repeat", [
    ("floor", [1, 1, 2, 2], True),  # PyTorch's interpolate(scale_factor=2, mode="nearest")
    ("floor", [1, 1, 3, 2], True),
    ("round_prefer_floor", [1, 1, 2, 1], True),  # ONNX's default rounding: the same pixels at scale 2
    ("round_prefer_floor", [1, 1, 3, 3], False),  # not at 3: TVM's resize
    ("round_prefer_ceil", [1, 1, 2, 2], False),
])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_nearest_upsampling_by_whole_scales_is_a_repeat_with_onnxruntimes_pixels(nearest_mode, scales, as_repeat,
                                                                                  dynamic):
    dims = ["n", 3, "h", "w"] if dynamic else [2, 3, 5, 7]
    model = make_model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode=nearest_mode)],
        [vi("x", FLOAT, dims)], [vi("y", FLOAT, ["a", "b", "c", "d"])],
        [numpy_helper.from_array(np.array(scales, np.float32), "scales")], opset=17)
    ir = forge.from_onnx(model)
    assert ("repeat" in ir.mod["main"].script()) == as_repeat
    run = ir.get_inference_function()
    for shape in ([(2, 3, 5, 7), (1, 3, 4, 9)] if dynamic else [(2, 3, 5, 7)]):
        x = rand(*shape)
        np.testing.assert_array_equal(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def test_resize_with_a_policy_tvm_cannot_express_is_refused():
    sizes = numpy_helper.from_array(np.array([7, 5], np.int64), "sizes")
    model = _one_node("Resize", [("x", FLOAT, [1, 2, 4, 6])], [("y", FLOAT, ["a", "b", "c", "d"])], opset=19,
                      initializers=[sizes], mode="nearest", axes=[2, 3], keep_aspect_ratio_policy="not_larger")
    model.graph.node[0].input[:] = ["x", "", "", "sizes"]
    with pytest.raises(forge.OperatorConversionError, match="cannot express"):
        forge.from_onnx(model)


def _qlinear_matmul(tensors: dict[str, np.ndarray], a: tuple[int, int], b: tuple[int, int]) -> onnx.ModelProto:
    """One QLinearMatMul of uint8 inputs of shapes ``a`` and ``b``, its scales and zero points ``tensors``."""
    inits = [numpy_helper.from_array(v, k) for k, v in tensors.items()]
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"],
                            ["y"])
    graph = helper.make_graph([node], "q", [vi("a", TensorProto.UINT8, list(a)), vi("b", TensorProto.UINT8, list(b))],
                              [vi("y", TensorProto.UINT8, [a[0], b[1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)


def test_qlinear_matmul():
    model = _qlinear_matmul({
        "a_scale": np.array(0.05, np.float32), "a_zp": np.array(120, np.uint8),
        "b_scale": np.array([0.02, 0.03, 0.04], np.float32), "b_zp": np.array([128, 100, 90], np.uint8),
        "y_scale": np.array(0.1, np.float32), "y_zp": np.array(125, np.uint8),
    }, (4, 5), (5, 3))
    check(model, {"a": RNG.integers(0, 255, (4, 5)).astype(np.uint8),
                  "b": RNG.integers(0, 255, (5, 3)).astype(np.uint8)}, rtol=0, atol=0)


def test_qlinear_matmul_with_a_zero_point_per_row_of_a():
    """ONNX allows one scale and zero point per row of ``a`` ([M]); onnxruntime's kernel takes one value only and
    ONNX's reference implementation fails on it, so the reference is the specification's formula in numpy. A
    square ``a`` (M = K): a zero point broadcast along the wrong axis would still have the right shape."""
    t = {
        "a_scale": np.array([0.05, 0.02, 0.04, 0.03], np.float32), "a_zp": np.array([120, 3, 250, 60], np.uint8),
        "b_scale": np.array(0.02, np.float32), "b_zp": np.array(128, np.uint8),
        "y_scale": np.array(0.1, np.float32), "y_zp": np.array(125, np.uint8),
    }
    model = _qlinear_matmul(t, (4, 4), (4, 3))
    feeds = {"a": RNG.integers(0, 255, (4, 4)).astype(np.uint8), "b": RNG.integers(0, 255, (4, 3)).astype(np.uint8)}
    product = (feeds["a"].astype(np.int64) - t["a_zp"].astype(np.int64)[:, None]) @ \
        (feeds["b"].astype(np.int64) - t["b_zp"].astype(np.int64))
    scale = (t["a_scale"][:, None] * t["b_scale"]) / t["y_scale"]
    want = np.clip(np.rint(product.astype(np.float32) * scale) + t["y_zp"], 0, 255).astype(np.uint8)
    got = forge.from_onnx(model).get_inference_function()(*feeds.values())
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a_zp,b_zp", [(np.uint8(131), np.int8(0)), (np.uint8(131), None), (None, None),
                                       (np.uint8(131), np.int8(3)), (np.array([131], np.uint8), None)],
                         ids=["zero_b_zp", "no_b_zp", "no_zero_points", "b_zp_3", "a_zp_one_element"])
def test_matmul_integer_with_an_int8_weight(a_zp, b_zp):
    """onnxruntime's quantize_dynamic form: uint8 activations (a zero point), an int8 constant weight. With the
    weight's zero point 0 Forge writes ``u8 @ i8 - z * colsum(w)`` (the VNNI rule's form); other zero points go
    to TVM's converter. Exact against onnxruntime either way; odd sizes (5 x 36 @ 36 x 40)."""
    weight = RNG.integers(-128, 128, (36, 40)).astype(np.int8)
    inits = [numpy_helper.from_array(weight, "b")]
    names = ["a", "b", "", ""]
    if a_zp is not None:
        inits.append(numpy_helper.from_array(np.asarray(a_zp), "a_zp"))
        names[2] = "a_zp"
    if b_zp is not None:
        inits.append(numpy_helper.from_array(np.asarray(b_zp), "b_zp"))
        names[3] = "b_zp"
    node = helper.make_node("MatMulInteger", names[:4 if b_zp is not None else 3 if a_zp is not None else 2], ["y"])
    graph = helper.make_graph([node], "q", [vi("a", TensorProto.UINT8, [5, 36])], [vi("y", TensorProto.INT32, [5, 40])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)
    a = RNG.integers(0, 256, (5, 36)).astype(np.uint8)
    got = backend.prepare(model).run([a])[0]
    exact = (a.astype(np.int64) - np.int64(np.asarray(a_zp if a_zp is not None else 0).reshape(-1)[0])) @ \
        (weight.astype(np.int64) - np.int64(b_zp if b_zp is not None else 0))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, exact)
    # onnxruntime's kernel saturates without VNNI (vpmaddubsw): its exact computation on this CPU
    for expected in onnxruntime_int8_references(model.SerializeToString(), {"a": a}):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kernel,pads,strides,group,w_zp", [
    (1, [0, 0, 0, 0], [1, 1], 1, None),  # conv(u8, i8) - z * sum(w): the integer rules' form
    (3, [0, 0, 0, 0], [2, 2], 1, 0),  # the same, strided, with a zero weight zero point
    (3, [1, 1, 1, 1], [1, 1], 1, None),  # padded: zeros in the centered domain, in int32
    (3, [1, 0, 2, 1], [2, 1], 12, None),  # depthwise, asymmetric padding
    (1, [0, 0, 0, 0], [1, 1], 1, 3),  # a weight zero point that is not 0: int32 (onnxruntime: per tensor only)
], ids=["pointwise", "strided", "padded", "depthwise", "weight_zero_point"])
def test_conv_integer_with_an_int8_weight(kernel, pads, strides, group, w_zp):
    """onnxruntime's quantize_dynamic writes ConvInteger (TVM has no converter): exact against onnxruntime."""
    channels, out_channels = 12, 12 if group > 1 else 20
    weight = RNG.integers(-128, 128, (out_channels, channels // group, kernel, kernel)).astype(np.int8)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.uint8(131), "x_zp")]
    names = ["x", "w", "x_zp"]
    if w_zp is not None:
        inits.append(numpy_helper.from_array(np.asarray(np.int8(w_zp)), "w_zp"))
        names.append("w_zp")
    height, width = 9, 11
    out_h = (height + pads[0] + pads[2] - kernel) // strides[0] + 1
    out_w = (width + pads[1] + pads[3] - kernel) // strides[1] + 1
    node = helper.make_node("ConvInteger", names, ["y"], pads=pads, strides=strides, group=group,
                            kernel_shape=[kernel, kernel])
    graph = helper.make_graph([node], "q", [vi("x", TensorProto.UINT8, [2, channels, height, width])],
                              [vi("y", TensorProto.INT32, [2, out_channels, out_h, out_w])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)
    check(model, {"x": RNG.integers(0, 256, (2, channels, height, width)).astype(np.uint8)}, rtol=0, atol=0)


def test_conv_integer_names_what_it_does_not_convert():
    node = helper.make_node("ConvInteger", ["x", "w"], ["y"], auto_pad="SAME_UPPER")
    graph = helper.make_graph([node], "q", [vi("x", TensorProto.UINT8, [1, 4, 5, 5])],
                              [vi("y", TensorProto.INT32, [1, 4, 5, 5])],
                              [numpy_helper.from_array(RNG.integers(-9, 9, (4, 4, 3, 3)).astype(np.int8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)
    with pytest.raises(forge.OperatorConversionError, match="ConvInteger.*auto_pad=SAME_UPPER"):
        forge.from_onnx(model)


def _recurrent_model(op, gates, direction, hidden=3, seq=4, batch=2, features=5, **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    tensors = {"W": rand(dirs, gates * hidden, features) * 0.5, "R": rand(dirs, gates * hidden, hidden) * 0.5,
               "B": rand(dirs, 2 * gates * hidden) * 0.1}
    names = ["X", "W", "R", "B", "", "h0"]
    inputs = [vi("X", FLOAT, [seq, batch, features]), vi("h0", FLOAT, [dirs, batch, hidden])]
    feeds = {"X": rand(seq, batch, features), "h0": rand(dirs, batch, hidden)}
    if op == "LSTM":
        names.append("c0")
        inputs.append(vi("c0", FLOAT, [dirs, batch, hidden]))
        feeds["c0"] = rand(dirs, batch, hidden)
    outputs = [vi("Y", FLOAT, [seq, dirs, batch, hidden]), vi("Y_h", FLOAT, [dirs, batch, hidden])]
    if op == "LSTM":
        outputs.append(vi("Y_c", FLOAT, [dirs, batch, hidden]))
    node = helper.make_node(op, names, [o.name for o in outputs], hidden_size=hidden, direction=direction, **attrs)
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tensors.items()]
    model = helper.make_model(helper.make_graph([node], op.lower(), inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 14)], ir_version=IR_VERSION)
    return model, feeds


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op, gates, attrs", [
    ("RNN", 1, {}), ("GRU", 3, {}), ("GRU", 3, {"linear_before_reset": 1}), ("LSTM", 4, {}),
])
def test_recurrent_operators(op, gates, attrs, direction):
    model, feeds = _recurrent_model(op, gates, direction, **attrs)
    check(model, feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bounds", ["both", "min_only", "max_only", "input_bounds", "nan_max"])
@pytest.mark.parametrize("float16", [False, True])
def test_clip_stays_high_level_and_compiles_with_float16(bounds, float16, tmp_path):
    # TVM's converter emitted call_tir at import, which set_float16 (ToMixedPrecision) rejected.
    lo = numpy_helper.from_array(np.array(-0.3, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(np.nan if bounds == "nan_max" else 0.6, np.float32), "hi")
    names, inits, extra = {"both": (["x", "lo", "hi"], [lo, hi], []), "min_only": (["x", "lo"], [lo], []),
                           "max_only": (["x", "", "hi"], [hi], []), "nan_max": (["x", "lo", "hi"], [lo, hi], []),
                           "input_bounds": (["x", "l", "h"], [], ["l", "h"])}[bounds]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["x"]), helper.make_node("Clip", names, ["y"], name="clip")]
    w = numpy_helper.from_array(rand(8, 6), "w")
    model = make_model(nodes, [vi("a", FLOAT, [3, 8])] + [vi(n, FLOAT, []) for n in extra], [vi("y", FLOAT, [3, 6])],
                       [w, *inits])
    feeds = {"a": rand(3, 8), **{n: np.array(v, np.float32) for n, v in zip(extra, (-0.2, 0.4))}}
    (expected,) = ort_run(model, feeds)
    ir = forge.from_onnx(model)
    assert not any(name.startswith(("maximum", "minimum")) for name in (gv.name_hint for gv in ir.mod.functions))
    ir.compile(output_path=tmp_path / "a", set_float16=float16)
    (got,) = forge.Runtime(tmp_path / "a").infer(*feeds.values())
    np.testing.assert_allclose(got, expected, rtol=2e-2 if float16 else 1e-5, atol=2e-2 if float16 else 1e-5)


@pytest.mark.parametrize("op", ["Max", "Min", "Mean"])
def test_variadic_max_min_mean_broadcast_without_stacking(op, tmp_path):
    node = helper.make_node(op, ["a", "b", "c"], ["y"], name="variadic")
    model = make_model([node], [vi("a", FLOAT, [2, 3, 4]), vi("b", FLOAT, [3, 1]), vi("c", FLOAT, [4])],
                       [vi("y", FLOAT, [2, 3, 4])])
    feeds = {"a": rand(2, 3, 4), "b": rand(3, 1), "c": rand(4)}
    check(model, feeds)
    assert "stack" not in forge.from_onnx(model).operators
    # set_channel_layout used to fail on the stack TVM's converter built.
    forge.from_onnx(model).compile(output_path=tmp_path / "a", set_channel_layout="last")
    np.testing.assert_allclose(forge.Runtime(tmp_path / "a").infer(*feeds.values())[0], ort_run(model, feeds)[0],
                               rtol=1e-6)


def test_resize_align_corners_to_one_pixel_is_refused_with_the_reason():
    scales = numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")
    model = _one_node("Resize", [("x", FLOAT, [1, 2, 5, 3])], [("y", FLOAT, [1, 2, 2, 1])], opset=13,
                      initializers=[scales], mode="linear", coordinate_transformation_mode="align_corners")
    model.graph.node[0].input[:] = ["x", "", "scales"]
    with pytest.raises(forge.OperatorConversionError, match="align_corners to size 1 along axis 3"):
        forge.from_onnx(model)


def test_resize_by_a_scale_that_gives_a_fractional_size_is_refused_unless_nearest():
    # 15 x 0.5 = 7.5: onnxruntime maps output x to 2x + 0.5, TVM would use the size ratio 15/7. Nearest-pixel
    # resizing takes onnxruntime's pixels from index tables (see below); linear is refused.
    scales = numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")
    for mode in ("linear", "nearest"):
        model = _one_node("Resize", [("x", FLOAT, [1, 3, 6, 15])], [("y", FLOAT, [1, 3, 3, 7])], opset=13,
                          initializers=[scales], mode=mode, coordinate_transformation_mode="half_pixel")
        model.graph.node[0].input[:] = ["x", "", "scales"]
        if mode == "linear":
            with pytest.raises(forge.OperatorConversionError, match="gives 7.5, not a whole size"):
                forge.from_onnx(model)
        else:
            check(model, {"x": rand(1, 3, 6, 15)}, rtol=0, atol=0)
        model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 14  # 7 exactly: same numbers
        check(model, {"x": rand(1, 3, 6, 14)})


@pytest.mark.parametrize("depth, values, axis", [
    (np.array([5], np.int64), np.array([0.0, 1.0], np.float32), -1),   # Paddle2ONNX: depth as a [1] tensor
    (np.array(4.0, np.float32), np.array([-2.5, 3.0], np.float32), 0),  # ONNX allows any numeric depth
    (np.array(6, np.int64), np.array([1, 7], np.int64), 1),
])
def test_one_hot_takes_every_depth_form_and_keeps_the_values_dtype(depth, values, axis):
    """TVM's converter took an integer scalar depth only, and made float32 values a float64 tensor."""
    indices = np.array([[0, 3, -1], [2, -4, 9]], np.int64)  # negative ones count from the end; 9 is off the end
    model = _one_node("OneHot", [("indices", TensorProto.INT64, [2, 3])],
                      [("y", helper.np_dtype_to_tensor_dtype(values.dtype), ["a", "b", "c"])], opset=11,
                      initializers=[numpy_helper.from_array(depth, "depth"), numpy_helper.from_array(values, "values")],
                      axis=axis)
    check(model, {"indices": indices})


def test_resize_to_sizes_beside_an_empty_scales_tensor():
    """Paddle2ONNX writes empty roi and scales tensors beside the sizes; onnxruntime reads an empty one as absent
    (TVM's converter refused: "Only one of scales and sizes can be provided")."""
    model = _one_node("Resize", [("x", FLOAT, [1, 2, 5, 6])], [("y", FLOAT, [1, 2, 10, 9])], opset=13,
                      initializers=[numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
                                    numpy_helper.from_array(np.zeros(0, np.float32), "scales"),
                                    numpy_helper.from_array(np.array([1, 2, 10, 9], np.int64), "sizes")],
                      mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    check(model, {"x": rand(1, 2, 5, 6)})


def _nearest_resize(h, w, out_h, out_w, coordinates, nearest_mode, by_scales=False):
    if by_scales:
        extra, inputs = [numpy_helper.from_array(np.array([1, 1, out_h / h, out_w / w], np.float32), "scales")], \
            ["x", "", "scales"]
    else:
        extra, inputs = [numpy_helper.from_array(np.array([1, 3, out_h, out_w], np.int64), "sizes")], \
            ["x", "", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], name="resize", mode="nearest",
                            coordinate_transformation_mode=coordinates, nearest_mode=nearest_mode)
    graph = helper.make_graph([node], "nearest", [vi("x", FLOAT, [1, 3, h, w])], [vi("y", FLOAT, [1, 3, out_h, out_w])],
                              extra)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)


@pytest.mark.parametrize("coordinates, nearest_mode, by_scales", [
    ("half_pixel", "round_prefer_floor", False), ("half_pixel", "round_prefer_ceil", False),
    ("half_pixel", "floor", True), ("half_pixel", "ceil", False), ("pytorch_half_pixel", "round_prefer_floor", True),
    ("asymmetric", "floor", False), ("asymmetric", "round_prefer_floor", True),
    ("tf_half_pixel_for_nn", "ceil", False), ("align_corners", "round_prefer_floor", False),
])
def test_nearest_resize_picks_onnxruntimes_pixels_at_every_opt_level(coordinates, nearest_mode, by_scales):
    """4x4 -> 7x9 and 5x7 -> 10x14 and down to 3x5: some source coordinates lie exactly halfway. TVM's kernel
    computed them as (i + 0.5) * (n_in / n_out) - 0.5, which a CPU with FMA fused: 1.9 of error (whole pixels
    swapped) at opt_levels 0-3, the reference right. Forge gathers by index tables computed as onnxruntime does."""
    from forge_core.compiler.compile import compile_to_function

    for h, w, out_h, out_w in [(4, 4, 7, 9), (5, 7, 10, 14), (8, 6, 4, 3)]:
        model = _nearest_resize(h, w, out_h, out_w, coordinates, nearest_mode, by_scales)
        x = rand(1, 3, h, w)
        (want,) = ort_run(model, {"x": x})
        ir = forge.from_onnx(model)
        for run in (ir.get_inference_function(), compile_to_function(ir, opt_level=0), compile_to_function(ir)):
            np.testing.assert_array_equal(run(x), want)


def _resize_to_another_tensors_size(mode, coordinates, nearest_mode="round_prefer_floor"):
    """Resize x to y's height and width, read with Shape at run time (an FPN, as Paddle2ONNX and tf2onnx export
    it with the dims dynamic), then add y."""
    nodes = [helper.make_node("Shape", ["x"], ["x_dims"], name="x_dims"),
             helper.make_node("Shape", ["y"], ["y_dims"], name="y_dims"),
             helper.make_node("Slice", ["x_dims", "zero", "two", "zero"], ["nc"], name="nc"),
             helper.make_node("Slice", ["y_dims", "two", "four", "zero"], ["hw"], name="hw"),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], name="sizes", axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["up"], name="resize", mode=mode,
                              coordinate_transformation_mode=coordinates, nearest_mode=nearest_mode),
             helper.make_node("Add", ["up", "y"], ["out"], name="out")]
    graph = helper.make_graph(nodes, "fpn", [vi("x", FLOAT, [1, 3, "h", "w"]), vi("y", FLOAT, [1, 3, "H", "W"])],
                              [vi("out", FLOAT, [1, 3, "H", "W"])],
                              [numpy_helper.from_array(np.array([v], np.int64), name)
                               for name, v in (("zero", 0), ("two", 2), ("four", 4))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)


@pytest.mark.parametrize("mode, coordinates, nearest_mode", [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "pytorch_half_pixel", "round_prefer_ceil"), ("linear", "half_pixel", "round_prefer_floor"),
    ("cubic", "pytorch_half_pixel", "round_prefer_floor"),
])
def test_resize_to_sizes_computed_at_run_time(mode, coordinates, nearest_mode):
    """TVM's converter took sizes known at import only ("Type DataflowVar for size is currently unsupported")."""
    from forge_core.compiler.compile import compile_to_function

    model = _resize_to_another_tensors_size(mode, coordinates, nearest_mode)
    ir = forge.from_onnx(model)
    runs = [ir.get_inference_function(), compile_to_function(ir)]
    for h, w, out_h, out_w in [(5, 7, 10, 14), (4, 4, 7, 9), (8, 6, 3, 5)]:
        feeds = {"x": rand(1, 3, h, w), "y": rand(1, 3, out_h, out_w)}
        (want,) = ort_run(model, feeds)
        for run in runs:
            np.testing.assert_allclose(run(feeds["x"], feeds["y"]), want, rtol=1e-5, atol=1e-5)


def test_resize_to_computed_sizes_refuses_what_tvm_cannot_build_naming_the_fix():
    with pytest.raises(forge.ForgeError, match=r"resize.*align_corners to sizes computed at run time.*shape="):
        forge.from_onnx(_resize_to_another_tensors_size("linear", "align_corners"))
