"""onnxruntime's ``com.microsoft`` fused operators, as its optimizers write them into saved models
(``forge_onnx/converters/microsoft.py``), against onnxruntime on random weights and inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

import forge

RNG = np.random.default_rng(0)
VI = oh.make_tensor_value_info
OPSETS = [oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]


def check(nodes, inputs, outputs, initializers, feeds) -> None:
    graph = oh.make_graph(nodes, "contrib", inputs, outputs, initializer=initializers)
    model = oh.make_model(graph, opset_imports=OPSETS, ir_version=8)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = forge.from_onnx(model).get_inference_function()(*feeds.values())
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()) + 1e-6)


X = RNG.standard_normal((1, 3, 9, 7)).astype("float32")
W = nh.from_array(RNG.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
B = nh.from_array(RNG.standard_normal((4,)).astype("float32"), "b")


@pytest.mark.parametrize(("activation", "params"), [
    ("", []), ("Relu", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.5]), ("HardSigmoid", [0.3, 0.4]),
    ("Sigmoid", []), ("Tanh", []),
])
def test_fused_conv(activation, params):
    extra = {"activation_params": [float(p) for p in params]} if params else {}
    node = oh.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft", pads=[1, 1, 1, 1],
                        strides=[2, 1], **({"activation": activation} if activation else {}), **extra)
    check([node], [VI("x", TensorProto.FLOAT, [1, 3, 9, 7])], [VI("y", TensorProto.FLOAT, [1, 4, 5, 7])], [W, B],
          {"x": X})


def test_fused_conv_with_a_sum_input():
    z = RNG.standard_normal((1, 4, 9, 7)).astype("float32")
    node = oh.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft", activation="Relu",
                        pads=[1, 1, 1, 1])
    check([node], [VI("x", TensorProto.FLOAT, [1, 3, 9, 7]), VI("z", TensorProto.FLOAT, [1, 4, 9, 7])],
          [VI("y", TensorProto.FLOAT, [1, 4, 9, 7])], [W, B], {"x": X, "z": z})


@pytest.mark.parametrize(("trans_a", "trans_b", "alpha"), [(0, 0, 1.0), (1, 0, 0.5), (0, 1, 2.0), (1, 1, 0.125)])
def test_fused_matmul(trans_a, trans_b, alpha):
    a = RNG.standard_normal((2, 3, 5) if trans_a else (2, 5, 3)).astype("float32")
    b = RNG.standard_normal((2, 4, 3) if trans_b else (2, 3, 4)).astype("float32")
    node = oh.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=trans_a, transB=trans_b,
                        alpha=alpha)
    check([node], [VI("a", TensorProto.FLOAT, list(a.shape)), VI("b", TensorProto.FLOAT, list(b.shape))],
          [VI("y", TensorProto.FLOAT, [2, 5, 4])], [], {"a": a, "b": b})


H = RNG.standard_normal((2, 6, 16)).astype("float32") * 3
S = RNG.standard_normal((2, 6, 16)).astype("float32")
GAMMA = nh.from_array(RNG.uniform(0.5, 1.5, (16,)).astype("float32"), "gamma")
BIAS = nh.from_array(RNG.standard_normal((16,)).astype("float32"), "bias")


def test_quick_gelu():
    node = oh.make_node("QuickGelu", ["h"], ["y"], domain="com.microsoft", alpha=1.5)
    check([node], [VI("h", TensorProto.FLOAT, [2, 6, 16])], [VI("y", TensorProto.FLOAT, [2, 6, 16])], [], {"h": H})


def test_simplified_layer_normalization():
    node = oh.make_node("SimplifiedLayerNormalization", ["h", "gamma"], ["y"], epsilon=1e-6, axis=-1)
    check([node], [VI("h", TensorProto.FLOAT, [2, 6, 16])], [VI("y", TensorProto.FLOAT, [2, 6, 16])], [GAMMA],
          {"h": H})


@pytest.mark.parametrize("with_bias", [True, False])
def test_skip_simplified_layer_normalization_and_its_sum_output(with_bias):
    inputs = ["h", "s", "gamma"] + (["bias"] if with_bias else [])
    node = oh.make_node("SkipSimplifiedLayerNormalization", inputs, ["y", "", "", "total"], domain="com.microsoft",
                        epsilon=1e-6)
    check([node], [VI("h", TensorProto.FLOAT, [2, 6, 16]), VI("s", TensorProto.FLOAT, [2, 6, 16])],
          [VI("y", TensorProto.FLOAT, [2, 6, 16]), VI("total", TensorProto.FLOAT, [2, 6, 16])],
          [GAMMA] + ([BIAS] if with_bias else []), {"h": H, "s": S})


def test_a_model_onnxruntime_optimized_and_saved(tmp_path):
    """A CNN (Conv -> Add of a residual -> Relu; Conv -> Sigmoid; MatMul of a transposed operand times a scale)
    saved by onnxruntime after its extended optimizations: FusedConv and FusedMatMul in the file."""
    w2 = nh.from_array(RNG.standard_normal((4, 4, 3, 3)).astype("float32") * 0.3, "w2")
    nodes = [
        oh.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"]),
        oh.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        oh.make_node("Add", ["c2", "r1"], ["s"]),
        oh.make_node("Relu", ["s"], ["r2"]),
        oh.make_node("Conv", ["r2", "w2"], ["c3"], pads=[1, 1, 1, 1]),
        oh.make_node("Sigmoid", ["c3"], ["g"]),
        oh.make_node("Reshape", ["g", "flat"], ["m"]),
        oh.make_node("Transpose", ["m"], ["mt"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["mt", "m"], ["mm"]),
        oh.make_node("Mul", ["mm", "scale"], ["y"]),
    ]
    initializers = [W, B, w2, nh.from_array(np.array([1, 4, 63], "int64"), "flat"),
                    nh.from_array(np.array(0.25, "float32"), "scale")]
    graph = oh.make_graph(nodes, "cnn", [VI("x", TensorProto.FLOAT, [1, 3, 9, 7])],
                          [VI("y", TensorProto.FLOAT, [1, 63, 63])], initializer=initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    optimized = tmp_path / "optimized.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    saved = onnx.load(optimized)
    fused = {(n.domain, n.op_type) for n in saved.graph.node}
    assert ("com.microsoft", "FusedConv") in fused and ("com.microsoft", "FusedMatMul") in fused, fused
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    got = forge.from_onnx(optimized).get_inference_function()(X)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
def test_fused_operators_compiled_at_every_opt_level(opt_level, tmp_path):
    """An artifact, not the inference function: FusedConv alone (no epilogue), FusedConv with a residual sum and
    Relu, and a scaled FusedMatMul of transposed operands, odd sizes, at each opt_level (4: LLVM's fast-math
    flags, a few ulps)."""
    a = RNG.standard_normal((2, 3, 5)).astype("float32")
    b = RNG.standard_normal((2, 4, 3)).astype("float32")
    nodes = [
        oh.make_node("FusedConv", ["x", "w", "b"], ["c1"], domain="com.microsoft", pads=[1, 1, 1, 1]),
        oh.make_node("FusedConv", ["x", "w", "b", "c1"], ["c2"], domain="com.microsoft", activation="Relu",
                     pads=[1, 1, 1, 1]),
        oh.make_node("FusedMatMul", ["ma", "mb"], ["m"], domain="com.microsoft", transA=1, transB=1, alpha=0.25),
    ]
    graph = oh.make_graph(nodes, "fused", [VI("x", TensorProto.FLOAT, [1, 3, 9, 7]),
                                           VI("ma", TensorProto.FLOAT, [2, 3, 5]), VI("mb", TensorProto.FLOAT, [2, 4, 3])],
                          [VI("c1", TensorProto.FLOAT, [1, 4, 9, 7]), VI("c2", TensorProto.FLOAT, [1, 4, 9, 7]),
                           VI("m", TensorProto.FLOAT, [2, 5, 4])], initializer=[W, B])
    model = oh.make_model(graph, opset_imports=OPSETS, ir_version=8)
    feeds = {"x": X, "ma": a, "mb": b}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact", opt_level=opt_level)
    got = forge.Runtime(tmp_path / "artifact").infer(*feeds.values())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))


# --- DynamicQuantizeLSTM: onnxruntime's quantize_dynamic of an LSTM -------------------------------------------------

def _lstm_model(direction: str, hidden: int = 16, features: int = 12, seed: int = 3, batch: int | str = 1,
                lengths: bool = False) -> onnx.ModelProto:
    """A float LSTM at a dynamic sequence length, with initial states given (batch 1) or ``sequence_lens``."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    shapes = [("W", (dirs, 4 * hidden, features)), ("R", (dirs, 4 * hidden, hidden)), ("B", (dirs, 8 * hidden))]
    if not lengths:
        shapes += [("h0", (dirs, batch, hidden)), ("c0", (dirs, batch, hidden))]
    weights = [nh.from_array((rng.standard_normal(shape) * 0.3).astype("float32"), name) for name, shape in shapes]
    states = ["L", "", ""] if lengths else ["", "h0", "c0"]
    node = oh.make_node("LSTM", ["X", "W", "R", "B", *states], ["Y", "Y_h", "Y_c"], hidden_size=hidden,
                        direction=direction)
    inputs = [VI("X", TensorProto.FLOAT, ["sequence", batch, features])]
    inputs += [VI("L", TensorProto.INT32, [batch])] if lengths else []
    graph = oh.make_graph([node], "lstm", inputs, [VI(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")],
                          initializer=weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)


def _quantized(float_model: onnx.ModelProto, tmp_path, per_channel: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx.save(float_model, str(tmp_path / "lstm.onnx"))
    quantize_dynamic(str(tmp_path / "lstm.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8,
                     per_channel=per_channel, op_types_to_quantize=["LSTM"])
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    return quantized


def _run(model: onnx.ModelProto, *feeds: np.ndarray) -> list[np.ndarray]:
    """onnxruntime on one thread: with several batch rows its DynamicQuantizeLSTM quantizes each thread's part of
    the batch on its own, so only its one-thread numbers are the whole batch's."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds)))


def _assert_onnxruntimes(got, want, original) -> None:
    """Within float32 rounding of onnxruntime's outputs (the quantization steps are 1/255 of a range: one of
    them taken differently would be 1e-3); the float model, which Forge matched before, is 1e-2 away."""
    for g, w, o in zip(got, want, original):
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6 * scale)
        assert np.abs(o - w).max() > 1e-3 * scale


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_dynamic_quantize_lstm_gives_onnxruntimes_numbers(tmp_path, direction, per_channel):
    """onnxruntime's kernel quantizes X and each step's hidden state to uint8 and multiplies integers: Forge
    computes the same, at two sequence lengths of one model (dynamic), compiled and not."""
    float_model = _lstm_model(direction)
    quantized = _quantized(float_model, tmp_path, per_channel)
    ir = forge.from_onnx(quantized)
    run = ir.get_inference_function()
    ir.compile(output_path=tmp_path / "artifact")
    built = forge.Runtime(tmp_path / "artifact")
    for length in (9, 4):
        x = np.random.default_rng(length).standard_normal((length, 1, 12)).astype("float32")
        want, original = _run(quantized, x), _run(float_model, x)
        for got in (run(x), built.infer(x)):
            _assert_onnxruntimes(got, want, original)


@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_dynamic_quantize_lstm_with_sequence_lens_at_every_opt_level_and_on_avx2(tmp_path, direction):
    """Three batch rows of lengths 5, 7 and 2 (rows past their length leave the state's range; X is quantized
    over the steps run), 40 hidden units (a partial tile), per-channel weights: the inference function, every
    opt_level, and the AVX2 class, against onnxruntime."""
    float_model = _lstm_model(direction, hidden=40, features=7, seed=5, batch="batch", lengths=True)
    quantized = _quantized(float_model, tmp_path, per_channel=True)
    x = (np.random.default_rng(1).standard_normal((9, 3, 7)) * 2).astype("float32")
    lengths = np.array([5, 7, 2], "int32")
    want, original = _run(quantized, x, lengths), _run(float_model, x, lengths)
    ir = forge.from_onnx(quantized)
    _assert_onnxruntimes(ir.get_inference_function()(x, lengths), want, original)
    builds = [(level, "llvm") for level in range(5)] + [(3, "llvm -mcpu=x86-64-v3")]
    for level, target in builds:
        artifact = tmp_path / f"artifact-{level}-{target.split()[-1]}"
        ir.compile(output_path=artifact, opt_level=level, target=target)
        _assert_onnxruntimes(forge.Runtime(artifact).infer(x, lengths), want, original)


def test_dynamic_quantize_lstm_rounds_ties_to_even(tmp_path):
    """X's range is 255/64, so its scale is 1/64 and every other value lies halfway between two steps: rounded
    half to even, as onnxruntime does (half away from zero would move a third of them by a step)."""
    float_model = _lstm_model("forward", seed=7)
    quantized = _quantized(float_model, tmp_path, per_channel=False)
    steps = np.random.default_rng(2).integers(0, 254, (6, 1, 12)).astype("float32")
    x = ((steps + 0.5) / 64).astype("float32")
    x[0, 0, 0] = 255 / 64
    want, original = _run(quantized, x), _run(float_model, x)
    got = forge.from_onnx(quantized).get_inference_function()(x)
    _assert_onnxruntimes(got, want, original)
    # The ties matter: rounded half up, the input's steps (and so the outputs) move.
    away = _run(quantized, (np.floor(steps + 1) / 64).astype("float32") * (x != 255 / 64) + x * (x == 255 / 64))
    assert np.abs(away[0] - want[0]).max() > 1e-4 * float(np.abs(want[0]).max())


def test_dynamic_quantize_lstm_builds_for_a_gpu(tmp_path):
    """On a GPU the quantized kernel runs on one GPU thread, its state and quantization buffers in device memory:
    nvcc compiles it for sm_90 (no GPU here to run it)."""
    quantized = _quantized(_lstm_model("bidirectional", hidden=20, features=7, batch="batch", lengths=True),
                           tmp_path, per_channel=True)
    forge.from_onnx(quantized).compile(target="cuda -arch=sm_90", output_path=tmp_path / "cuda")
    assert (tmp_path / "cuda" / "model_library.so").is_file()


@pytest.mark.parametrize("sums", ["float32", "int32"])
@pytest.mark.parametrize("parallel", [False, True], ids=["one-thread", "parallel"])
def test_dynamic_quantize_lstm_sums_exactly_on_one_thread_or_several(tmp_path, monkeypatch, sums, parallel):
    """The sums of integer products in float32 where they stay below 2**24 (all of these), else in int32 (forced
    here); each block of tiles quantizing the state itself, one thread or a step's tiles shared among threads
    (forced here at 40 hidden units): the same numbers as onnxruntime."""
    from forge_onnx.converters import recurrent, recurrent_kernel

    if sums == "int32":
        monkeypatch.setattr(recurrent, "EXACT_FLOAT_SUMS", 0)
    monkeypatch.setattr(recurrent_kernel, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 40)
    quantized = _quantized(_lstm_model("bidirectional", hidden=40, features=7, seed=5, batch="batch", lengths=True),
                           tmp_path, per_channel=True)
    x = (np.random.default_rng(1).standard_normal((9, 3, 7)) * 2).astype("float32")
    lengths = np.array([5, 7, 2], "int32")
    ir = forge.from_onnx(quantized)
    (kernel,) = [f for f in ir.mod.functions.values() if recurrent_kernel.CELL_ATTR in (f.attrs or {})]
    cell = recurrent_kernel.RecurrentCell.from_json(str(kernel.attrs[recurrent_kernel.CELL_ATTR]))
    assert cell.quantized == sums
    assert recurrent_kernel.KernelOptions.default(cell).parallel == parallel
    ir.compile(output_path=tmp_path / "artifact")
    want = _run(quantized, x, lengths)
    original = _run(_lstm_model("bidirectional", hidden=40, features=7, seed=5, batch="batch", lengths=True),
                    x, lengths)
    for got in (ir.get_inference_function()(x, lengths), forge.Runtime(tmp_path / "artifact").infer(x, lengths)):
        _assert_onnxruntimes(got, want, original)


def test_the_sums_of_a_quantized_product_are_float32_only_below_2_to_the_24():
    from forge_core.errors import OptionError
    from forge_onnx.converters import recurrent, recurrent_kernel

    weights = np.full((1, 8, 4), -127, np.int32)
    assert recurrent.exact_sums_type(weights, 518) == "float32"  # 518 * 255 * 127 < 2**24
    assert recurrent.exact_sums_type(weights, 519) == "int32"
    with pytest.raises(OptionError, match="float32 LSTM"):
        recurrent_kernel.RecurrentCell("gru", 4, 1, 16, (False,), ((),), quantized="float32")
    with pytest.raises(OptionError, match="int32 or float32"):
        recurrent_kernel.RecurrentCell("lstm", 4, 1, 16, (False,), ((),), quantized="int8")


@pytest.mark.parametrize(("dtype", "axis"), [(TensorProto.UINT8, None), (TensorProto.INT8, None),
                                             (TensorProto.INT8, 1), (TensorProto.UINT16, None),
                                             (TensorProto.INT16, 1)])
def test_quantize_and_dequantize_linear_of_the_contrib_domain(dtype, axis):
    """com.microsoft QuantizeLinear/DequantizeLinear (onnxruntime's quantizer writes them for 16-bit types and
    with ``UseQDQContribOps``): per tensor and per channel, round trip and the quantized values themselves."""
    numpy_type = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8, TensorProto.UINT16: np.uint16,
                  TensorProto.INT16: np.int16}[dtype]
    channels = 4
    if axis is None:
        scale, zero = np.array(0.02, np.float32), np.array(3 if dtype in (TensorProto.UINT8, TensorProto.UINT16)
                                                           else -2, numpy_type)
    else:
        scale = (RNG.random(channels) * 0.05 + 0.01).astype(np.float32)
        zero = RNG.integers(-3, 4, channels).astype(numpy_type)
    inits = [nh.from_array(scale, "scale"), nh.from_array(zero, "zero")]
    extra = {"axis": axis} if axis is not None else {}
    nodes = [oh.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], domain="com.microsoft", **extra),
             oh.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], domain="com.microsoft", **extra)]
    x = (RNG.standard_normal((2, channels, 5)) * 2).astype(np.float32)
    graph = oh.make_graph(nodes, "qdq", [VI("x", TensorProto.FLOAT, [2, channels, 5])],
                          [VI("q", dtype, [2, channels, 5]), VI("y", TensorProto.FLOAT, [2, channels, 5])],
                          initializer=inits)
    model = oh.make_model(graph, opset_imports=OPSETS, ir_version=8)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = forge.from_onnx(model).get_inference_function()(x)
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)
