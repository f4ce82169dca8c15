"""onnxruntime's QOperator quantization (``forge_onnx/converters/qoperator.py`` and ``QLinearConv`` in
``quantized.py``): models its ``quantize_static`` writes, and each operator alone, against onnxruntime.

The integer outputs are compared step for step: at most one quantization step apart (a value within float32
rounding of a half step), in few elements; measured here, none.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

import forge

VI = oh.make_tensor_value_info
OPSETS = [oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _assert_steps(got, want, steps=None) -> None:
    """Integer outputs within one step of onnxruntime's in at most 1 % of the elements; float outputs within one
    quantization step (``steps``: the step of each float output; else float32 rounding) in at most 1 % of them."""
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        off = np.abs(g.astype(np.float64) - w.astype(np.float64))
        if not np.issubdtype(w.dtype, np.integer) and not steps:  # float32 arithmetic: its rounding of the range
            assert off.max() <= 2e-6 * float(np.abs(w).max()), f"output {index}: {off.max()} off"
            continue
        step = 1.0 if np.issubdtype(w.dtype, np.integer) else steps[index]
        assert off.max() <= step * 1.001, f"output {index}: {off.max()} off (step {step})"
        assert (off > step * 1e-3).mean() <= 0.01, f"output {index}: {(off > step * 1e-3).mean():.3%} of elements off"


class _Net(torch.nn.Module):
    """The operators QOperator quantization writes: conv + LeakyRelu, Add, Sigmoid, Mul, Concat, AveragePool,
    global average (ReduceMean), Gemm, and MaxPool and Resize on the integers as they are (its quantizer fails on
    a Where here: ``QLinearWhere`` is tested alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.c3 = torch.nn.Conv2d(16, 8, 1, stride=2)
        self.fc = torch.nn.Linear(8, 5)
        self.act = torch.nn.LeakyReLU(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.act(self.c1(x))
        b = self.c2(a)
        up = torch.nn.functional.interpolate(torch.nn.functional.max_pool2d(b, 2), scale_factor=2.0)
        c = torch.sigmoid(a + b) * up
        d = torch.cat([c, a], 1)
        e = torch.nn.functional.avg_pool2d(self.c3(d), 2)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(e, 1).flatten(1))


def _quantized_net(tmp_path, per_channel: bool, activations: str) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    torch.manual_seed(0)
    net = _Net().eval()
    torch.onnx.export(net, (torch.randn(1, 3, 18, 18),), str(tmp_path / "net.onnx"), input_names=["x"],
                      opset_version=17, dynamo=False, dynamic_axes={"x": {0: "batch"}})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": np.random.default_rng(i).standard_normal((1, 3, 18, 18)).astype("float32")}
                               for i in range(8)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(tmp_path / "net.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=per_channel, activation_type=getattr(QuantType, activations),
                    weight_type=QuantType.QInt8)
    return onnx.load(str(tmp_path / "q.onnx"))


@pytest.mark.parametrize(("per_channel", "activations"), [(False, "QUInt8"), (True, "QUInt8"), (True, "QInt8")],
                         ids=["per-tensor-uint8", "per-channel-uint8", "per-channel-int8"])
def test_a_model_quantized_by_onnxruntime_in_qoperator_format(tmp_path, per_channel, activations):
    """The model as onnxruntime's ``quantize_static`` writes it in the QOperator format, its batch dynamic: the
    inference function, compiled at opt_level 1 and 3 and for the AVX2 class, at batches 1 and 3."""
    model = _quantized_net(tmp_path, per_channel, activations)
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    assert {("", "QLinearConv"), ("com.microsoft", "QLinearAdd"), ("com.microsoft", "QLinearMul"),
            ("com.microsoft", "QLinearSigmoid"), ("com.microsoft", "QLinearLeakyRelu"),
            ("com.microsoft", "QLinearConcat"), ("com.microsoft", "QLinearAveragePool"),
            ("com.microsoft", "QLinearGlobalAveragePool"), ("com.microsoft", "QGemm"),
            ("", "MaxPool"), ("", "Resize")} <= ops, ops
    ir = forge.from_onnx(model)
    runs = [ir.get_inference_function()]
    for level, target in ((1, "llvm"), (3, "llvm"), (3, "llvm -mcpu=x86-64-v3")):
        artifact = tmp_path / f"artifact-{level}-{target.split()[-1]}"
        ir.compile(output_path=artifact, opt_level=level, target=target)
        runs.append(forge.Runtime(artifact).infer)
    _assert_batches(model, runs)


@pytest.mark.parametrize("opt_level", [0, 2, 4])
def test_the_qoperator_model_at_the_other_opt_levels(tmp_path, opt_level):
    """The per-channel uint8 model compiled at opt_level 0, 2 and 4 (1 and 3 above), at batches 1 and 3."""
    model = _quantized_net(tmp_path, True, "QUInt8")
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact", opt_level=opt_level)
    _assert_batches(model, [forge.Runtime(tmp_path / "artifact").infer])


def _assert_batches(model: onnx.ModelProto, runs) -> None:
    """Each of ``runs`` on batches of 1 and 3 within one step of the model's output of onnxruntime's."""
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    step = float(nh.to_array(next(i for i in model.graph.initializer if i.name == last.input[1])))
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 18, 18)).astype("float32")
        want = _reference(model, {"x": x})
        for run in runs:
            _assert_steps(run(x), want, [step])


def _single(nodes, inputs, outputs, initializers, feeds, compiled_at=None, tmp_path=None):
    graph = oh.make_graph(nodes, "qop", inputs, outputs, initializer=initializers)
    model = oh.make_model(graph, opset_imports=OPSETS, ir_version=8)
    want = _reference(model, feeds)
    ir = forge.from_onnx(model)
    _assert_steps(ir.get_inference_function()(*feeds.values()), want)
    if compiled_at is not None:
        ir.compile(output_path=tmp_path / "artifact", opt_level=compiled_at)
        _assert_steps(forge.Runtime(tmp_path / "artifact").infer(*feeds.values()), want)


def _scalars(**values):
    """Scale (float) and zero point (uint8 or int8) initializers: ``name=(value, dtype)``."""
    return [nh.from_array(np.array(v, dtype), name) for name, (v, dtype) in values.items()]


RNG = np.random.default_rng(0)


def _u8(shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary_operators_broadcast(tmp_path, op):
    node = oh.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain="com.microsoft")
    inits = _scalars(sa=(0.02, "float32"), za=(120, "uint8"), sb=(0.05, "float32"), zb=(7, "uint8"),
                     sc=(0.04 if op == "QLinearAdd" else 0.3, "float32"), zc=(128, "uint8"))
    feeds = {"a": _u8((2, 4, 5, 6)), "b": _u8((4, 1, 6))}
    _single([node], [VI("a", TensorProto.UINT8, [2, 4, 5, 6]), VI("b", TensorProto.UINT8, [4, 1, 6])],
            [VI("c", TensorProto.UINT8, None)], inits, feeds, compiled_at=3, tmp_path=tmp_path)


@pytest.mark.parametrize(("op", "attrs"), [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {}),
                                           ("QLinearLeakyRelu", {"alpha": 0.3})])
def test_unary_operators(op, attrs):
    node = oh.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft", **attrs)
    sigmoid = op == "QLinearSigmoid"
    inits = _scalars(sx=(0.05, "float32"), zx=(100, "uint8"), sy=(1 / 255 if sigmoid else 0.04, "float32"),
                     zy=(0 if sigmoid else 90, "uint8"))
    # every uint8 value once: the whole table onnxruntime builds
    feeds = {"x": np.arange(256, dtype=np.uint8).reshape(4, 64)}
    _single([node], [VI("x", TensorProto.UINT8, [4, 64])], [VI("y", TensorProto.UINT8, None)], inits, feeds)


def test_concat_requantizes_the_inputs_in_other_scales(tmp_path):
    node = oh.make_node("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb", "zb", "c", "sc", "zc"], ["y"],
                        domain="com.microsoft", axis=1)
    inits = _scalars(sy=(0.05, "float32"), zy=(128, "uint8"), sa=(0.05, "float32"), za=(128, "uint8"),
                     sb=(0.013, "float32"), zb=(3, "uint8"), sc=(0.2, "float32"), zc=(200, "uint8"))
    feeds = {"a": _u8((2, 3, 4)), "b": _u8((2, 5, 4)), "c": _u8((2, 1, 4))}
    _single([node], [VI(n, TensorProto.UINT8, list(v.shape)) for n, v in feeds.items()],
            [VI("y", TensorProto.UINT8, None)], inits, feeds, compiled_at=1, tmp_path=tmp_path)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 2], "strides": [2, 2], "channels_last": 1},
], ids=["pads", "count-include-pad", "ceil-mode", "same-upper", "channels-last"])
def test_average_pool(attrs):
    node = oh.make_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft", **attrs)
    inits = _scalars(sx=(0.05, "float32"), zx=(100, "uint8"), sy=(0.03, "float32"), zy=(110, "uint8"))
    feeds = {"x": _u8((2, 3, 9, 10))}
    _single([node], [VI("x", TensorProto.UINT8, [2, 3, 9, 10])], [VI("y", TensorProto.UINT8, None)], inits, feeds)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool(channels_last):
    node = oh.make_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft",
                        channels_last=channels_last)
    inits = _scalars(sx=(0.05, "float32"), zx=(100, "uint8"), sy=(0.01, "float32"), zy=(120, "uint8"))
    feeds = {"x": _u8((2, 5, 7, 6))}
    _single([node], [VI("x", TensorProto.UINT8, [2, 5, 7, 6])], [VI("y", TensorProto.UINT8, None)], inits, feeds)


@pytest.mark.parametrize(("trans_a", "trans_b", "bias", "quantized_output", "per_column"), [
    (0, 1, True, True, False), (1, 0, False, True, True), (0, 0, True, False, True)],
    ids=["transB-bias", "transA-per-column", "float-output"])
def test_qgemm(tmp_path, trans_a, trans_b, bias, quantized_output, per_column):
    m, k, n = 5, 12, 7
    a = _u8((k, m) if trans_a else (m, k))
    b = RNG.integers(-127, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    inits = [nh.from_array(b, "b"), *_scalars(sa=(0.02, "float32"), za=(128, "uint8"))]
    inits.append(nh.from_array(np.linspace(0.01, 0.03, n).astype("float32") if per_column
                               else np.array(0.015, "float32"), "sb"))
    inits.append(nh.from_array(np.zeros(n if per_column else (), np.int8), "zb"))
    names = ["a", "sa", "za", "b", "sb", "zb", "c" if bias else ""]
    if bias:
        inits.append(nh.from_array(RNG.integers(-2000, 2000, n).astype(np.int32), "c"))
    if quantized_output:
        names += ["sy", "zy"]
        inits += _scalars(sy=(0.5, "float32"), zy=(100, "uint8"))
    node = oh.make_node("QGemm", names, ["y"], domain="com.microsoft", transA=trans_a, transB=trans_b, alpha=0.75)
    _single([node], [VI("a", TensorProto.UINT8, list(a.shape))],
            [VI("y", TensorProto.UINT8 if quantized_output else TensorProto.FLOAT, None)], inits, {"a": a},
            compiled_at=3, tmp_path=tmp_path)


def test_matmul_integer_to_float_and_dynamic_quantize_matmul(tmp_path):
    """What onnxruntime's optimizer makes of ``quantize_dynamic``'s matrix products: int8 weights, a bias."""
    b = RNG.integers(-127, 128, (16, 6)).astype(np.int8)
    inits = [nh.from_array(b, "b"), nh.from_array(np.linspace(0.01, 0.02, 6).astype("float32"), "sb"),
             nh.from_array(RNG.standard_normal(6).astype("float32"), "bias"),
             *_scalars(sa=(0.03, "float32"), za=(120, "uint8"))]
    nodes = [oh.make_node("MatMulIntegerToFloat", ["a", "b", "sa", "sb", "za", "", "bias"], ["y1"],
                          domain="com.microsoft"),
             oh.make_node("DynamicQuantizeMatMul", ["x", "b", "sb", "", "bias"], ["y2"], domain="com.microsoft")]
    feeds = {"a": _u8((3, 4, 16)), "x": RNG.standard_normal((3, 4, 16)).astype("float32")}
    _single(nodes, [VI("a", TensorProto.UINT8, [3, 4, 16]), VI("x", TensorProto.FLOAT, [3, 4, 16])],
            [VI("y1", TensorProto.FLOAT, None), VI("y2", TensorProto.FLOAT, None)], inits, feeds,
            compiled_at=3, tmp_path=tmp_path)


@pytest.mark.parametrize(("group", "stride", "per_channel", "x_type"), [
    (1, 1, False, "uint8"), (1, 2, True, "uint8"), (6, 1, True, "uint8"), (2, 1, False, "int8")],
    ids=["plain", "strided-per-channel", "depthwise", "grouped-int8"])
def test_qlinear_conv(tmp_path, group, stride, per_channel, x_type):
    """Padded (its zeros are the input's zero point), with an int32 bias, against onnxruntime."""
    cin, cout = 6, 6 if group == 6 else 8
    w = RNG.integers(-127, 128, (cout, cin // group, 3, 3)).astype(np.int8)
    x = RNG.integers(0 if x_type == "uint8" else -128, 256 if x_type == "uint8" else 128,
                     (1, cin, 9, 10)).astype(x_type)
    inits = [nh.from_array(w, "w"), nh.from_array(np.array(0.02, "float32"), "sx"),
             nh.from_array(np.array(110 if x_type == "uint8" else -5, x_type), "zx"),
             nh.from_array(np.linspace(0.005, 0.02, cout).astype("float32") if per_channel
                           else np.array(0.01, "float32"), "sw"),
             nh.from_array(np.zeros(cout if per_channel else (), np.int8), "zw"),
             nh.from_array(np.array(0.6, "float32"), "sy"), nh.from_array(np.array(120 if x_type == "uint8" else 3,
                                                                               x_type), "zy"),
             nh.from_array(RNG.integers(-3000, 3000, cout).astype(np.int32), "bias")]
    node = oh.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"], ["y"], group=group,
                        strides=[stride, stride], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    elem = TensorProto.UINT8 if x_type == "uint8" else TensorProto.INT8
    _single([node], [VI("x", elem, list(x.shape))], [VI("y", elem, None)], inits, {"x": x}, compiled_at=3,
            tmp_path=tmp_path)


@pytest.mark.parametrize(("dtype", "opset", "axis", "shape"), [
    ("uint8", 13, -1, (2, 3, 10)), ("uint8", 13, 1, (2, 5, 4)), ("int8", 13, -1, (3, 1000)),
    ("uint8", 12, 1, (2, 3, 4))], ids=["uint8-last", "uint8-axis1", "int8-1000-classes", "opset12-flattened"])
def test_qlinear_softmax(dtype, opset, axis, shape):
    node = oh.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft", axis=axis,
                        opset=opset)
    signed = dtype == "int8"
    inits = [nh.from_array(np.array(0.08, "float32"), "sx"),
             nh.from_array(np.array(-3 if signed else 120, dtype), "zx"),
             nh.from_array(np.array(1 / 256, "float32"), "sy"),
             nh.from_array(np.array(-128 if signed else 0, dtype), "zy")]
    x = RNG.integers(-128 if signed else 0, 128 if signed else 256, shape).astype(dtype)
    elem = TensorProto.INT8 if signed else TensorProto.UINT8
    _single([node], [VI("x", elem, list(shape))], [VI("y", elem, None)], inits, {"x": x})


def test_a_qoperator_model_builds_for_a_gpu(tmp_path):
    """Every QOperator operator, its rounding included (TIR's nearbyint: CUDA's nearbyintf), through the GPU
    pipeline: nvcc compiles the kernels for sm_90 (no GPU here to run them)."""
    model = _quantized_net(tmp_path, per_channel=True, activations="QUInt8")
    forge.from_onnx(model).compile(target="cuda -arch=sm_90", output_path=tmp_path / "cuda")
    assert (tmp_path / "cuda" / "model_library.so").is_file()


def test_qlinear_where_broadcasts():
    node = oh.make_node("QLinearWhere", ["c", "x", "sx", "zx", "y", "sy", "zy", "sz", "zz"], ["z"],
                        domain="com.microsoft")
    inits = _scalars(sx=(0.05, "float32"), zx=(100, "uint8"), sy=(0.02, "float32"), zy=(10, "uint8"),
                     sz=(0.04, "float32"), zz=(60, "uint8"))
    feeds = {"c": RNG.random((3, 1, 5)) > 0.5, "x": _u8((3, 4, 5)), "y": _u8((5,))}
    _single([node], [VI("c", TensorProto.BOOL, [3, 1, 5]), VI("x", TensorProto.UINT8, [3, 4, 5]),
                     VI("y", TensorProto.UINT8, [5])], [VI("z", TensorProto.UINT8, None)], inits, feeds)
