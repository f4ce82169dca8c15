"""Convolutions over a dynamic height and width (forge_core/schedules/dynamic_conv.py).

Against their unscheduled form, at sizes that take each path: rows of whole tiles, rows whose last tile is
clamped to the row's end (overlapping the tile before), rows narrower than a tile (the guarded loop), a 1x1 map;
with and without an epilogue, strided, 1x1 and 3x3, odd channel counts; verification mode checks them at bound
sizes. A depthwise or grouped convolution is not this rule's. End to end, a detector exported with a dynamic batch,
height and width against onnxruntime.
"""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from forge_core.schedules.apply import RULE_ATTR, apply_rules, default_rules
from forge_core.schedules.verify import verify_schedules
from forge_core.targets.isa import runnable_here
from test_row_blocks import _check_sizes, _fused

TARGET = runnable_here(tvm.target.Target.from_device(tvm.cpu()))
SIZES = [(24, 24), (13, 17), (5, 3), (1, 1), (2, 40)]


def _conv(c_in: int, c_out: int, kernel: int, stride: int, epilogue: bool, groups: int = 1,
          dynamic_batch: bool = False) -> tirx.PrimFunc:
    height, width = tirx.Var("height", "int64"), tirx.Var("width", "int64")
    batch = tirx.Var("batch", "int64") if dynamic_batch else 1
    x = relax.Var("x", relax.TensorType([batch, c_in, height, width], "float32"))
    w = relax.Var("w", relax.TensorType([c_out, c_in // groups, kernel, kernel], "float32"))
    b = relax.Var("b", relax.TensorType([1, c_out, 1, 1], "float32"))

    def build(bb, x, w, b=None):  # noqa: ANN001, ANN202
        y = relax.op.nn.conv2d(x, w, strides=stride, padding=kernel // 2, groups=groups)
        return relax.op.clip(relax.op.add(y, b), 0.0, 6.0) if epilogue else y

    return _fused([x, w, b] if epilogue else [x, w], build)


def _schedule(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return apply_rules(tvm.IRModule({"main": func}), TARGET, default_rules())["main"]


CONVS = {
    # name: (c_in, c_out, kernel, stride, epilogue)
    "3x3-bias-clip": (16, 32, 3, 1, True),
    "3x3-no-epilogue": (8, 16, 3, 1, False),
    "3x3-stride-2": (8, 24, 3, 2, True),
    "1x1": (32, 16, 1, 1, True),
    "odd-channels": (5, 7, 3, 1, True),  # no whole vector of output channels
}


@pytest.mark.parametrize("case", list(CONVS))
def test_a_convolution_over_a_dynamic_height_and_width_computes_its_unscheduled_values(case):
    func = _conv(*CONVS[case])
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicConv2dNCHW"
    _check_sizes(func, scheduled, ("height", "width"), SIZES, len(case))


@pytest.mark.parametrize("case", ["3x3-bias-clip", "3x3-stride-2"])
def test_a_dynamic_batch_height_and_width_compute_the_unscheduled_values(case):
    func = _conv(*CONVS[case], dynamic_batch=True)
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicConv2dNCHW"
    _check_sizes(func, scheduled, ("batch", "height", "width"), [(3, 13, 17), (2, 5, 3), (1, 24, 24)], 3)


def test_the_last_tile_of_a_row_is_clamped_and_unguarded():
    scheduled = _schedule(_conv(16, 32, 3, 1, True))
    script = scheduled.script()
    assert "x_start" in script and "T.min(" in script  # the clamped tile start
    assert "T.where(" in script  # only in the guarded form for rows narrower than a tile


def test_a_depthwise_convolution_is_not_this_rules():
    assert str(_schedule(_conv(16, 16, 3, 1, True, groups=16)).attrs[RULE_ATTR]) != "DynamicConv2dNCHW"


def test_verification_mode_checks_it_at_bound_sizes():
    before = tvm.IRModule({"main": _conv(16, 32, 3, 1, True)})
    after = apply_rules(before, TARGET, default_rules())
    report = verify_schedules(before, after, TARGET, "default")
    assert report.verified == ["main"] and not report.skipped


def test_a_detector_with_a_dynamic_height_and_width_matches_onnxruntime(tmp_path):
    import forge

    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference (installed by ./scripts/setup)")
    torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")
    nn = torch.nn
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU6(),
                          nn.Conv2d(32, 24, 1), nn.Conv2d(24, 1, 3, 1, 1), nn.Sigmoid()).eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, 32, 32),), buffer, input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"x": {0: "batch", 2: "height", 3: "width"}})
    forge.from_onnx(buffer.getvalue()).compile(output_path=tmp_path / "artifact", export_metadata=True)
    rules = json.loads((tmp_path / "artifact" / "model_metadata.json").read_text())["schedules"]["rules"]
    assert sum(rule == "DynamicConv2dNCHW" for rule in rules.values()) == 4, rules
    runtime = forge.Runtime(tmp_path / "artifact")
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for size in [(1, 3, 64, 96), (2, 3, 33, 17), (1, 3, 4, 4)]:
        x = rng.standard_normal(size).astype("float32")
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(runtime.infer(x)[0], want, rtol=1e-4, atol=1e-5, err_msg=str(size))
