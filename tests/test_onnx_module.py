"""forge.ONNXModule, the ONNX route to TensorRT: introspection, batch size, QDQ quantization, export, engines.

Every number is checked with onnxruntime on seeded random inputs against the
source model, with random (never all-equal) weights; accuracy on real data
comes from a small CNN trained on scikit-learn's digits (int8 top-1 of the
exported QDQ file within 1 point of fp32).
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid as uuid_lib
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forge
from forge_core.quantization.ranges import activation_range
from forge_tensorrt.onnx_export import ONNXExportError, TensorRTUnavailableError, tensorrt_unavailable_reason
from forge_tensorrt.onnx_module import ONNXModule
from model_factory import IR_VERSION, conv_bn_net, digits_cnn, export_torch, light_model_path, make_model, two_io_net

FP32 = 1e-5
METHODS = ("average", "entropy", "minmax", "percentile", "mse")


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _sqnr_db(reference: np.ndarray, value: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((reference - value) ** 2.0)))


def _normal(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _reshape_net(target_shape, seed: int = 0) -> onnx.ModelProto:
    """Conv -> Reshape to ``target_shape`` (a constant) -> MatMul: the batch spelled out, or not."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"], name="flatten_reshape"),
             helper.make_node("MatMul", ["r", "fw"], ["y"], name="fc")]
    inits = [numpy_helper.from_array(_normal(rng, (4, 3, 3, 3)), "w"),
             numpy_helper.from_array(np.array(target_shape, dtype=np.int64), "shape"),
             numpy_helper.from_array(_normal(rng, (4 * 8 * 8, 5)) * 0.1, "fw")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits, name="reshape_net")


def _mlp(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """MatMul [16, 32] + bias, ReLU, Gemm with transB=0 [32, 10]; and an activation-by-activation MatMul."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="dense1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="dense2"),
             helper.make_node("Transpose", ["r"], ["rt"], name="transpose"),
             helper.make_node("MatMul", ["r", "rt"], ["gram"], name="gram")]
    inits = [numpy_helper.from_array(_normal(rng, (16, 32)) * 0.3, "w1"),
             numpy_helper.from_array(_normal(rng, (32,)) * 0.1, "b1"),
             numpy_helper.from_array(_normal(rng, (32, 10)) * 0.3, "w2"),
             numpy_helper.from_array(_normal(rng, (10,)) * 0.1, "b2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10]),
                       helper.make_tensor_value_info("gram", TensorProto.FLOAT, [4, 4])],
                      inits, name="mlp", opset=opset)


def _samples(shape, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_normal(rng, shape) for _ in range(count)]


@pytest.fixture(scope="module")
def calibrated_net():
    """conv_bn_net (3 Conv, a Gemm with transB=1), calibrated on 16 random samples."""
    module = ONNXModule(conv_bn_net(0))
    module.calibrate(_samples((1, 3, 16, 16), 16, seed=1))
    return module


def _quantized(calibrated: ONNXModule, **options) -> ONNXModule:
    """A quantized copy, per channel unless ``options`` say otherwise (what TensorRT recommends)."""
    module = calibrated.copy()
    module.quantize(**{"per_channel": True, **options})
    return module


# ----------------------------------------------------------------------
# Construction and introspection
# ----------------------------------------------------------------------


def test_introspection_matches_the_onnx_graph_of_a_light_model():
    path = light_model_path("resnet50")
    proto = onnx.load(str(path))
    module = ONNXModule(str(path))
    weights = {init.name for init in proto.graph.initializer}
    graph_inputs = [v for v in proto.graph.input if v.name not in weights]
    assert module.input_count == len(graph_inputs) == 1
    assert module.input_names == [v.name for v in graph_inputs] == ["gpu_0/data_0"]
    assert module.input_shapes == [(1, 3, 224, 224)] and module.input_dtypes == ["float32"]
    assert module.output_names == [v.name for v in proto.graph.output]
    assert module.output_shapes == [(1, 1000)] and module.output_dtypes == ["float32"]
    assert module.operators == dict(Counter(n.op_type for n in proto.graph.node))
    assert module.operators["Conv"] == 53 and module.opset == 9
    assert not module.is_quantized and not module.is_calibrated
    text = module.summary()
    assert "gpu_0/data_0: (1, 3, 224, 224) float32" in text and "Conv" in text and "opset 9" in text
    assert repr(module).startswith("<forge.ONNXModule inputs=[gpu_0/data_0: (1, 3, 224, 224) float32]")


def test_introspection_of_a_two_input_model_with_weights_listed_as_inputs_and_a_dynamic_batch():
    module = ONNXModule(two_io_net())
    assert module.input_names == ["a", "ids"] and module.input_dtypes == ["float32", "int64"]
    assert module.input_shapes == [(4, 16), (4,)]
    assert module.output_count == 2 and module.output_names == ["probs", "act"]
    assert module.output_shapes == [(4, 8), (4, 8)]
    proto = conv_bn_net(0, batch="N")
    proto.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                             for i in proto.graph.initializer)  # IR 3 style: weights listed as inputs too
    module = ONNXModule(proto)
    assert module.input_names == ["x"] and module.input_shapes == [(-1, 3, 16, 16)]
    assert module.output_shapes == [(-1, 10)]


def test_model_is_a_copy_and_the_given_proto_is_not_edited():
    proto = conv_bn_net(0)
    module = ONNXModule(proto)
    module.set_batch_size(2)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    copy = module.model
    copy.graph.node.pop()
    assert module.operators["Gemm"] == 1 and module.input_shapes == [(2, 3, 16, 16)]


def test_constructor_errors_name_the_problem(tmp_path):
    with pytest.raises(forge.ModelImportError, match="does not exist"):
        ONNXModule(tmp_path / "absent.onnx")
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    with pytest.raises(forge.ModelImportError, match="is not an ONNX model"):
        ONNXModule(text)
    broken = conv_bn_net(0)
    broken.graph.node[0].input[0] = "nowhere"
    with pytest.raises(forge.ModelImportError, match="fails onnx.checker.*nowhere"):
        ONNXModule(broken)
    with pytest.raises(TypeError, match="onnx.ModelProto or a path"):
        ONNXModule(42)


# ----------------------------------------------------------------------
# Batch size
# ----------------------------------------------------------------------


@pytest.mark.parametrize("proto", [conv_bn_net(3), conv_bn_net(3, batch="N"), _reshape_net([-1, 256]),
                                   _reshape_net([0, 256])],
                         ids=["conv-net", "conv-net-symbolic", "reshape-minus-1", "reshape-0"])
def test_set_batch_size_equals_stacked_batch_one_runs(proto):
    module = ONNXModule(proto)
    module.set_batch_size(3)
    assert module.input_shapes[0] == (3, *module.input_shapes[0][1:])
    assert all(shape[0] == 3 for shape in module.output_shapes)
    x = _normal(np.random.default_rng(5), (3, *module.input_shapes[0][1:]))
    name = module.input_names[0]
    got = _run(module.model, {name: x})[0]
    single = ONNXModule(proto)
    if single.input_shapes[0][0] == -1:
        single.set_batch_size(1)
    want = np.concatenate([_run(single.model, {name: x[i:i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(got, want, rtol=FP32, atol=FP32)


def test_set_batch_size_refuses_a_reshape_that_spells_out_the_batch_and_names_it():
    for target in ([1, 256], [1, -1]):
        module = ONNXModule(_reshape_net(target))
        with pytest.raises(ValueError, match=r"node 'flatten_reshape' \(Reshape\) keeps the batch size 1"):
            module.set_batch_size(4)
        assert module.input_shapes == [(1, 3, 8, 8)]  # unchanged after the refusal
    with pytest.raises(ValueError, match=r"node 'n173' \(Reshape\)"):
        ONNXModule(light_model_path("resnet50")).set_batch_size(2)
    module = ONNXModule(conv_bn_net(0))
    for bad in (0, -2, 2.5, True, "4"):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            module.set_batch_size(bad)


# ----------------------------------------------------------------------
# Calibration and quantization
# ----------------------------------------------------------------------


def _producer(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if tensor in n.output), None)


def _array(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name))


def _check_qdq(model: onnx.ModelProto, source: onnx.ModelProto, expected_axes: dict[str, int | None]) -> None:
    """Every quantizable node reads Q->DQ (symmetric, zero point 0) and an int8 per-channel weight via DQ."""
    source_weights = {i.name: numpy_helper.to_array(i) for i in source.graph.initializer}
    checked = set()
    for node in model.graph.node:
        name = node.name
        if name not in expected_axes:
            continue
        dq = _producer(model, node.input[0])
        assert dq is not None and dq.op_type == "DequantizeLinear", name
        q = _producer(model, dq.input[0])
        assert q is not None and q.op_type == "QuantizeLinear", name
        assert q.input[1:] == dq.input[1:]
        zero = _array(model, q.input[2])
        assert zero.dtype == np.int8 and zero.shape == () and zero == 0
        assert _array(model, q.input[1]).shape == () and _array(model, q.input[1]) > 0
        wdq = _producer(model, node.input[1])
        assert wdq is not None and wdq.op_type == "DequantizeLinear", name
        weight_int8, scale, zero_w = (_array(model, t) for t in wdq.input)
        assert weight_int8.dtype == np.int8 and zero_w.dtype == np.int8 and not zero_w.any()
        axis = next((a.i for a in wdq.attribute if a.name == "axis"), None)
        assert axis == expected_axes[name], name
        original = source_weights[next(n for n in source.graph.node if n.name == name).input[1]]
        if axis is None:
            assert scale.shape == ()
            np.testing.assert_allclose(scale, np.abs(original).max() / 127, rtol=1e-6)
        else:
            assert scale.shape == (original.shape[axis],)
            absmax = np.moveaxis(np.abs(original), axis, 0).reshape(original.shape[axis], -1).max(axis=1)
            np.testing.assert_allclose(scale, absmax / 127, rtol=1e-6)
            scale = scale.reshape([-1 if d == axis else 1 for d in range(original.ndim)])
        assert np.abs(weight_int8).max() == 127
        assert np.abs(weight_int8 * scale - original).max() <= np.max(scale) / 2 + 1e-7
        checked.add(name)
    assert checked == set(expected_axes)
    assert onnx.checker.check_model(model, full_check=True) is None


def test_quantize_places_qdq_the_way_tensorrt_expects(calibrated_net):
    source = calibrated_net.model
    module = _quantized(calibrated_net, calib_method="minmax")
    assert module.is_quantized and module.is_calibrated and not calibrated_net.is_quantized
    model = module.model
    _check_qdq(model, source, {"conv0": 0, "conv1": 0, "conv2": 0, "fc": 0})  # Gemm transB=1: [N, K], axis 0
    assert not {"w0", "w1", "w2", "fc_w"} & {i.name for i in model.graph.initializer}  # float weights dropped
    # one Q/DQ pair per activation: r0 feeds conv1 and the residual add, only conv1 reads it quantized
    assert module.operators["QuantizeLinear"] == 4 and module.operators["DequantizeLinear"] == 8
    assert next(n for n in model.graph.node if n.name == "residual").input[0] == "r0"
    info = module.quantization_info.to_json()
    for tensor, params in info["activations"].items():
        stats = calibrated_net._calibration.statistics[tensor]
        low, high = activation_range(stats, "minmax")
        assert params["zero_point"] == 0 and params["scale"] == pytest.approx(max(-low, high) / 127, rel=1e-6)
        assert _array(model, f"{tensor}_scale") == np.float32(params["scale"])


def test_quantize_matmul_and_gemm_axes_per_tensor_exclude_and_opset_upgrade():
    for opset in (11, 17):
        source = _mlp(opset=opset)
        module = ONNXModule(source)
        module.calibrate(_samples((4, 16), 8, seed=2))
        module.quantize(per_channel=True, calib_method="percentile", percentile=99.9)
        assert module.opset == max(opset, 13)
        # MatMul weight [K, N]: axis 1; Gemm transB=0 weight [K, N]: axis 1; x @ x^T (two activations) stays float
        _check_qdq(module.model, source, {"dense1": 1, "dense2": 1})
        gram = next(n for n in module.model.graph.node if n.name == "gram")
        assert list(gram.input) == ["r", "rt"]
    module = ONNXModule(conv_bn_net(0))
    module.calibrate(_samples((1, 3, 16, 16), 4, seed=3))
    module.quantize(per_channel=False, exclude=["conv1"])
    _check_qdq(module.model, conv_bn_net(0), {"conv0": None, "conv2": None, "fc": None})
    assert list(next(n for n in module.model.graph.node if n.name == "conv1").input) == ["r0", "w1", "b1"]
    assert module.quantization_info.excluded == ["conv1"]


def test_calibrate_accepts_arrays_tuples_dicts_accumulates_and_names_a_bad_sample():
    module = ONNXModule(two_io_net())
    rng = np.random.default_rng(4)
    ids = np.zeros(4, np.int64)
    module.calibrate([(_normal(rng, (4, 16)), ids), {"a": _normal(rng, (4, 16)), "ids": ids}])
    assert module.is_calibrated and module._calibration.num_samples == 2
    assert set(module._calibration.statistics) == {"a"}  # the MatMul's activation: a graph input
    module.calibrate(iter([[_normal(rng, (4, 16)), ids]]), reset=False)
    assert module._calibration.num_samples == 3 and len(module._calibration.statistics["a"].minima) == 3
    with pytest.raises(forge.InputError, match=r"calibration sample 1: Input 'a' \(#0\): expected shape \(4, 16\), "
                                               r"given \(4, 15\)"):
        module.calibrate([(_normal(rng, (4, 16)), ids), (_normal(rng, (4, 15)), ids)])
    with pytest.raises(forge.InputError,
                       match="calibration sample 0: Input 'a'.*expected dtype float32, given float64"):
        module.calibrate([(np.zeros((4, 16)), ids)])
    with pytest.raises(forge.InputError, match="missing input.*'ids'"):
        module.calibrate([{"a": _normal(rng, (4, 16))}])
    with pytest.raises(ValueError, match="wrap a single array in a list"):
        module.calibrate(_normal(rng, (4, 16)))
    with pytest.raises(ValueError, match="held no samples"):
        module.calibrate([])


def test_quantize_errors_name_the_problem(calibrated_net):
    with pytest.raises(ValueError, match="needs calibration data"):
        ONNXModule(conv_bn_net(0)).quantize()
    module = calibrated_net.copy()
    for options, message in [
        ({"quant_type": "dynamic"}, "TensorRT needs static calibration"),
        ({"activation_dtype": "uint8"}, "activation_dtype must be 'int8'"),
        ({"kernel_dtype": "uint8"}, "kernel_dtype must be 'int8'"),
        ({"bias_dtype": "int32"}, "biases in float"),
        ({"calib_method": "kl"},
         "calib_method must be one of 'average', 'entropy', 'minmax', 'percentile', 'mse'; given 'kl'"),
        ({"quant_type": "fast"}, "quant_type must be one of"),
        ({"percentile": 0}, "percentile must be a number"),
        ({"per_channel": "yes"}, "per_channel must be True or False"),
        ({"exclude": ["conv7"]}, "no node is named 'conv7'; close names: 'conv2', 'conv1', 'conv0'"),
    ]:
        with pytest.raises(ValueError, match=message):
            module.quantize(**options)
    assert not module.is_quantized
    module.quantize(quant_type="static")
    with pytest.raises(ValueError, match="already quantized"):
        module.quantize()
    with pytest.raises(ValueError, match="already quantized"):
        module.calibrate(_samples((1, 3, 16, 16), 1, seed=0))


@pytest.mark.parametrize("method", METHODS)
def test_each_method_exports_qdq_within_the_sqnr_bar_on_fresh_random_inputs(calibrated_net, method, tmp_path):
    module = _quantized(calibrated_net, calib_method=method)
    meta = module.export(tmp_path / "net.onnx")
    assert meta["check"]["sqnr_db"] >= 20 and meta["precision"] == "int8"
    x = _samples((1, 3, 16, 16), 8, seed=99)
    reference, written = conv_bn_net(0), str(tmp_path / "net.onnx")
    want = np.concatenate([_run(reference, {"x": v})[0] for v in x])
    got = np.concatenate([_run(written, {"x": v})[0] for v in x])
    assert _sqnr_db(want, got) >= 20, (method, _sqnr_db(want, got))


@pytest.fixture(scope="module")
def digits():
    """A CNN trained on scikit-learn's digits (seconds), as ONNX, with calibration and test batches."""
    return digits_cnn(128)


def test_digits_int8_qdq_file_keeps_fp32_top1_within_one_point(digits, tmp_path):
    proto, calibration, tests = digits

    def top1(model: onnx.ModelProto | str) -> float:
        hits = sum(int((_run(model, {"image": x})[0].argmax(axis=1) == y).sum()) for x, y in tests)
        return hits / sum(len(y) for _, y in tests)

    fp32 = top1(proto)
    assert fp32 > 0.9, fp32
    module = ONNXModule(proto)
    module.calibrate(calibration)
    results = {}
    for method in ("entropy", "minmax"):
        quantized = _quantized(module, calib_method=method)
        path = tmp_path / f"digits_{method}.onnx"
        quantized.export(path)
        results[method] = top1(str(path))
        ops = Counter(n.op_type for n in onnx.load(str(path)).graph.node)
        assert ops["QuantizeLinear"] == 4 and ops["Conv"] == 2 and ops["Gemm"] == 2
    print(f"digits fp32 {fp32:.4f}, int8 QDQ through onnxruntime: {results}")
    assert all(accuracy >= fp32 - 0.01 for accuracy in results.values()), (results, fp32)


# ----------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------


def test_export_fp32_checks_writes_metadata_and_refuses_to_overwrite(tmp_path):
    module = ONNXModule(conv_bn_net(7))
    module.set_batch_size(2)
    given = "123e4567-e89b-12d3-a456-426614174000"
    path = tmp_path / "out" / "model.onnx"
    meta = module.export(path, uuid=given)
    written = onnx.load(str(path))
    onnx.checker.check_model(written, full_check=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx", "model_metadata.json"]
    on_disk = json.loads((tmp_path / "out" / "model_metadata.json").read_text())
    assert on_disk == meta
    assert meta["uuid"] == given and meta["forge_version"] == forge.__version__
    assert meta["precision"] == "float32" and meta["is_tensorrt"] is True and meta["quantization"] is None
    assert meta["opset"] == 17
    assert meta["inputs"] == [{"name": "x", "shape": [2, 3, 16, 16], "dtype": "float32"}]
    assert meta["outputs"] == [{"name": "y", "shape": [2, 10], "dtype": "float32"}]
    assert meta["model"] == {"file": "model.onnx", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert meta["check"]["max_abs_diff"] <= FP32
    x = _normal(np.random.default_rng(8), (2, 3, 16, 16))
    want = np.concatenate([_run(conv_bn_net(7), {"x": x[i:i + 1]})[0] for i in range(2)])
    np.testing.assert_allclose(_run(str(path), {"x": x})[0], want, rtol=FP32, atol=FP32)
    with pytest.raises(ValueError, match=r"model\.onnx' already exists; pass force_overwrite=True"):
        module.export(path)
    (path.parent / "model.onnx").unlink()
    with pytest.raises(ValueError, match=r"model_metadata\.json' already exists"):
        module.export(path)
    meta = module.export(path, is_tensorrt=False, force_overwrite=True)
    assert str(uuid_lib.UUID(meta["uuid"], version=4)) == meta["uuid"] != given
    assert meta["is_tensorrt"] is False
    assert json.loads((path.parent / "model_metadata.json").read_text())["uuid"] == meta["uuid"]
    old = ONNXModule(_mlp(opset=11))  # is_tensorrt raises the file's opset to 13, not the module's
    assert old.export(tmp_path / "mlp13.onnx")["opset"] == 13 and old.opset == 11
    assert old.export(tmp_path / "mlp11.onnx", is_tensorrt=False)["opset"] == 11
    assert onnx.load(str(tmp_path / "mlp13.onnx")).opset_import[0].version == 13
    with pytest.raises(ValueError, match="uuid must be a UUID"):
        module.export(tmp_path / "other.onnx", uuid="not-a-uuid")
    with pytest.raises(ValueError, match="force_overwrite must be True or False"):
        module.export(tmp_path / "other.onnx", force_overwrite="yes")


def test_export_quantized_metadata_carries_settings_and_every_scale(calibrated_net, tmp_path):
    module = _quantized(calibrated_net, calib_method="entropy")
    path = tmp_path / "int8.onnx"
    meta = module.export(path)
    written = onnx.load(str(path))
    quant = meta["quantization"]
    assert quant["quant_type"] == "static" and quant["scheme"] == "symmetric" and quant["per_channel"] is True
    assert quant["calib_method"] == "entropy" and quant["num_samples"] == 16
    assert set(quant["layers"]) == {"conv0", "conv1", "conv2", "fc"}
    for tensor, params in quant["activations"].items():
        assert float(_array(written, f"{tensor}_scale")) == pytest.approx(params["scale"], rel=1e-7)
    for weight, params in quant["weights"].items():
        np.testing.assert_allclose(_array(written, f"{weight}_scale"), params["scale"], rtol=1e-7)
        assert params["axis"] == 0 and params["zero_point"] == 0
    assert meta["check"]["inputs"] == "calibration samples" and meta["check"]["sqnr_db"] >= 20


def test_a_failed_check_raises_and_writes_nothing(calibrated_net, tmp_path):
    module = _quantized(calibrated_net)
    with pytest.raises(ONNXExportError, match=r"SQNR is [\d.]+ dB, below the 200 dB bar.*exclude"):
        module.export(tmp_path / "m.onnx", min_sqnr_db=200)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(ONNXExportError("x"), forge.CompilationError)
    custom = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("FancyOp", ["r"], ["y"], name="fancy", domain="com.acme")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)], ir_version=IR_VERSION)
    with pytest.raises(ONNXExportError, match="node 'fancy' is com.acme.FancyOp"):
        ONNXModule(custom).export(tmp_path / "custom.onnx")
    integer = make_model(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi")],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])],
        [numpy_helper.from_array(np.arange(12, dtype=np.uint8).reshape(4, 3), "b")])
    with pytest.raises(ONNXExportError, match="node 'mmi' is MatMulInteger; TensorRT reads int8 only as"):
        ONNXModule(integer).export(tmp_path / "integer.onnx")
    assert ONNXModule(integer).is_quantized
    assert list(tmp_path.iterdir()) == []


def test_export_follows_set_batch_size_after_quantization(calibrated_net, tmp_path):
    module = _quantized(calibrated_net)
    module.set_batch_size(3)
    meta = module.export(tmp_path / "b3.onnx")
    assert meta["inputs"][0]["shape"] == [3, 3, 16, 16] and meta["check"]["sqnr_db"] >= 20
    x = _normal(np.random.default_rng(11), (3, 3, 16, 16))
    want = np.concatenate([_run(conv_bn_net(0), {"x": x[i:i + 1]})[0] for i in range(3)])
    assert _sqnr_db(want, _run(str(tmp_path / "b3.onnx"), {"x": x})[0]) >= 20


# ----------------------------------------------------------------------
# The facade and TensorRT
# ----------------------------------------------------------------------


def test_facade_exposes_onnx_module_and_names_the_extra_when_absent(monkeypatch):
    assert forge.ONNXModule is ONNXModule and "ONNXModule" in forge.__all__
    monkeypatch.setitem(sys.modules, "forge_tensorrt.onnx_module", None)  # what an absent plugin looks like
    with pytest.raises(forge.PluginNotInstalledError, match=r"ONNXModule.*pip install 'forge-core\[tensorrt\]'"):
        forge.ONNXModule  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        forge.NoSuchThing  # noqa: B018


def test_onnx_module_follows_plugin_control(fresh_plugins, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "no:tensorrt")  # the plugin switched off: the facade does not reach past it
    with pytest.raises(forge.PluginNotInstalledError, match=r"module 'tensorrt'.*pip install 'forge-core\[tensorrt\]'"):
        forge.ONNXModule  # noqa: B018


def test_build_engine_without_tensorrt_says_why(tmp_path):
    reason = tensorrt_unavailable_reason()
    if reason is None:
        pytest.skip("TensorRT and a CUDA GPU are available: test_build_engine covers them")
    with pytest.raises(TensorRTUnavailableError, match="TensorRT and a CUDA GPU are not available: "):
        ONNXModule.build_engine(tmp_path / "absent.onnx")


def test_build_engine_from_the_exported_qdq_model(calibrated_net, tmp_path):
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        pytest.skip(f"TensorRT and a CUDA GPU are not available: {reason}")
    module = _quantized(calibrated_net)
    module.export(tmp_path / "net.onnx")
    engine = ONNXModule.build_engine(tmp_path / "net.onnx")
    assert engine.endswith("net.engine") and (tmp_path / "net.engine").stat().st_size > 0
