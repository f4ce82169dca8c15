"""Random-weight ONNX models through Forge match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net, two_io_net

import forge


def ort_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "unfolded"])
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "params"])
def test_conv_bn_net_matches_onnxruntime(fold, freeze):
    model = conv_bn_net(seed=3)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ir = forge.from_onnx(model, freeze_params=freeze, fold_constants=fold, fold_batch_norms=fold)
    (ref,) = ort_run(model, {"x": x})
    np.testing.assert_allclose(ir.get_inference_function()(x), ref, rtol=1e-5, atol=1e-5)


def test_batch_norm_folding_removes_batch_norms_and_keeps_numbers():
    model = conv_bn_net(seed=5)
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    unfolded = forge.from_onnx(model, fold_batch_norms=False)
    folded = forge.from_onnx(model)
    assert unfolded.operators["nn.batch_norm"] == 3
    assert "nn.batch_norm" not in folded.operators
    assert folded.operators["nn.conv2d"] == 3
    np.testing.assert_allclose(
        folded.get_inference_function()(x), unfolded.get_inference_function()(x), rtol=1e-5, atol=1e-5
    )


def test_two_inputs_two_outputs_match_onnxruntime():
    model = two_io_net(seed=7)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 16)).astype(np.float32)
    ids = np.array([0, 5, 19, 3], dtype=np.int64)
    ir = forge.from_onnx(model)
    outs = ir.get_inference_function()(a, ids)
    refs = ort_run(model, {"a": a, "ids": ids})
    assert isinstance(outs, list) and len(outs) == 2
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_dynamic_batch_runs_at_several_sizes(batch):
    model = conv_bn_net(seed=11, batch="N")
    ir = forge.from_onnx(model)
    assert ir.input_shapes == [(-1, 3, 16, 16)]
    x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    (ref,) = ort_run(model, {"x": x})
    np.testing.assert_allclose(ir.get_inference_function()(x), ref, rtol=1e-5, atol=1e-5)


def test_torch_exported_depthwise_network_matches_onnxruntime(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is installed by the test set-up; the model is built with it")
    from torch import nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.expand = nn.Conv2d(c, 4 * c, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(4 * c)
            self.dw = nn.Conv2d(4 * c, 4 * c, 3, padding=1, groups=4 * c, bias=False)
            self.bn2 = nn.BatchNorm2d(4 * c)
            self.project = nn.Conv2d(4 * c, c, 1, bias=False)

        def forward(self, x):
            y = nn.functional.relu6(self.bn1(self.expand(x)))
            y = nn.functional.relu6(self.bn2(self.dw(y)))
            return x + self.project(y)

    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), Block(8), Block(8),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()
    for module in net.modules():  # non-trivial running statistics
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 32, 32)
    path = tmp_path / "mobile.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["image"], output_names=["logits"], opset_version=17,
                      dynamo=False)
    import onnx

    model = onnx.load(str(path))
    ir = forge.from_onnx(path)
    assert ir.input_names == ["image"] and ir.output_names == ["logits"]
    (ref,) = ort_run(model, {"image": x.numpy()})
    np.testing.assert_allclose(ir.get_inference_function()(x.numpy()), ref, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(ref, net(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["Mish", "Softplus"])
def test_softplus_family_keeps_relative_accuracy_in_the_negative_tail(op, tmp_path):
    """log(1 + exp(x)) rounds to 0 (and is 0.1% off near -9) in float32; the
    converters keep ~1e-6 relative accuracy over [-40, 40] on every path."""
    from onnx import TensorProto, helper

    n = 4001
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    x = np.linspace(-40, 40, n).astype("float32")
    x64 = x.astype(np.float64)
    softplus = np.log1p(np.exp(x64))
    exact = x64 * np.tanh(softplus) if op == "Mish" else softplus
    exact[exact == 0] = 0.0

    def relative_error(y):
        nonzero = exact != 0
        assert np.all(y[~nonzero] == 0)
        return float(np.max(np.abs(y[nonzero] - exact[nonzero]) / np.abs(exact[nonzero])))

    assert relative_error(ort_run(model, {"x": x})[0]) < 2e-6
    ir = forge.from_onnx(model)
    out = ir.get_inference_function()(x)
    assert relative_error(np.asarray(out[0] if isinstance(out, (list, tuple)) else out)) < 2e-6
    for opt_level in (0, 3, 4):
        ir.compile(output_path=str(tmp_path / f"o{opt_level}"), opt_level=opt_level)
        assert relative_error(forge.Runtime(str(tmp_path / f"o{opt_level}")).infer(x)[0]) < 2e-6, opt_level


@pytest.mark.parametrize("op", ["Mish", "Softplus"])
@pytest.mark.parametrize("context", ["alone", "conv-bias", "conv-bias-residual"])
def test_softplus_family_in_each_fusion_context_matches_onnxruntime(op, context, tmp_path):
    """As a conv epilogue (with a bias, and before a residual add) or alone, odd sizes, every opt_level."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    shape = [1, 3, 7, 9]
    nodes, inits = [], []
    source = "x"
    if context != "alone":
        inits += [numpy_helper.from_array((rng.standard_normal((3, 3, 3, 3)) * 2).astype(np.float32), "w"),
                  numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")]
        nodes.append(helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]))
        source = "c"
    nodes.append(helper.make_node(op, [source], ["a"]))
    result = "a"
    if context == "conv-bias-residual":
        nodes.append(helper.make_node("Add", ["a", "x"], ["y"]))
        result = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(result, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    x = (rng.standard_normal(shape) * 8).astype(np.float32)  # reaches both tails
    expected = ort_run(model, {"x": x})[0]
    ir = forge.from_onnx(model)
    for opt_level in range(5):
        out = tmp_path / f"o{opt_level}"
        ir.compile(output_path=str(out), opt_level=opt_level)
        got = forge.Runtime(str(out)).infer(x)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=f"opt_level {opt_level}")


@pytest.mark.parametrize("epilogue", ["none", "bias", "bias-relu", "bias-residual", "bias-residual-relu"])
def test_float_conv_with_a_dequantized_residual_matches_onnxruntime(epilogue, tmp_path):
    """Conv2dNCHW inlines the elementwise stages before the convolution that feed only its epilogue (a
    residual read through DequantizeLinear): each epilogue, odd sizes (5 channels, 7x9), every opt_level."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    shape = [1, 5, 7, 9]
    inits = [numpy_helper.from_array((rng.standard_normal((5, 5, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(3, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["rd"]),
             helper.make_node("Conv", ["x", "w", "b"] if epilogue != "none" else ["x", "w"], ["c"],
                              pads=[1, 1, 1, 1])]
    result = "c"
    if "residual" in epilogue:
        nodes.append(helper.make_node("Add", ["c", "rd"], ["a"]))
        result = "a"
    if epilogue.endswith("relu"):
        nodes.append(helper.make_node("Relu", [result], ["y"]))
        result = "y"
    if result == "c":  # the dequantized input must still reach an output
        nodes.append(helper.make_node("Add", ["c", "rd"], ["a"]))
        result = "a"
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "r")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(result, TensorProto.FLOAT, shape)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "r": rng.standard_normal(shape).astype(np.float32)}
    expected = ort_run(model, feeds)[0]
    ir = forge.from_onnx(model)
    for opt_level in range(5):
        out = tmp_path / f"o{opt_level}"
        ir.compile(output_path=str(out), opt_level=opt_level)
        got = forge.Runtime(str(out)).infer(feeds["x"], feeds["r"])[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"opt_level {opt_level}")
