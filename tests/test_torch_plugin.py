"""forge.from_torch against torch itself (rtol 1e-5), every route and option."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")

from torch_models import (  # noqa: E402
    EncoderBlock,
    MobileNetV2Style,
    ResidualCNN,
    TwoInTwoOut,
    WithLogCumSumExp,
    WithRReLU,
    build,
)

import forge  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5


def reference(model, *inputs):
    with torch.no_grad():
        out = model(*inputs)
    return [o.numpy() for o in out] if isinstance(out, tuple) else out.numpy()


def assert_close(got, want, rtol=RTOL, atol=ATOL):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_residual_cnn_with_batch_norm():
    model = build(ResidualCNN, seed=1)
    x = torch.randn(1, 3, 32, 32)
    ir = forge.from_torch(model, [("image", (1, 3, 32, 32))])
    assert ir.input_names == ["image"] and ir.output_names == ["output_0"]
    assert "nn.batch_norm" not in ir.operators and ir.operators["nn.conv2d"] == 3
    assert_close(ir.get_inference_function()(x.numpy()), reference(model, x))


def test_mobilenet_v2_style_depthwise():
    model = build(MobileNetV2Style, seed=2)
    x = torch.randn(1, 3, 64, 64)
    ir = forge.from_torch(model, [("input0", (1, 3, 64, 64))])
    assert_close(ir.get_inference_function()(x.numpy()), reference(model, x))


def test_transformer_encoder_block():
    model = build(EncoderBlock, seed=3)
    x = torch.randn(2, 16, 64)
    ir = forge.from_torch(model, [("tokens", (2, 16, 64))])
    ops = ir.operators
    assert "nn.layer_norm" in ops and "nn.gelu" in ops and "nn.softmax" in ops
    assert_close(ir.get_inference_function()(x.numpy()), reference(model, x), rtol=1e-5, atol=2e-5)


def test_two_inputs_two_outputs():
    model = build(TwoInTwoOut, seed=4)
    features = torch.randn(3, 5, 32)
    ids = torch.randint(0, 50, (3, 5))
    ir = forge.from_torch(model, [("features", (3, 5, 32)), ("ids", ((3, 5), "int64"))])
    assert ir.input_names == ["features", "ids"] and ir.input_dtypes == ["float32", "int64"]
    assert ir.output_count == 2
    assert_close(ir.get_inference_function()(features.numpy(), ids.numpy()), reference(model, features, ids))


def test_names_from_forward_when_only_example_inputs_are_given():
    model = build(TwoInTwoOut, seed=4)
    features, ids = torch.randn(3, 5, 32), torch.randint(0, 50, (3, 5))
    ir = forge.from_torch(model, example_inputs=(features, ids))
    assert ir.input_names == ["features", "ids"]
    assert_close(ir.get_inference_function()(features.numpy(), ids.numpy()), reference(model, features, ids))


@pytest.mark.parametrize("dynamic", [-1, None])
def test_dynamic_batch_at_three_sizes(dynamic):
    model = build(ResidualCNN, seed=5)
    ir = forge.from_torch(model, [("image", (dynamic, 3, 16, 16))])
    assert ir.input_shapes == [(-1, 3, 16, 16)] and ir.output_shapes == [(-1, 10)]
    run = ir.get_inference_function()
    for batch in (1, 3, 8):
        x = torch.randn(batch, 3, 16, 16)
        assert_close(run(x.numpy()), reference(model, x))


def test_exported_program_with_torch_export_dim():
    model = build(EncoderBlock, seed=6)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(2, 16, 64),), dynamic_shapes=({0: batch},))
    ir = forge.from_torch(program)
    assert ir.input_names == ["tokens"] and ir.input_shapes == [(-1, 16, 64)]
    for n in (1, 5):
        x = torch.randn(n, 16, 64)
        assert_close(ir.get_inference_function()(x.numpy()), reference(model, x), rtol=1e-5, atol=2e-5)


def test_torchscript_goes_through_onnx(caplog):
    model = build(ResidualCNN, seed=7)
    x = torch.randn(1, 3, 16, 16)
    traced = torch.jit.trace(model, x)
    with caplog.at_level(logging.INFO, logger="forge.torch"):
        ir = forge.from_torch(traced, [("input0", (1, 3, 16, 16))])
    assert "TorchScript module loaded through ONNX" in caplog.text
    assert ir.input_names == ["input0"]
    assert_close(ir.get_inference_function()(x.numpy()), reference(model, x))


def test_torchscript_with_typed_input_infos_and_dynamic_batch():
    model = build(TwoInTwoOut, seed=8)
    features, ids = torch.randn(2, 5, 32), torch.randint(0, 50, (2, 5))
    traced = torch.jit.trace(model, (features, ids))
    ir = forge.from_torch(traced, [("input0", ((-1, 5, 32), "float")), ("input1", ((-1, 5), "long"))])
    assert ir.input_shapes == [(-1, 5, 32), (-1, 5)] and ir.input_dtypes == ["float32", "int64"]
    f4, i4 = torch.randn(4, 5, 32), torch.randint(0, 50, (4, 5))
    assert_close(ir.get_inference_function()(f4.numpy(), i4.numpy()), reference(model, f4, i4))


def test_fallback_to_onnx_for_an_op_the_direct_importer_lacks(caplog):
    model = build(WithRReLU, seed=9)
    x = torch.randn(2, 3, 8, 8)
    with caplog.at_level(logging.WARNING, logger="forge.torch"):
        ir = forge.from_torch(model, [("x", (2, 3, 8, 8))])
    lines = [r.getMessage() for r in caplog.records if r.name == "forge.torch"]
    assert len(lines) == 1
    assert "loaded through ONNX" in lines[0] and "rrelu_with_noise_functional.default" in lines[0]
    assert "nn.leakyrelu" in ir.operators  # ONNX's LeakyRelu: RReLU in eval mode
    assert_close(ir.get_inference_function()(x.numpy()), reference(model, x))


def test_without_fallback_the_direct_error_is_raised():
    model = build(WithRReLU, seed=9)
    with pytest.raises(forge.UnsupportedOperatorError, match="rrelu_with_noise_functional.default: 1 node"):
        forge.from_torch(model, [("x", (2, 3, 8, 8))], fallback_to_onnx=False)


def test_custom_convert_map_supplies_a_converter():
    from tvm import relax

    def rrelu_eval(node, importer):
        x = importer.env[node.args[0]]
        lower = node.args[2] if len(node.args) > 2 else 1.0 / 8
        upper = node.args[3] if len(node.args) > 3 else 1.0 / 3
        return importer.block_builder.emit(relax.op.nn.leakyrelu(x, (lower + upper) / 2))

    model = build(WithRReLU, seed=10)
    x = torch.randn(2, 3, 8, 8)
    ir = forge.from_torch(model, [("x", (2, 3, 8, 8))],
                          custom_convert_map={"rrelu_with_noise_functional.default": rrelu_eval},
                          fallback_to_onnx=False)
    assert "nn.leakyrelu" in ir.operators
    assert_close(ir.get_inference_function()(x.numpy()), reference(model, x))


def test_both_routes_failing_shows_both_causes_and_the_unsupported_ops():
    model = WithLogCumSumExp().eval()
    with pytest.raises(forge.ModelImportError) as info:
        forge.from_torch(model, [("x", (2, 6))])
    message = str(info.value)
    assert "both routes failed" in message
    assert "torch.export route:" in message and "logcumsumexp.default: 1 node" in message
    assert "erfinv.default: 1 node" in message
    assert "ONNX route:" in message and "aten::logcumsumexp" in message


def test_relay_era_options_warn():
    model = build(ResidualCNN, seed=1)
    with pytest.warns(UserWarning, match="use_parser_friendly_name is not honoured"):
        forge.from_torch(model, [("image", (1, 3, 16, 16))], use_parser_friendly_name=True)
    with pytest.warns(UserWarning, match="keep_quantized_weight is not honoured"):
        forge.from_torch(model, [("image", (1, 3, 16, 16))], keep_quantized_weight=True)


def test_errors_name_the_problem():
    model = build(ResidualCNN, seed=1)
    with pytest.raises(forge.ModelImportError, match="needs input_infos"):
        forge.from_torch(model)
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        forge.from_torch("model.pt", [("x", (1,))])
    with pytest.raises(forge.ModelImportError, match="Unknown dtype 'complex7'"):
        forge.from_torch(model, [("image", ((1, 3, 16, 16), "complex7"))])
    with pytest.raises(forge.ModelImportError, match=r"input_infos\[0\] is 'image'"):
        forge.from_torch(model, ["image"])


def test_compiled_torch_model_runs_in_the_runtime(tmp_path):
    model = build(MobileNetV2Style, seed=11)
    x = torch.randn(1, 3, 32, 32)
    forge.from_torch(model, [("input0", (1, 3, 32, 32))]).compile(output_path=tmp_path / "m")
    (y,) = forge.Runtime(tmp_path / "m").infer(x.numpy())
    assert_close(y, reference(model, x))


def test_an_integer_clamp_with_one_bound_loads_and_clamps():
    """``ids.clamp(min=0)`` and ``ids.clamp(max=...)`` of an int64 tensor: TVM's converter wrote the absent bound
    as infinity and the import failed ("Cannot convert infinity to BigInt"); a float clamp keeps its bounds."""

    class Clamps(torch.nn.Module):
        def forward(self, ids: torch.Tensor, x: torch.Tensor):
            return ids.clamp(min=0) * 3 + ids.clamp(max=5), x.clamp(min=-0.5), ids.to(torch.int32).clamp(2, 7)

    module = Clamps().eval()
    ids = torch.tensor([[-9, -1, 0, 3, 6, 2 ** 40]], dtype=torch.int64)
    x = torch.randn(1, 6, generator=torch.Generator().manual_seed(2))
    ir = forge.from_torch(module, [("ids", ((1, 6), "int64")), ("x", ((1, 6), "float32"))])
    got = ir.get_inference_function()(ids.numpy(), x.numpy())
    want = reference(module, ids, x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
