"""``set_float16`` keeps values past float16's range in float32 (``forge_core.compiler.float16_range``).

A ResNet-50 with random weights whose logits reach 1.3e5 returned NaN on a GPU
with ``set_float16``, and nothing said so. Checked here on the CPU, whose
float16 storage rounds and overflows as a GPU's does, against onnxruntime in
float32: a model whose second convolution's outputs pass 65504 before a scale
brings them back.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper

import forge
from forge_core.compiler import float16_range


def growing_model(scale: float) -> bytes:
    """Conv -> Relu -> Conv (weights times ``scale``: outputs near 1e5 for scale 40) -> Mul 1e-3 -> Relu ->
    GlobalAveragePool -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype("float32") * scale
    w2 = rng.standard_normal((8, 8, 3, 3)).astype("float32") * scale
    fc = rng.standard_normal((5, 8)).astype("float32") * 0.01
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(np.array(1e-3, "float32"), "shrink"), numpy_helper.from_array(fc, "fc")]
    nodes = [
        oh.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        oh.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        oh.make_node("Mul", ["c2", "shrink"], ["m"], name="shrink_mul"),
        oh.make_node("Relu", ["m"], ["r2"], name="relu2"),
        oh.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flatten"),
        oh.make_node("Gemm", ["f", "fc"], ["g"], name="fc", transB=1),
        oh.make_node("Softmax", ["g"], ["y"], name="softmax"),
    ]
    graph = oh.make_graph(nodes, "growing", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def reference(data: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


X = np.random.default_rng(11).standard_normal((1, 3, 12, 12)).astype("float32")


def run_float16(data: bytes, path) -> np.ndarray:
    forge.from_onnx(data).compile(output_path=path, set_float16=True)
    return forge.Runtime(path).infer(X)[0]


def test_values_past_float16_stay_in_float32_and_are_named(tmp_path, caplog):
    data = growing_model(scale=40.0)
    ranges = float16_range.measure(forge.from_onnx(data).mod)
    assert max(ranges.values()) > float16_range.FLOAT16_MAX  # the fixture does leave float16's range
    with caplog.at_level(logging.WARNING, logger="forge.compile"):
        got = run_float16(data, tmp_path / "a")
    want = reference(data, X)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3)
    messages = [r.getMessage() for r in caplog.records if "stay in float32" in r.getMessage()]
    assert len(messages) == 1 and "conv2" in messages[0], messages


def test_without_the_check_the_same_model_gives_nan(tmp_path, monkeypatch):
    """What the check prevents: with its limit out of reach, the conversion stores conv2 in float16."""
    monkeypatch.setattr(float16_range, "LIMIT", float("inf"))
    got = run_float16(growing_model(scale=40.0), tmp_path / "a")
    assert not np.isfinite(got).all()


def test_a_model_within_range_converts_whole_and_says_nothing(tmp_path, caplog):
    data = growing_model(scale=0.5)
    with caplog.at_level(logging.WARNING, logger="forge.compile"):
        got = run_float16(data, tmp_path / "a")
    np.testing.assert_allclose(got, reference(data, X), rtol=2e-2, atol=2e-3)
    assert not [r for r in caplog.records if "float16" in r.getMessage()]
    ir = forge.from_onnx(data)
    ir.apply_pass("set_float16")  # the pass alone: the weights held outside the IR are bound for the check
    assert "float16" in ir.mod.script()


def test_the_pass_alone_keeps_the_range_with_the_weights_held_outside(caplog):
    ir = forge.from_onnx(growing_model(scale=40.0))
    with caplog.at_level(logging.WARNING, logger="forge.compile"):
        ir.apply_pass("set_float16")
    assert any("stay in float32" in r.getMessage() and "conv2" in r.getMessage() for r in caplog.records)


def test_a_check_that_cannot_run_is_said(tmp_path, caplog, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no CPU build for this model")

    monkeypatch.setattr(float16_range, "measure", refuse)
    with caplog.at_level(logging.WARNING, logger="forge.compile"):
        forge.from_onnx(growing_model(scale=0.5)).compile(output_path=tmp_path / "a", set_float16=True)
    assert any("were not checked" in r.getMessage() and "no CPU build" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("opt_level", [1, 3])
def test_every_opt_level_keeps_the_range(tmp_path, opt_level):
    data = growing_model(scale=40.0)
    forge.from_onnx(data).compile(output_path=tmp_path / "a", set_float16=True, opt_level=opt_level)
    np.testing.assert_allclose(forge.Runtime(tmp_path / "a").infer(X)[0], reference(data, X), rtol=2e-2, atol=2e-3)


def sequence_sum_model() -> bytes:
    """x [1, n, 8] (n dynamic) -> x*x -> MatMul by 100s -> ReduceSum over n -> MatMul by the identity: the last
    product grows with n, about 1e3 at n = 1 and 2.5e4 at n = 32 (past the check's limit of 16376)."""
    inits = [numpy_helper.from_array(np.full((8, 8), 100.0, "float32"), "w"),
             numpy_helper.from_array(np.eye(8, dtype="float32"), "eye"),
             numpy_helper.from_array(np.array([1], "int64"), "axes")]
    nodes = [
        oh.make_node("Mul", ["x", "x"], ["sq"], name="square"),
        oh.make_node("MatMul", ["sq", "w"], ["h"], name="dense"),
        oh.make_node("ReduceSum", ["h", "axes"], ["s"], name="over_sequence", keepdims=1),
        oh.make_node("MatMul", ["s", "eye"], ["y"], name="head"),
    ]
    graph = oh.make_graph(nodes, "sequence_sum", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 8])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8])], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def test_dynamic_dims_are_checked_at_a_length_where_values_grow(tmp_path, caplog):
    from forge_core.ir import weights

    data = sequence_sum_model()
    ir = forge.from_onnx(data)
    assert ir.input_shapes == [(1, -1, 8)]
    ranges = float16_range.measure(weights.bind_params(ir.mod, ir.params))
    assert max(ranges.values()) > float16_range.LIMIT, ranges  # at n = 1 alone it stayed near 1e3
    with caplog.at_level(logging.INFO, logger="forge.compile"):
        ir.compile(output_path=str(tmp_path / "f16"), set_float16=True)
    # the model's output binding (the head's product, 2.6e4 at n = 32) is kept: named gv once it is the output
    assert any("1 operator stay in float32" in r.getMessage() for r in caplog.records), caplog.records
    x = np.abs(np.random.default_rng(3).standard_normal((1, 32, 8))).astype("float32")
    got = forge.Runtime(str(tmp_path / "f16")).infer(x)[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-2)


def clip_and_triu_model() -> bytes:
    """HardSwish, HardSigmoid and a Clip with bounds as inputs (MobileNetV3's and DBNet's activations, which
    import as ``clip``), and a Trilu with its diagonal as an input: operators with plain value arguments, which
    TVM's mixed-precision conversion could not type (``set_float16`` stopped: "Expected TensorType")."""
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.5
    w2 = rng.standard_normal((8, 8, 1, 1)).astype("float32") * 0.4
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(np.array(-1.5, "float32"), "low"),
             numpy_helper.from_array(np.array(2.5, "float32"), "high"),
             numpy_helper.from_array(np.array(1, "int64"), "k"),
             numpy_helper.from_array(np.array([8, 100], "int64"), "flat")]
    nodes = [
        oh.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("HardSwish", ["c1"], ["h1"], name="hardswish"),
        oh.make_node("Conv", ["h1", "w2"], ["c2"], name="conv2"),
        oh.make_node("Clip", ["c2", "low", "high"], ["k2"], name="clip"),
        oh.make_node("HardSigmoid", ["k2"], ["s2"], name="hardsigmoid", alpha=0.2, beta=0.5),
        oh.make_node("Reshape", ["s2", "flat"], ["r"], name="flatten"),
        oh.make_node("Transpose", ["r"], ["rt"], name="transpose", perm=[1, 0]),
        oh.make_node("MatMul", ["r", "rt"], ["g"], name="gram"),
        oh.make_node("Trilu", ["g", "k"], ["y"], name="upper", upper=1),
    ]
    graph = oh.make_graph(nodes, "activations", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


@pytest.mark.parametrize("opt_level", [0, 1, 3])
def test_clip_and_trilu_convert_to_float16_with_onnxruntimes_numbers(tmp_path, opt_level):
    data = clip_and_triu_model()
    want = reference(data, X10)
    ir = forge.from_onnx(data)
    ir.compile(output_path=tmp_path / "fp16", set_float16=True, opt_level=opt_level)
    got = forge.Runtime(tmp_path / "fp16").infer(X10)[0]
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    assert np.count_nonzero(np.tril(want, 0)) == 0 and np.count_nonzero(np.triu(want, 1)) > 20  # a real mask
    ir.apply_pass("set_float16")
    converted = ir.mod.script()
    assert "float16" in converted and "R.clip" not in converted  # the clips stay in float16, as min and max


def test_clip_and_trilu_in_float16_build_for_cuda(tmp_path, monkeypatch):
    from cuda_checks import check_cuda_library, cuda_compiles

    cuda_compiles(monkeypatch)
    forge.from_onnx(clip_and_triu_model()).compile(target="cuda -arch=sm_90", output_path=tmp_path / "cuda",
                                                   set_float16=True)
    assert check_cuda_library(tmp_path / "cuda" / "model_library.so", "sm_90")


X10 = np.random.default_rng(12).standard_normal((1, 3, 10, 10)).astype("float32")
