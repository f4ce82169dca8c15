"""calibrate() and quantize(): every parameter and error, accuracy on real data, the report, and compiling.

Accuracy is measured on a real classifier: a small CNN trained in the test on
scikit-learn's digits (int8 top-1 within 1 point of fp32 for every method,
per-tensor and per-channel), and on a real transformer encoder (tiny BERT
from ``transformers``, dynamic quantization, cosine >= 0.99 to fp32).
"""

from __future__ import annotations

import json
import logging

import jsonschema
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import forge
from model_factory import digits_cnn, export_torch
from forge_core.quantization.calibration_data import HISTOGRAM_BINS, TensorStatistics
from forge_core.quantization.ranges import activation_params, activation_range
from forge_core.runtime import metadata as schema

BATCH = 128
METHODS = ("average", "entropy", "minmax", "percentile", "mse")


_export = export_torch


@pytest.fixture(scope="module")
def digits():
    """A CNN trained on scikit-learn's digits (seconds), as ONNX, with calibration and test batches."""
    return digits_cnn(128)


def _top1(function, tests) -> float:
    hits = sum(int((np.asarray(function(x)).argmax(axis=1) == y).sum()) for x, y in tests)
    return hits / sum(len(y) for _, y in tests)


@pytest.fixture(scope="module")
def calibrated(digits):
    proto, calibration, _ = digits
    ir = forge.from_onnx(proto)
    ir.calibrate(calibration)
    return ir


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_digits_int8_top1_stays_within_one_point_of_fp32(digits, calibrated, per_channel):
    proto, calibration, tests = digits
    fp32 = _top1(calibrated.get_inference_function(), tests)
    assert fp32 > 0.9, fp32  # the classifier really learned
    results = {}
    for method in METHODS:
        quantized = calibrated.copy()
        quantized.quantize(per_channel=per_channel, calib_method=method)
        assert quantized.is_quantized and quantized.quantization_info.quant_type == "static"
        results[method] = _top1(quantized.get_inference_function(), tests)
    print(f"digits fp32 {fp32:.4f}, int8 ({'per-channel' if per_channel else 'per-tensor'}): {results}")
    for method, accuracy in results.items():
        assert accuracy >= fp32 - 0.01, (method, accuracy, fp32)


def test_digits_onnxruntime_qdq_model_arrives_quantized_and_matches_onnxruntime(digits, tmp_path):
    """ORT's quantize_static output (QDQ) loads with is_quantized and runs as onnxruntime runs it."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    proto, calibration, tests = digits
    source, target = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(proto, source)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"image": batch} for batch in calibration])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    ir = forge.from_onnx(str(target))
    assert ir.is_quantized and ir.quantization_info is None
    x = tests[0][0]
    expected = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    got = ir.get_inference_function()(x)
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 0.05 * scale
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).mean() >= 0.98
    with pytest.raises(ValueError, match="already quantized"):
        ir.quantize()


@pytest.mark.parametrize("dtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8])
@pytest.mark.parametrize("scale", [0.5, np.inf, [0.5, np.inf]], ids=["finite", "infinite", "per_channel"])
def test_quantize_linear_saturates_as_onnxruntime_nan_included(tmp_path, dtype, scale):
    """QuantizeLinear of +-inf, NaN and values out of range, and with the scale inf (which an attention mask of
    -inf calibrates to: -inf / inf is NaN): saturated as ONNX's reference and onnxruntime do, NaN to the
    lowest value, compiled at opt_level 0 and 3 and in the inference function."""
    from onnx import helper, numpy_helper

    scale = np.asarray(scale, np.float32)
    zero_point = np.full(scale.shape, 3, onnx.helper.tensor_dtype_to_np_dtype(dtype))
    x = np.array([[-np.inf, np.inf, np.nan, -3.4e38, 3.4e38, 0.0, 1.0, -1.0, 70.2, -300.0]] * 2, np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["y"], axis=0)
    graph = helper.make_graph([node], "quantize", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", dtype, x.shape)],
                              [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(zero_point, "zero_point")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ir = forge.from_onnx(model)
    np.testing.assert_array_equal(ir.get_inference_function()(x), expected)
    for opt_level in (0, 3):
        ir.compile(output_path=str(tmp_path / f"q{opt_level}"), opt_level=opt_level)
        np.testing.assert_array_equal(forge.Runtime(str(tmp_path / f"q{opt_level}")).infer(x)[0], expected)



def test_quantize_linear_in_a_loop_body_saturates_as_onnxruntime(tmp_path):
    """The same saturation for a QuantizeLinear inside a Scan's body: in Relax, an If branch of a function the
    loop calls, which the rewrite must reach too (where it did not, NaN came back as the highest value)."""
    from onnx import helper, numpy_helper

    row = np.array([-np.inf, np.inf, np.nan, -3.4e38, 3.4e38, 0.0, 1.0, -1.0, 70.2, -300.0], np.float32)
    x = np.stack([row, row[::-1], row * 0.5])  # scanned along axis 0: three steps
    body = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x_t", "scale", "zero_point"], ["q"], name="quantize")], "body",
        [helper.make_tensor_value_info("x_t", onnx.TensorProto.FLOAT, [10])],
        [helper.make_tensor_value_info("q", onnx.TensorProto.INT8, [10])],
        [numpy_helper.from_array(np.asarray(0.5, np.float32), "scale"),
         numpy_helper.from_array(np.asarray(3, np.int8), "zero_point")])
    scan = helper.make_node("Scan", ["x"], ["y"], name="steps", body=body, num_scan_inputs=1)
    graph = helper.make_graph([scan], "quantize_in_loop",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["steps", 10])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.INT8, ["steps", 10])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ir = forge.from_onnx(model)
    np.testing.assert_array_equal(ir.get_inference_function()(x), expected)
    ir.compile(output_path=str(tmp_path / "q"), opt_level=3)
    np.testing.assert_array_equal(forge.Runtime(str(tmp_path / "q")).infer(x)[0], expected)

def test_transformer_encoder_dynamic_quantization_keeps_cosine(tmp_path):
    from hf_models import ARCHITECTURES

    arch = ARCHITECTURES["bert"]
    model = arch.build(seed=3)
    inputs = arch.inputs(batch=2, length=16, seed=1)
    with torch.no_grad():
        reference = model(*inputs).numpy()
    ir = forge.from_onnx(_export(model, inputs, list(arch.input_names)))
    for per_channel in (False, True):
        quantized = ir.copy()
        quantized.quantize(quant_type="dynamic", per_channel=per_channel)
        info = quantized.quantization_info
        assert info.quant_type == "dynamic" and info.calib_method is None
        assert sum(layer["kind"] == "matmul" for layer in info.layers.values()) >= 8  # q, k, v, o, 2 FFN per layer
        got = quantized.get_inference_function()(*[t.numpy() for t in inputs])
        cosine = float(np.dot(got.ravel(), reference.ravel())
                       / (np.linalg.norm(got) * np.linalg.norm(reference)))
        print(f"bert dynamic int8 (per_channel={per_channel}) cosine {cosine:.5f}")
        assert cosine >= 0.99, cosine
        assert "nn.softmax" in quantized.operators and "quantize" in quantized.operators  # softmax stays float


# ----------------------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    """A conv net with BN, residual add, concat and dense layers; random weights with sane statistics."""
    torch.manual_seed(1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.conv3 = torch.nn.Conv2d(8, 6, 1)
            self.fc = torch.nn.Linear(14 * 36, 5)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv1(x)))
            z = torch.relu(self.conv2(y)) + y
            return self.fc(torch.flatten(torch.cat([z, self.conv3(z)], 1), 1))

    model = Net().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.2, 0.2)
        model.bn.running_var.uniform_(0.5, 1.5)
    proto = _export(model, (torch.randn(2, 3, 6, 6),), ["x"])
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((2, 3, 6, 6)).astype(np.float32) for _ in range(6)]
    return proto, samples


def test_calibrate_records_statistics_accumulates_and_survives_copy(small, caplog):
    proto, samples = small
    ir = forge.from_onnx(proto)
    assert not ir.is_calibrated
    with caplog.at_level(logging.INFO, logger="forge.quantization"):
        ir.calibrate(iter(samples[:3]))  # any iterable, use_cuda=True on a machine without CUDA
    assert ir.is_calibrated
    assert sum("no CUDA device" in r.getMessage() for r in caplog.records) == 1
    data = ir._calibration
    assert data.num_samples == 3
    assert "x" in data.statistics  # the model input feeds conv1
    for stats in data.statistics.values():
        assert len(stats.minima) == 3 and stats.histogram.sum() > 0
    assert data.weights and all(w.minima.shape == w.maxima.shape for w in data.weights.values())
    ir.calibrate(samples[3:], reset=False)
    assert ir._calibration.num_samples == 6
    assert all(len(s.minima) == 6 for s in ir._calibration.statistics.values())
    twin = ir.copy()
    assert twin.is_calibrated and twin._calibration.num_samples == 6
    ir.calibrate(samples[:2])  # reset=True
    assert ir._calibration.num_samples == 2 and twin._calibration.num_samples == 6
    with pytest.raises(ValueError, match="calibration data"):
        twin.split_tensors()
    twin.split_tensors(force=True)
    assert not twin.is_calibrated


def test_calibrate_accepts_tuples_and_dicts_and_names_a_bad_sample(small):
    proto, samples = small
    ir = forge.from_onnx(proto)
    ir.calibrate([(samples[0],), {"x": samples[1]}])
    assert ir._calibration.num_samples == 2
    with pytest.raises(ValueError, match=r"calibration sample 2: Input 'x' \(#0\): expected shape \(2, 3, 6, 6\), "
                                         r"given \(2, 3, 5, 6\)"):
        ir.calibrate([samples[0], samples[1], samples[2][:, :, :5]])
    with pytest.raises(ValueError, match="calibration sample 1: .*expected dtype float32, given float64"):
        ir.calibrate([samples[0], samples[1].astype(np.float64)])
    with pytest.raises(ValueError, match="calibration sample 0: unknown input name.*'y'"):
        ir.calibrate([{"y": samples[0]}])
    with pytest.raises(ValueError, match="no samples"):
        ir.calibrate([])
    with pytest.raises(ValueError, match="iterable of samples"):
        ir.calibrate(samples[0])
    assert ir._calibration.num_samples == 2  # a failed calibration leaves the previous data


def test_quantize_errors_name_the_problem(small):
    proto, samples = small
    ir = forge.from_onnx(proto)
    with pytest.raises(ValueError, match="quant_type='static' needs calibration"):
        ir.quantize(quant_type="static")
    for kwargs, match in [({"activation_dtype": "int4"}, "activation_dtype must be one of 'int8', 'uint8'; given 'int4'"),
                          ({"kernel_dtype": "float16"}, "kernel_dtype must be one of"),
                          ({"bias_dtype": "int16"}, "bias_dtype must be one of 'int8', 'uint8', 'int32'"),
                          ({"calib_method": "kl"}, "calib_method must be one of"),
                          ({"quant_type": "qat"}, "quant_type must be one of"),
                          ({"exclude": ["/conv9/Conv"]}, r"exclude names nodes that main does not have: '/conv9/Conv' "
                                                         r"\(did you mean"),
                          ({"percentile": 120}, "percentile must be in")]:
        with pytest.raises(ValueError, match=match):
            ir.quantize(**kwargs)
    assert not ir.is_quantized  # nothing changed


def test_quantize_parameters_shape_the_qdq_ir(small):
    proto, samples = small
    ir = forge.from_onnx(proto)
    dynamic = ir.copy()
    dynamic.quantize()  # "any" without calibration: dynamic
    assert dynamic.quantization_info.quant_type == "dynamic"
    assert not any(layer["kind"] in ("add", "concat") for layer in dynamic.quantization_info.layers.values())
    ir.calibrate(samples)
    static = ir.copy()
    static.quantize()  # "any" with calibration: static
    info = static.quantization_info
    assert (info.quant_type, info.activation_dtype, info.kernel_dtype, info.bias_dtype, info.calib_method) == \
        ("static", "int8", "int8", "int8", "average")
    kinds = sorted(layer["kind"] for layer in info.layers.values())
    assert kinds == ["add", "concat", "conv", "conv", "conv", "matmul"]
    conv1 = info.layers["/conv1/Conv"]
    (input_params,) = conv1["inputs"].values()
    weight, bias = conv1["weight"], conv1["bias"]
    assert weight["axis"] is None and weight["zero_point"] == 0 and bias["dtype"] == "int32"
    assert np.isclose(bias["scale"], input_params["scale"] * weight["scale"], rtol=1e-6)  # bias scale = s_x * s_w
    operators = static.operators
    assert operators["quantize"] == 6  # x, both ReLUs, the add, conv3's output, the flattened features
    assert operators["dequantize"] == operators["quantize"] + 2 * 4  # and each weighted op's weight and bias
    assert not static.params and not ir.is_quantized

    per_channel = ir.copy()
    per_channel.quantize(activation_dtype="uint8", kernel_dtype="uint8", bias_dtype="int32", per_channel=True,
                         calib_method="minmax")
    info = per_channel.quantization_info
    conv1 = info.layers["/conv1/Conv"]
    assert conv1["weight"]["axis"] == 0 and len(conv1["weight"]["scale"]) == 8
    assert conv1["weight"]["zero_point"] == [128] * 8 and conv1["weight"]["dtype"] == "uint8"
    (input_params,) = conv1["inputs"].values()
    assert input_params["dtype"] == "uint8" and 0 <= input_params["zero_point"] <= 255
    assert np.allclose(conv1["bias"]["scale"], np.float32(input_params["scale"]) * np.float32(conv1["weight"]["scale"]))
    fc = next(layer for layer in info.layers.values() if layer["kind"] == "matmul")
    assert fc["weight"]["axis"] == 1 and len(fc["weight"]["scale"]) == 5

    excluded = ir.copy()
    excluded.quantize(exclude=["/conv2/Conv"])
    assert "/conv2/Conv" not in excluded.quantization_info.layers
    conv2 = next(n for n in excluded.main if n.op_name == "nn.conv2d" and n.succ and n.succ[0].name == "/conv2/Conv")
    assert conv2.pred[1].type == "constant"  # a float weight, not a dequantized one

    x = samples[0]
    reference = ir.get_inference_function()(x)
    for module in (dynamic, static, per_channel, excluded):
        got = module.get_inference_function()(x)
        assert np.abs(got - reference).max() <= 0.05 * np.abs(reference).max()


def test_calibration_methods_derive_the_documented_ranges():
    rng = np.random.default_rng(0)
    stats = TensorStatistics()
    batches = [rng.standard_normal(20000).astype(np.float32) * s for s in (1.0, 2.0, 4.0)]
    for batch in batches:
        stats.observe(batch)
    assert stats.histogram.sum() == 60000 and len(stats.histogram) == HISTOGRAM_BINS  # doubling kept every count
    low, high = activation_range(stats, "minmax")
    assert (low, high) == (min(b.min() for b in batches), max(b.max() for b in batches))
    low, high = activation_range(stats, "average")
    assert np.isclose(low, np.mean([b.min() for b in batches])) and np.isclose(high, np.mean([b.max() for b in batches]))
    everything = np.abs(np.concatenate(batches))
    for percentile in (99.0, 99.99):
        _, high = activation_range(stats, "percentile", percentile)
        assert abs(high - np.percentile(everything, percentile)) <= 2 * stats.bin_edges[1]
    _, entropy_high = activation_range(stats, "entropy")
    assert np.percentile(everything, 99) < entropy_high < everything.max()  # clips outliers, keeps the bulk
    relu = TensorStatistics()
    relu.observe(np.maximum(batches[0], 0))
    assert activation_range(relu, "entropy")[0] == 0.0
    # ReLU6 as in MobileNetV2: 80% exact zeros, 1% at 6. Zeros are exact on any grid and must not
    # drag the threshold down (counted, they made entropy clip at 0.75, and MobileNetV2 lost 6 dB).
    relu6 = TensorStatistics()
    relu6.observe(np.clip(rng.standard_normal(50000) * 4 - 3.4, 0, 6).astype(np.float32))
    assert activation_range(relu6, "entropy")[1] > 5.5
    assert activation_range(relu6, "percentile", 99.0)[1] == pytest.approx(6.0, abs=0.01)


def _grid_error(values: np.ndarray, low: float, high: float, symmetric: bool = False) -> float:
    """The mean squared error of ``values`` quantized to 8 bits over ``[low, high]`` and back (numpy)."""
    values = values.astype(np.float64)
    if symmetric:
        scale = max(-low, high) / 127.0
        q = np.clip(np.round(values / scale), -127, 127) * scale
    else:
        params = activation_params(low, high, "int8")
        scale, zero = float(params.scale), float(params.zero_point)
        q = (np.clip(np.round(values / scale) + zero, -128, 127) - zero) * scale
    return float(np.mean((q - values) ** 2))


@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
def test_mse_method_gives_the_least_squared_error_of_every_method(symmetric):
    """"mse" picks the range whose 8-bit grid errs least on the calibration values, outliers and peaks alike."""
    rng = np.random.default_rng(3)
    gaussian = [rng.standard_normal(20000).astype(np.float32) * s for s in (1.0, 2.0, 4.0)]
    heavy = [rng.standard_t(3, 30000).astype(np.float32)]  # long tails: minmax wastes its steps on them
    # A ReLU6 output over images with flat backgrounds, as in a MobileNetV2 trained on digits: a continuous
    # bulk, 0.07% saturated at 6, and a tenth more values on one number (the background's response),
    # the peak that makes the KL search clip at it.
    bulk = np.clip(rng.gamma(1.5, 0.7 / 1.5, 200000), 0, 6)
    bulk[rng.random(bulk.size) < 0.0007] = 6.0
    peak = [np.concatenate([bulk, np.full(20000, 1.03)]).astype(np.float32)]
    for batches in (gaussian, heavy, peak):
        stats = TensorStatistics()
        for batch in batches:
            stats.observe(batch)
        values = np.concatenate(batches)
        errors = {method: _grid_error(values, *activation_range(stats, method, symmetric=symmetric),
                                      symmetric=symmetric)
                  for method in ("minmax", "average", "entropy", "percentile", "mse")}
        assert errors["mse"] <= 1.02 * min(errors.values()), errors
    # the Gaussians' far tails are clipped, the bulk kept; past the peak, the tail up to 6 is kept
    stats = TensorStatistics()
    for batch in gaussian:
        stats.observe(batch)
    magnitude = np.abs(np.concatenate(gaussian))
    assert np.percentile(magnitude, 99.9) < activation_range(stats, "mse", symmetric=symmetric)[1] < magnitude.max()
    stats = TensorStatistics()
    stats.observe(peak[0])
    assert activation_range(stats, "mse", symmetric=symmetric)[1] > 5.5


# ----------------------------------------------------------------------------------------------------
# Downstream: compile, metadata, graph API, report
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout,opt_level,quant_type", [
    (None, 0, "static"), (None, 1, "static"), ("first", 2, "static"), ("first", 3, "static"), ("last", 3, "static"),
    ("last", 0, "static"), (None, 4, "static"), (None, 3, "dynamic"), ("last", 3, "dynamic")])
def test_quantized_model_compiles_in_each_channel_layout(small, tmp_path, layout, opt_level, quant_type):
    """Each layout and opt_level; the suite runs with FORGE_VERIFY=1: each kernel is checked
    against its unscheduled form."""
    proto, samples = small
    ir = forge.from_onnx(proto)
    ir.calibrate(samples)
    ir.quantize(per_channel=True, calib_method="entropy", quant_type=quant_type)
    x = samples[1]
    expected = ir.get_inference_function()(x)
    ir.compile(output_path=str(tmp_path / "out"), set_channel_layout=layout, opt_level=opt_level,
               export_metadata=True)
    got = forge.Runtime(str(tmp_path / "out")).infer(x)[0]
    assert np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max() + 1e-5
    metadata = json.loads((tmp_path / "out" / "model_metadata.json").read_text())
    jsonschema.validate(metadata, schema.JSON_SCHEMA)
    assert metadata["precision"] == "int8"
    quantization = metadata["quantization"]
    assert quantization["quant_type"] == quant_type and quantization["per_channel"] is True
    assert quantization["calib_method"] == ("entropy" if quant_type == "static" else None)
    assert set(quantization["layers"]) == set(ir.quantization_info.layers)


def test_quantized_module_works_with_fingerprint_copy_and_graph_api(small):
    proto, samples = small
    ir = forge.from_onnx(proto)
    before = ir.fingerprint
    ir.calibrate(samples)
    ir.quantize()
    assert ir.fingerprint != before
    twin = ir.copy()
    assert twin.is_quantized and twin.quantization_info is ir.quantization_info and twin.fingerprint == ir.fingerprint
    graph = ir.main
    dequantized = [n for n in graph if n.op_name == "dequantize"]
    assert any(n.dtype == "float32" and n.pred[0].dtype == "int8" for n in dequantized)
    weight = next(n for n in dequantized if n.name.endswith("_weight_dq")).pred[0]
    assert weight.type == "constant" and weight.dtype == "int8"
    weight.data = np.zeros_like(weight.data)  # edits reach the module, the copy keeps its weights
    assert ir.fingerprint != twin.fingerprint


def test_quantization_report_names_each_layer_and_finds_the_culprit(small):
    proto, samples = small
    ir = forge.from_onnx(proto)
    with pytest.raises(ValueError, match="quantized by quantize"):
        ir.quantization_report(samples)
    ir.calibrate(samples)
    good = ir.copy()
    good.quantize(calib_method="minmax")
    report = good.quantization_report(samples[:3])
    assert [row.name for row in report.layers] == list(good.quantization_info.layers)
    assert all(15 < row.sqnr_db < 80 for row in report.layers), str(report)
    assert report.num_samples == 3 and set(report.outputs) == {"output"}
    text = str(report)
    assert "/conv1/Conv" in text and "SQNR dB" in text
    # A culprit: conv2's input range cut to a tenth by a bad "calibration" (as a wrong range does).
    bad = ir.copy()
    bad._calibration.statistics["/Relu"].maxima[:] = [m / 10 for m in bad._calibration.statistics["/Relu"].maxima]
    bad.quantize(calib_method="minmax")
    bad_report = bad.quantization_report(samples[:3])
    assert bad_report.worst(1)[0].name in ("/conv2/Conv", "/Add")
    assert bad_report.outputs["output"] < report.outputs["output"] - 6
