"""ONNX models with random weights, built with onnx.helper, for numerical checks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# onnx.helper writes IR version 14, which onnxruntime 1.31 rejects.
IR_VERSION = 10

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(p.stem.removeprefix("light_") for p in LIGHT_DIR.glob("light_*.onnx"))


def light_model_path(name: str) -> Path:
    return LIGHT_DIR / f"light_{name}.onnx"


def light_reference(name: str) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(str(LIGHT_DIR / f"light_{name}_output_0.pb")))


def light_input(model: onnx.ModelProto) -> np.ndarray:
    """The input ONNX's backend test runner feeds the light models: arange(n)/n."""
    inits = {i.name for i in model.graph.initializer}
    first = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in first.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def make_model(nodes, inputs, outputs, initializers=(), name="g", opset=OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _init(rng: np.random.Generator, name: str, shape, scale=0.1, positive=False) -> onnx.TensorProto:
    data = rng.standard_normal(shape).astype(np.float32) * scale
    if positive:
        data = np.abs(data) + 0.5
    return numpy_helper.from_array(data, name)


def conv_bn_net(seed: int = 0, batch: int | str = 1, channels: int = 8) -> onnx.ModelProto:
    """Conv-BN-Relu x3 with a residual add, global pool, Flatten and Gemm: 3 Conv, 3 BN."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = []
    nodes = []
    prev, prev_c = "x", 3
    for i in range(3):
        inits += [
            _init(rng, f"w{i}", (c, prev_c, 3, 3), 0.3),
            _init(rng, f"b{i}", (c,)),
            _init(rng, f"g{i}", (c,), positive=True),
            _init(rng, f"beta{i}", (c,)),
            _init(rng, f"m{i}", (c,)),
            _init(rng, f"v{i}", (c,), positive=True),
        ]
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node(
                "BatchNormalization", [f"c{i}", f"g{i}", f"beta{i}", f"m{i}", f"v{i}"], [f"bn{i}"], name=f"bn{i}"
            ),
            helper.make_node("Relu", [f"bn{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev, prev_c = f"r{i}", c
    nodes += [
        helper.make_node("Add", ["r0", "r2"], ["res"], name="residual"),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    inits += [_init(rng, "fc_w", (10, c)), _init(rng, "fc_b", (10,))]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])
    return make_model(nodes, [x], [y], inits, name="conv_bn_net")


def two_io_net(seed: int = 0) -> onnx.ModelProto:
    """Two inputs (float and int64 indices), two outputs."""
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "w", (16, 8)), _init(rng, "emb", (20, 8))]
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["mm"], name="matmul"),
        helper.make_node("Gather", ["emb", "ids"], ["g"], name="gather", axis=0),
        helper.make_node("Add", ["mm", "g"], ["sum"], name="add"),
        helper.make_node("Softmax", ["sum"], ["probs"], name="softmax", axis=-1),
        helper.make_node("Tanh", ["mm"], ["act"], name="tanh"),
    ]
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 16])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [4])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [4, 8])
    act = helper.make_tensor_value_info("act", TensorProto.FLOAT, [4, 8])
    return make_model(nodes, [a, ids], [probs, act], inits, name="two_io")


def unsupported_ops_net() -> onnx.ModelProto:
    """A valid graph whose custom-domain ops no importer knows."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("FancyOp", ["r"], ["f1"], name="fancy_1", domain="com.acme"),
        helper.make_node("FancyOp", ["f1"], ["f2"], name="fancy_2", domain="com.acme"),
        helper.make_node("OtherOp", ["f2"], ["y"], name="other", domain="com.acme"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph(nodes, "unsupported", [x], [y])
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.acme", 1)],
        ir_version=IR_VERSION,
    )


def assert_matches_framework(got, want: np.ndarray, rtol: float = 1e-4) -> None:
    """``got`` (an array, or a one-output list) equals ``want`` within ``rtol``, absolute tolerance relative to
    ``want``'s largest magnitude: the corpus tests' check against the source framework."""
    got = got[0] if isinstance(got, list) else got
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


def export_torch(model, inputs: tuple, names: list[str]) -> onnx.ModelProto:
    """``model`` exported by torch's TorchScript exporter at opset 17, one output named ``output``."""
    import io
    import warnings

    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buffer, input_names=names, output_names=["output"], opset_version=17,
                          dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


def onnxruntime_quantized(proto: onnx.ModelProto, samples: list[dict[str, np.ndarray]], folder,
                          activation_type: str = "QInt8", per_channel: bool = True) -> str:
    """``proto`` quantized by onnxruntime's ``quantize_static`` (QDQ, int8 weights, ``activation_type`` "QInt8"
    or "QUInt8"), calibrated on ``samples`` (feeds by input name); the path of the quantized model in ``folder``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(samples)

        def get_next(self):
            return next(self.items, None)

    source, target = folder / "fp32.onnx", folder / "int8.onnx"
    onnx.save(proto, source)
    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=getattr(QuantType, activation_type), weight_type=QuantType.QInt8)
    return str(target)


def _exact_integer_matmuls(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with each ``MatMulInteger`` written as int32 ``MatMul`` of its zero-point-shifted
    inputs: exact everywhere, where onnxruntime's uint8 x int8 kernel saturates on CPUs without VNNI."""
    from onnx import helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulInteger":
            nodes.append(node)
            continue
        shifted = []
        for index, name in enumerate(node.input[:2]):
            wide = f"{node.output[0]}__exact_{index}"
            nodes.append(helper.make_node("Cast", [name], [wide], to=onnx.TensorProto.INT32))
            zero_point = node.input[index + 2] if len(node.input) > index + 2 and node.input[index + 2] else None
            if zero_point is not None:
                nodes.append(helper.make_node("Cast", [zero_point], [wide + "_zp"], to=onnx.TensorProto.INT32))
                nodes.append(helper.make_node("Sub", [wide, wide + "_zp"], [wide + "_shifted"]))
                wide += "_shifted"
            shifted.append(wide)
        nodes.append(helper.make_node("MatMul", shifted, list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def onnxruntime_int8_references(model: str | bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs (the first of each run) for a quantized model, computed exactly on this CPU.

    onnxruntime's fused int8 kernels (QLinearConv, MatMulInteger...) multiply uint8 by int8 with
    ``vpmaddubsw`` on CPUs without VNNI (AVX2, AVX-512 without VNNI), whose int16 pair sums saturate
    on full-range bytes: its own documentation says so, and on an AVX2 Zen MobileNet blocks' logits
    came out 7 of 10 different. So the reference is onnxruntime with its graph optimizations off (each
    QuantizeLinear, DequantizeLinear and float operator as written) and ``MatMulInteger`` as exact int32
    ``MatMul``; where this CPU has VNNI (AVX-512 VNNI or AVX-VNNI: exact ``vpdpbusd``), onnxruntime's
    optimized session as well.
    """
    import onnxruntime as ort
    from cpu_features import cpu_has

    if isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = onnx.load(model)
    exact = proto if not any(n.op_type == "MatMulInteger" for n in proto.graph.node) else _exact_integer_matmuls(proto)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runs = [(exact.SerializeToString(), plain)]
    if cpu_has("avx512_vnni") or cpu_has("avx_vnni"):
        runs.append((proto.SerializeToString(), ort.SessionOptions()))
    return [ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feed)[0]
            for data, options in runs]


def digits_cnn(batch: int = 128):
    """A CNN trained on scikit-learn's digits (seconds), as ONNX at ``batch``: ``(proto, calibration, tests)``.

    ``calibration``: four training batches; ``tests``: four ``(images, labels)`` batches held out.
    """
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (((data.images.astype(np.float32) / 16.0) - 0.3) / 0.4)[:, None]
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], data.target[order]
    train_x, train_y = images[:1280], labels[:1280]
    test_x, test_y = images[1280:1280 + 4 * batch], labels[1280:1280 + 4 * batch]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.from_numpy(train_x), torch.from_numpy(train_y)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # beside TVM's and onnxruntime's thread pools, torch's own ran 10-40x slower here
    try:
        for _ in range(12):
            for start in range(0, len(x), 128):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x[start:start + 128]), y[start:start + 128]).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    proto = export_torch(model, (torch.from_numpy(test_x[:batch]),), ["image"])
    calibration = [train_x[i:i + batch] for i in range(0, 4 * batch, batch)]
    tests = [(test_x[i:i + batch], test_y[i:i + batch]) for i in range(0, len(test_x), batch)]
    return proto, calibration, tests
