"""ONNX ``If`` as exporters write it (forge_onnx/loader.py: ``_expanded``, ``_failing_branch``), against
onnxruntime: a condition on shapes, known at import once the shapes are given, selects its branch there (the
two branches of Silero VAD's decoder differ in rank); a branch that cannot run with the given shapes (Silero's
other sample rate) raises when the model takes it, and the model runs through the other."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import forge


def _squeeze_if_one() -> onnx.ModelProto:
    """Silero VAD's decoder pattern, as its TorchScript export writes it: a convolution over the audio, then
    ``if x.shape[-1] == 1: x = x.squeeze(-1)`` (``Shape -> Gather -> Equal -> If``), whose branches differ in
    rank, then an ``Unsqueeze`` (which needs the rank) and a reduction."""
    f = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    then_branch = oh.make_graph([oh.make_node("Squeeze", ["act", "last"], ["squeezed"], name="squeeze")], "one_frame",
                                [], [oh.make_tensor_value_info("squeezed", f, ["b", 8])])
    else_branch = oh.make_graph([oh.make_node("Identity", ["act"], ["kept"], name="keep")], "frames", [],
                                [oh.make_tensor_value_info("kept", f, ["b", 8, "frames"])])
    nodes = [
        oh.make_node("Unsqueeze", ["audio", "one_axis"], ["wave"], name="as_channel"),
        oh.make_node("Conv", ["wave", "w", "bias"], ["conv"], name="conv", strides=[32]),
        oh.make_node("Relu", ["conv"], ["act"], name="relu"),
        oh.make_node("Shape", ["act"], ["shape"], name="shape"),
        oh.make_node("Gather", ["shape", "last"], ["length"], name="length", axis=0),
        oh.make_node("Equal", ["length", "one"], ["single"], name="single"),
        oh.make_node("If", ["single"], ["decoded"], name="squeeze_if_one", then_branch=then_branch,
                     else_branch=else_branch),
        oh.make_node("Unsqueeze", ["decoded", "one_axis"], ["expanded"], name="expand"),
        oh.make_node("Tanh", ["expanded"], ["y"], name="tanh"),
    ]
    inits = [oh.make_tensor("w", f, [8, 1, 64], rng.standard_normal(512).astype(np.float32) * 0.2),
             oh.make_tensor("bias", f, [8], rng.standard_normal(8).astype(np.float32) * 0.1),
             oh.make_tensor("one_axis", TensorProto.INT64, [1], [1]), oh.make_tensor("last", TensorProto.INT64, [1], [-1]),
             oh.make_tensor("one", TensorProto.INT64, [1], [1])]
    graph = oh.make_graph(nodes, "squeeze_if_one", [oh.make_tensor_value_info("audio", f, ["b", "samples"])],
                          [oh.make_tensor_value_info("y", f, None)], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    return model


@pytest.mark.parametrize("samples", [64, 160])
def test_an_if_on_a_shape_takes_its_branch_at_import_when_the_shapes_are_given(samples):
    proto = _squeeze_if_one()
    audio = np.random.default_rng(samples).standard_normal((2, samples)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                 {"audio": audio})
    ir = forge.from_onnx(proto, shape={"audio": audio.shape})
    np.testing.assert_allclose(ir.get_inference_function()(audio), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_compiled(ir)(audio), want[0], rtol=1e-5, atol=1e-6)


def _compiled(ir):
    from forge_core.compiler.compile import compile_to_function

    return compile_to_function(ir)


def _two_rates(framing_first: bool = False) -> onnx.ModelProto:
    """A model whose If on an input (a sample rate) picks one of two branches; the 8 kHz branch reshapes its
    input to 3 frames of 100, which only 300 samples can be. It is the else branch, or with ``framing_first``
    the then branch (TVM's importer converts the then branch first)."""
    f = TensorProto.FLOAT
    then_branch = oh.make_graph([oh.make_node("Mul", ["x", "two"], ["then_out"], name="then_mul")], "rate_16k", [],
                                [oh.make_tensor_value_info("then_out", f, [1, "n"])])
    else_branch = oh.make_graph([
        oh.make_node("Reshape", ["x", "frames"], ["framed"], name="else_reshape"),
        oh.make_node("ReduceMean", ["framed"], ["means"], name="else_mean", axes=[2], keepdims=0),
        oh.make_node("Tile", ["means", "repeats"], ["else_out"], name="else_tile"),
    ], "rate_8k", [], [oh.make_tensor_value_info("else_out", f, [1, "n"])])
    if framing_first:
        then_branch, else_branch = else_branch, then_branch
    nodes = [oh.make_node("Equal", ["rate", "sixteen"], ["is_16k_raw"], name="is_16k"),
             oh.make_node("Not" if framing_first else "Identity", ["is_16k_raw"], ["is_16k"], name="is_16k_not"),
             oh.make_node("If", ["is_16k"], ["y"], name="rate_branch", then_branch=then_branch,
                          else_branch=else_branch)]
    graph = oh.make_graph(nodes, "rates", [oh.make_tensor_value_info("x", f, [1, "samples"]),
                                           oh.make_tensor_value_info("rate", TensorProto.INT64, [])],
                          [oh.make_tensor_value_info("y", f, [1, "n"])],
                          [oh.make_tensor("two", f, [], [2.0]), oh.make_tensor("sixteen", TensorProto.INT64, [], [16000]),
                           oh.make_tensor("frames", TensorProto.INT64, [3], [1, 3, 100]),
                           oh.make_tensor("repeats", TensorProto.INT64, [2], [1, 100])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("framing_first", [False, True], ids=["else_fails", "then_fails"])
def test_a_branch_that_cannot_run_with_the_given_shapes_raises_when_taken(caplog, framing_first):
    proto = _two_rates(framing_first)
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x, "rate": np.array(16000, np.int64)})[0]
    with caplog.at_level("WARNING", logger="forge.onnx"):
        ir = forge.from_onnx(proto, shape={"x": (1, 512)})
    assert any("rate_branch" in r.getMessage() and "cannot run with these input shapes" in r.getMessage()
               for r in caplog.records)
    function = ir.get_inference_function()
    np.testing.assert_allclose(function(x, np.array(16000, np.int64)), want, rtol=1e-6)
    with pytest.raises(Exception):  # onnxruntime: the Reshape of 512 samples into 3 x 100 fails
        session.run(None, {"x": x, "rate": np.array(8000, np.int64)})
    with pytest.raises(forge.InputError, match="If 'rate_branch': the model takes its branch 'rate_8k', which cannot"):
        function(x, np.array(8000, np.int64))


@pytest.mark.parametrize("framing_first", [False, True], ids=["framing_else", "framing_then"])
def test_the_same_model_at_a_size_each_branch_can_take_keeps_both(framing_first):
    proto = _two_rates(framing_first)
    x = np.random.default_rng(1).standard_normal((1, 300)).astype(np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    function = forge.from_onnx(proto, shape={"x": (1, 300)}).get_inference_function()
    for rate in (16000, 8000):
        want = session.run(None, {"x": x, "rate": np.array(rate, np.int64)})[0]
        np.testing.assert_allclose(function(x, np.array(rate, np.int64)), want, rtol=1e-6)


def test_shapes_given_that_onnx_strict_inference_cannot_reconcile_warn_and_load(monkeypatch):
    """ONNX's strict shape inference refused onnx-asr's preprocessors once shape= made their dims static ("window
    input must have rank = 1", "Incompatible dimensions for matrix multiplication"), where onnxruntime, which
    sees the dims dynamic at load, runs them. Its strict mode is made to fail so here: with shape= given, Forge
    warns and reads on (non-strict inference still checks the types); without, the error stands (the
    malformed-model corpus holds such models)."""
    f = TensorProto.FLOAT
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"], name="relu")], "m",
                          [oh.make_tensor_value_info("x", f, ["n"])], [oh.make_tensor_value_info("y", f, ["n"])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    real = onnx.shape_inference.infer_shapes

    def strict_fails(proto, *args, strict_mode=False, **kwargs):
        if strict_mode:
            raise onnx.shape_inference.InferenceError("[ShapeInferenceError] (op_type:Relu, node name: relu): "
                                                      "Incompatible dimensions")
        return real(proto, *args, strict_mode=strict_mode, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", strict_fails)
    x = np.random.default_rng(2).standard_normal(8).astype(np.float32)
    with pytest.warns(forge.ModelQuirkWarning, match="with the given shapes, ONNX's strict shape inference disagrees"):
        ir = forge.from_onnx(model, shape={"x": (8,)})
    np.testing.assert_array_equal(ir.get_inference_function()(x), np.maximum(x, 0))
    with pytest.raises(forge.InvalidModelError, match="ONNX type and shape inference rejects the model"):
        forge.from_onnx(model)


def _compare_to_onnxruntime(proto, function, feeds):
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = function(*feeds.values())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("level", [None, 0, 3], ids=["inference", "opt0", "opt3"])
def test_branches_of_different_ranks_with_the_dims_left_dynamic(caplog, level):
    """Silero VAD as it ships (dims dynamic): the condition ``frames == 1`` is known at run time only, and no
    Relax type holds a value of rank 2 or 3. The If is imported for its then branch, with a warning; inputs
    of one frame give onnxruntime's numbers at any batch, and inputs that take the else branch raise
    forge.InputError naming the If, where onnxruntime runs them (a wrong rank downstream is never computed)."""
    from forge_core.compiler.compile import compile_to_function

    proto = _squeeze_if_one()
    with caplog.at_level("WARNING", logger="forge.onnx"):
        ir = forge.from_onnx(proto)
    assert any("'squeeze_if_one': its branches give tensors of different ranks (rank 2 and rank 3)" in r.getMessage()
               for r in caplog.records)
    assert ir.input_shapes == [(-1, -1)]
    function = ir.get_inference_function() if level is None else compile_to_function(ir, opt_level=level)
    rng = np.random.default_rng(3)
    for batch, samples in [(1, 64), (3, 64), (2, 95)]:  # one frame each: (samples - 64) // 32 + 1
        _compare_to_onnxruntime(proto, function, {"audio": rng.standard_normal((batch, samples)).astype(np.float32)})
    audio = rng.standard_normal((2, 160)).astype(np.float32)
    ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"audio": audio})
    with pytest.raises(forge.InputError, match="If 'squeeze_if_one': its branches give tensors of different ranks.*"
                                               "these inputs take its else branch.*shape="):
        function(audio)


def _squeeze_if_one_in_a_branch() -> onnx.ModelProto:
    """The squeeze-if-one If inside the then branch of an If on an input flag, whose else branch averages the
    frames: the inner If's check holds only when the outer branch runs."""
    f = TensorProto.FLOAT
    inner = _squeeze_if_one()
    inner_nodes = [n for n in inner.graph.node if n.name in ("shape", "length", "single", "squeeze_if_one", "expand")]
    then_branch = oh.make_graph(inner_nodes, "frames_of_one", [], [oh.make_tensor_value_info("expanded", f, None)])
    else_branch = oh.make_graph([
        oh.make_node("ReduceMean", ["act"], ["mean"], name="mean", axes=[2], keepdims=1),
        oh.make_node("Transpose", ["mean"], ["averaged"], name="as_row", perm=[0, 2, 1]),
    ], "averaged", [], [oh.make_tensor_value_info("averaged", f, None)])
    nodes = [n for n in inner.graph.node if n.name in ("as_channel", "conv", "relu")] + [
        oh.make_node("If", ["flag"], ["picked"], name="outer", then_branch=then_branch, else_branch=else_branch),
        oh.make_node("Tanh", ["picked"], ["y"], name="tanh"),
    ]
    graph = oh.make_graph(nodes, "nested", [oh.make_tensor_value_info("audio", f, ["b", "samples"]),
                                            oh.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                          [oh.make_tensor_value_info("y", f, None)], list(inner.graph.initializer))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_branches_of_different_ranks_inside_a_branch_are_checked_when_it_runs():
    proto = _squeeze_if_one_in_a_branch()
    function = forge.from_onnx(proto).get_inference_function()
    rng = np.random.default_rng(4)
    one_frame = rng.standard_normal((2, 64)).astype(np.float32)
    frames = rng.standard_normal((3, 160)).astype(np.float32)
    for audio, flag in [(one_frame, True), (one_frame, False), (frames, False)]:
        _compare_to_onnxruntime(proto, function, {"audio": audio, "flag": np.array(flag)})
    with pytest.raises(forge.InputError, match="If 'squeeze_if_one'"):
        function(frames, np.array(True))
