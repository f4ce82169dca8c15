"""The flat-grid depthwise rule (issue 14): byte-writing depthwise layers computed on the padded plane's grid.

Each case is a quantized depthwise layer as the integer lowering leaves it
(uint8 or int8 input, float weights, a float accumulator, a requantizing
epilogue), built by Forge's pipeline with verification mode on and compared
with TVM's unscheduled build of the same module, element for element, and
with a float64 numpy reference within one quantization step. The cases cover
the shapes the rule takes (rows of 7, 13, 14, 28 and 56, kernels 2, 3 and
5, symmetric, one-sided and no padding, dilation 2, a channel multiplier of 2,
uint8 and int8 outputs, with and without the activation's clip) and the ones
it leaves to the row rule (stride 2, rows of whole vectors, a float output, a
residual add read per pixel, two channels per group, a plane too large for
the stack).

Whole quantized models with these layers (onnxruntime's QDQ MobileNet blocks
and conv net) are compared with onnxruntime's int8 at each opt_level in
``tests/test_int8_kernels.py``. Speed is measured in
``benchmarks/int8_speed.py``, never asserted here.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from forge_core.compiler.pipeline import build
from forge_core.targets.parsing import resolve_target

TARGET = resolve_target({"kind": "llvm", "num-cores": 2})  # this CPU, with the extensions it really has
SCALE, ZERO_POINT = 0.05, 3


def _depthwise(channels: int, size: int, kernel: int, padding, *, batch: int = 1, dilation: int = 1,
               multiplier: int = 1, stride: int = 1, groups: int | None = None, data_dtype: str = "uint8",
               out_dtype: str | None = "uint8", clip: bool = True, residual: bool = False, seed: int = 0):
    """A depthwise layer as the integer lowering leaves it, and its inputs."""
    rng = np.random.default_rng(seed)
    groups = groups or channels
    out_channels = channels * multiplier
    weight = rng.normal(0, 0.01, (out_channels, channels // groups, kernel, kernel)).astype(np.float32)
    bias = rng.normal(0, 1, (out_channels, 1, 1)).astype(np.float32)
    low, high = (0, 255) if data_dtype == "uint8" else (-128, 127)
    data = rng.integers(low, high + 1, (batch, channels, size, size)).astype(data_dtype)
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType(data.shape, data_dtype))
    inputs = [data]
    params = [x]
    with bb.function("main", params):
        with bb.dataflow():
            acc = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=stride, padding=padding,
                                             dilation=dilation, groups=groups, out_dtype="float32"))
            value = bb.emit(relax.op.add(acc, relax.const(bias)))
            if clip:
                value = bb.emit(relax.op.clip(value, 0, 6))
            if residual:
                shape = [batch, out_channels, size, size]  # its case keeps the plane's size
                side = relax.Var("residual", relax.TensorType(shape, "uint8"))
                params.append(side)
                inputs.append(rng.integers(0, 256, shape).astype(np.uint8))
                value = bb.emit(relax.op.add(value, relax.op.astype(side, "float32")))
            if out_dtype is not None:
                value = bb.emit(relax.op.quantize(value, relax.const(SCALE, "float32"),
                                                  relax.const(np.array(ZERO_POINT, out_dtype)), out_dtype=out_dtype))
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get(), inputs, (weight, bias)


def _build(mod: tvm.IRModule, inputs: list[np.ndarray], *, forge_build: bool) -> tuple[np.ndarray, set[str]]:
    schedules: dict = {}
    executable = build(mod, TARGET, 3, schedules=schedules) if forge_build else tvm.compile(mod, target=TARGET)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    return out, set(schedules.get("rules", {}).values())


def _numpy_reference(data: np.ndarray, weight: np.ndarray, bias: np.ndarray, padding, stride: int, dilation: int,
                     out_dtype: str, clip: bool) -> np.ndarray:
    top, left, bottom, right = padding if len(padding) == 4 else (*padding, *padding)
    x = np.pad(data.astype(np.float64), [(0, 0), (0, 0), (top, bottom), (left, right)])
    out_channels, _, kernel, _ = weight.shape
    multiplier = out_channels // data.shape[1]
    x = np.repeat(x, multiplier, axis=1)
    span = dilation * (kernel - 1)
    height, width = (x.shape[2] - span - 1) // stride + 1, (x.shape[3] - span - 1) // stride + 1
    acc = np.zeros((data.shape[0], out_channels, height, width))
    for ry in range(kernel):
        for rx in range(kernel):
            tap = weight[:, 0, ry, rx].astype(np.float64)[None, :, None, None]
            rows = slice(ry * dilation, ry * dilation + stride * (height - 1) + 1, stride)
            columns = slice(rx * dilation, rx * dilation + stride * (width - 1) + 1, stride)
            acc += x[:, :, rows, columns] * tap
    value = acc + bias[None]
    if clip:
        value = np.clip(value, 0, 6)
    info = np.iinfo(out_dtype)
    return np.clip(np.round(value / SCALE) + ZERO_POINT, info.min, info.max)


TAKEN = {
    "7x7 (MobileNetV2)": dict(channels=24, size=7, kernel=3, padding=(1, 1)),
    "14x14 without the activation's clip": dict(channels=16, size=14, kernel=3, padding=(1, 1), clip=False),
    "28x28": dict(channels=8, size=28, kernel=3, padding=(1, 1)),
    "52x52 (rows of whole AVX2 vectors, 56, take the row rule there)": dict(channels=4, size=52, kernel=3,
                                                                           padding=(1, 1)),
    "odd rows, 5x5 kernel": dict(channels=6, size=13, kernel=5, padding=(2, 2)),
    "dilation 2, int8 in and out": dict(channels=5, size=9, kernel=3, padding=(2, 2), dilation=2, data_dtype="int8",
                                        out_dtype="int8", clip=False),
    "channel multiplier 2": dict(channels=4, size=10, kernel=3, padding=(1, 1), multiplier=2),
    "a batch of 3": dict(channels=4, size=7, kernel=3, padding=(1, 1), batch=3),
    "padding after only (SAME, even kernel), int8 out": dict(channels=3, size=11, kernel=2, padding=(0, 0, 1, 1),
                                                            out_dtype="int8"),
    "padding before only": dict(channels=3, size=12, kernel=2, padding=(1, 1, 0, 0)),
    "no padding (the plane a plain copy)": dict(channels=4, size=9, kernel=3, padding=(0, 0)),
}


@pytest.mark.parametrize("name", list(TAKEN))
def test_flat_depthwise_is_exact_against_tvms_unscheduled_build_and_numpy(name):
    case = TAKEN[name]
    mod, inputs, (weight, bias) = _depthwise(**case)
    got, rules = _build(mod, inputs, forge_build=True)
    assert rules == {"FlatDepthwiseNCHW"}, rules
    plain, _ = _build(mod, inputs, forge_build=False)
    out_dtype = case.get("out_dtype", "uint8")
    assert got.dtype == np.dtype(out_dtype) and got.shape == plain.shape
    np.testing.assert_array_equal(got, plain)
    expected = _numpy_reference(inputs[0], weight, bias, case["padding"], case.get("stride", 1),
                                case.get("dilation", 1), out_dtype, case.get("clip", True))
    steps = np.abs(got.astype(np.int64) - expected)
    assert steps.max() <= 1 and np.count_nonzero(steps) <= max(1, got.size // 1000), (steps.max(),
                                                                                        np.count_nonzero(steps))
    assert len(np.unique(got)) > 16  # the inputs exercise the range, not one clipped value


DECLINED = {
    "stride 2": dict(channels=8, size=14, kernel=3, padding=(1, 1), stride=2),
    "rows of a whole vector": dict(channels=8, size=16, kernel=3, padding=(1, 1)),
    "float output": dict(channels=8, size=14, kernel=3, padding=(1, 1), out_dtype=None),
    "residual read per pixel": dict(channels=8, size=14, kernel=3, padding=(1, 1), residual=True),
    "two channels per group": dict(channels=8, size=14, kernel=3, padding=(1, 1), groups=4),
    "a plane too large for the stack": dict(channels=2, size=70, kernel=3, padding=(1, 1)),
}


@pytest.mark.parametrize("name", list(DECLINED))
def test_shapes_the_flat_rule_declines_go_to_the_row_rule_and_stay_exact(name):
    mod, inputs, _ = _depthwise(**DECLINED[name])
    got, rules = _build(mod, inputs, forge_build=True)
    assert "FlatDepthwiseNCHW" not in rules and "GroupedConv2dNCHW" in rules, rules
    plain, _ = _build(mod, inputs, forge_build=False)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, plain)
