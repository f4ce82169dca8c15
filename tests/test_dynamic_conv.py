"""Convolutions over a dynamic height and width (forge_core/schedules/dynamic_conv.py, and the dynamic path of
forge_core/schedules/conv_transpose.py).

Against their unscheduled form, at sizes that take each path: rows of whole tiles, rows whose last tile is
clamped to the row's end (overlapping the tile before), rows narrower than a tile (the guarded loop), a 1x1 map;
with and without an epilogue, strided, 1x1 and 3x3, odd channel counts; verification mode checks them at bound
sizes. 1x1 convolutions of stride 1 (DynamicPointwiseConv2dNCHW) tile the fused pixel axis, on the host's vector
unit and on AVX2's. Reductions over planes of a dynamic size (DynamicPlaneReduction: means, max, a sum of
squares) at sizes that are whole steps of partial results and not. The same for depthwise and grouped convolutions (DynamicGroupedConv2dNCHW: channel multipliers, 5x5,
stride 2) and transposed convolutions (ConvTransposeNCHW's gather: kernel equal to the stride, overlapping
kernels with padding and output padding, groups, 1D), and max and average pooling (DynamicWindowPoolNCX, 1D and
2D, padded or not, ceil mode, padding excluded from the average). End to end, a detector exported with a dynamic batch,
height and width against onnxruntime; the detector of test_dynamic_shapes.py (a depthwise and a transposed
convolution) runs the same rules at every opt_level there and in test_shape_buckets.py.
"""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

from forge_core.schedules.apply import RULE_ATTR, apply_rules, default_rules
from forge_core.schedules.verify import verify_schedules
from forge_core.targets.isa import runnable_here
from test_row_blocks import _check_sizes, _fused

TARGET = runnable_here(tvm.target.Target.from_device(tvm.cpu()))
SIZES = [(24, 24), (13, 17), (5, 3), (1, 1), (2, 40)]


def _conv(c_in: int, c_out: int, kernel: int, stride: int, epilogue: bool | str, groups: int = 1,
          dynamic_batch: bool = False) -> tirx.PrimFunc:
    """``epilogue``: False, True (bias and clip) or "residual" (bias, a residual add, relu; stride 1)."""
    height, width = tirx.Var("height", "int64"), tirx.Var("width", "int64")
    batch = tirx.Var("batch", "int64") if dynamic_batch else 1
    x = relax.Var("x", relax.TensorType([batch, c_in, height, width], "float32"))
    w = relax.Var("w", relax.TensorType([c_out, c_in // groups, kernel, kernel], "float32"))
    b = relax.Var("b", relax.TensorType([1, c_out, 1, 1], "float32"))
    r = relax.Var("r", relax.TensorType([batch, c_out, height, width], "float32"))

    def build(bb, x, w, b=None, r=None):  # noqa: ANN001, ANN202
        y = relax.op.nn.conv2d(x, w, strides=stride, padding=kernel // 2, groups=groups)
        if epilogue == "residual":
            return relax.op.nn.relu(relax.op.add(relax.op.add(y, b), r))
        return relax.op.clip(relax.op.add(y, b), 0.0, 6.0) if epilogue else y

    return _fused([x, w, b, r] if epilogue == "residual" else [x, w, b] if epilogue else [x, w], build)


def _schedule(func: tirx.PrimFunc, target: tvm.target.Target = TARGET) -> tirx.PrimFunc:
    return apply_rules(tvm.IRModule({"main": func}), target, default_rules())["main"]


# The host's vector unit, and AVX2's (16 registers, 8 lanes), whose code runs on any x86-64 CPU since Haswell.
UNITS = {"host": TARGET, "avx2": tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"})}


CONVS = {
    # name: (c_in, c_out, kernel, stride, epilogue)
    "3x3-bias-clip": (16, 32, 3, 1, True),
    "3x3-no-epilogue": (8, 16, 3, 1, False),
    "3x3-stride-2": (8, 24, 3, 2, True),
    "1x1-stride-2": (32, 16, 1, 2, True),
    "odd-channels": (5, 7, 3, 1, True),  # no whole vector of output channels
    "residual": (16, 24, 3, 1, "residual"),
}


@pytest.mark.parametrize("unit", ["host", "avx2"])
@pytest.mark.parametrize("case", list(CONVS))
def test_a_convolution_over_a_dynamic_height_and_width_computes_its_unscheduled_values(case, unit):
    """On the host's vector unit and on AVX2's (16 registers: tiles of at most 11 accumulators)."""
    target = UNITS[unit]
    if not runnable_here(target).same_as(target):
        pytest.skip("AVX2 code runs on an x86-64 CPU with AVX2 (this host has none)")
    func = _conv(*CONVS[case])
    scheduled = _schedule(func, target)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicConv2dNCHW"
    _check_sizes(func, scheduled, ("height", "width"), SIZES, len(case), target)


@pytest.mark.parametrize("case", ["3x3-bias-clip", "3x3-stride-2"])
def test_a_dynamic_batch_height_and_width_compute_the_unscheduled_values(case):
    func = _conv(*CONVS[case], dynamic_batch=True)
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicConv2dNCHW"
    _check_sizes(func, scheduled, ("batch", "height", "width"), [(3, 13, 17), (2, 5, 3), (1, 24, 24)], 3)


POINTWISE = {
    # name: (c_in, c_out, epilogue, dynamic batch). Tiles: 8 channels x 3 vectors (AVX-512); on AVX2 6 x 2
    # (24 channels) or 4 x 3 (16, 12 channels).
    "bias-clip": (32, 16, True, False),
    "no-epilogue": (8, 24, False, True),
    "residual": (16, 24, "residual", False),
    "odd-input-channels": (7, 12, True, True),
}


@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("case", list(POINTWISE))
def test_a_1x1_convolution_over_a_dynamic_size_tiles_vectors_of_pixels_with_its_unscheduled_values(case, unit):
    """The fused pixel axis (H * W) tiled by channels x pixel vectors, its last tile clamped to the map's end;
    maps of fewer pixels than a tile (1x1, 5x3) take the guarded loop."""
    if not runnable_here(UNITS[unit]).same_as(UNITS[unit]):
        pytest.skip("AVX2 code runs on an x86-64 CPU with AVX2 (this host has none)")
    c_in, c_out, epilogue, dynamic_batch = POINTWISE[case]
    func = _conv(c_in, c_out, 1, 1, epilogue, dynamic_batch=dynamic_batch)
    scheduled = _schedule(func, UNITS[unit])
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicPointwiseConv2dNCHW"
    assert "x_start" in scheduled.script()  # the clamped tile start
    names = ("batch", "height", "width") if dynamic_batch else ("height", "width")
    sizes = [(2, *size) if dynamic_batch else size for size in SIZES]
    _check_sizes(func, scheduled, names, sizes, len(case), UNITS[unit])


def test_the_last_tile_of_a_row_is_clamped_and_unguarded():
    scheduled = _schedule(_conv(16, 32, 3, 1, True))
    script = scheduled.script()
    assert "x_start" in script and "T.min(" in script  # the clamped tile start
    assert "T.where(" in script  # only in the guarded form for rows narrower than a tile


def test_the_clamped_loop_has_its_own_accumulators():
    """Shared with the guarded loop, the tile's accumulators were allocated above both, sized by the dynamic row:
    kept in memory, a store after every multiply-add (twice the static kernel's time in a model)."""
    scheduled = _schedule(_conv(16, 32, 3, 1, True))
    local = [b for b in scheduled.body.block.alloc_buffers if str(b.ty.storage_scope) == "local"]
    assert len(local) == 2
    (branch,) = _branches(scheduled)
    for buffers in (branch.then_case, branch.else_case):
        assert sum(_mentions(buffers, b) for b in local) == 1


def _branches(func: tirx.PrimFunc) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.IfThenElse, found.append), order="pre")
    return found


def _mentions(tree, buffer) -> bool:
    def stop(node):  # noqa: ANN001, ANN202
        return tvm_ffi.VisitInterrupt(node) if node.same_as(buffer) else None

    return tvm_ffi.structural_walk(tree, (tvm.ir.expr.Var, stop), order="pre") is not None


GROUPED = {
    # name: (channels, multiplier, kernel, stride, epilogue, groups (None: depthwise))
    "3x3-clip": (16, 1, 3, 1, True, None),
    "3x3-stride-2": (8, 1, 3, 2, True, None),
    "5x5-no-epilogue": (12, 1, 5, 1, False, None),
    "5x5-stride-2": (12, 1, 5, 2, True, None),
    "multiplier-2": (8, 2, 3, 1, True, None),
    "grouped-4": (16, 1, 3, 1, True, 4),
    "residual": (16, 1, 3, 1, "residual", None),
}


@pytest.mark.parametrize("case", list(GROUPED))
def test_a_depthwise_or_grouped_convolution_over_a_dynamic_size_computes_its_unscheduled_values(case):
    channels, multiplier, kernel, stride, epilogue, groups = GROUPED[case]
    func = _conv(channels, channels * multiplier, kernel, stride, epilogue, groups=groups or channels,
                 dynamic_batch=True)
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicGroupedConv2dNCHW"
    _check_sizes(func, scheduled, ("batch", "height", "width"),
                 [(1, 24, 24), (2, 13, 17), (1, 5, 3), (1, 1, 1), (1, 2, 40)], len(case))


@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("case", ["3x3-stride-2", "5x5-stride-2", "multiplier-2", "3x3-clip"])
def test_a_depthwise_convolution_over_a_dynamic_size_pads_its_input_a_plane_at_a_time(case, unit):
    """The padded input written per (image, channel) plane in the planes' parallel loop, by plain loops (border
    rows, the row's borders, a copy of the row), de-interleaved at stride 2 (``[.., row, parity, column // 2]``,
    an odd padded width rounded up); the host's vector unit and AVX2's, at odd and tiny sizes."""
    if not runnable_here(UNITS[unit]).same_as(UNITS[unit]):
        pytest.skip("AVX2 code runs on an x86-64 CPU with AVX2 (this host has none)")
    channels, multiplier, kernel, stride, epilogue, groups = GROUPED[case]
    func = _conv(channels, channels * multiplier, kernel, stride, epilogue, groups=groups or channels,
                 dynamic_batch=True)
    scheduled = _schedule(func, UNITS[unit])
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicGroupedConv2dNCHW"
    (padded,) = [b for b in scheduled.body.block.alloc_buffers if str(b.name) == "pad_temp"]
    assert len(padded.ty.shape) == (5 if stride == 2 else 4)
    assert "v_image" in scheduled.script()  # the plane's block
    _check_sizes(func, scheduled, ("batch", "height", "width"),
                 [(1, 24, 24), (2, 13, 17), (1, 5, 3), (1, 1, 1), (1, 2, 40), (1, 9, 8)], len(case), UNITS[unit])


def _excitation(c_in: int, c_out: int, activation: str) -> tirx.PrimFunc:
    """A squeeze-and-excite block's second convolution (1x1 on a 1x1 map, with a bias and an activation) fused
    with the product scaling a map of a dynamic batch, height and width."""
    batch, height, width = (tirx.Var(name, "int64") for name in ("batch", "height", "width"))
    s = relax.Var("s", relax.TensorType([batch, c_in, 1, 1], "float32"))
    w = relax.Var("w", relax.TensorType([c_out, c_in, 1, 1], "float32"))
    b = relax.Var("b", relax.TensorType([1, c_out, 1, 1], "float32"))
    x = relax.Var("x", relax.TensorType([batch, c_out, height, width], "float32"))

    def build(bb, s, w, b, x):  # noqa: ANN001, ANN202
        y = relax.op.add(bb.emit(relax.op.nn.conv2d(s, w)), b)
        if activation == "hard-sigmoid":
            y = relax.op.clip(relax.op.add(relax.op.multiply(y, relax.const(1 / 6, "float32")),
                                           relax.const(0.5, "float32")), 0.0, 1.0)
        elif activation == "sigmoid":
            y = relax.op.sigmoid(y)
        return relax.op.multiply(x, y)

    return _fused([s, w, b, x], build)


EXCITATIONS = {
    # name: (c_in, c_out, activation)
    "hard-sigmoid": (64, 240, "hard-sigmoid"),  # MobileNetV3's
    "sigmoid": (16, 40, "sigmoid"),
    "bias-only-odd-channels": (12, 20, "none"),  # no whole vector of channels on AVX-512
}


@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("case", list(EXCITATIONS))
def test_a_squeeze_and_excite_convolution_scaling_a_map_of_a_dynamic_size_computes_its_unscheduled_values(
        case, unit):
    if not runnable_here(UNITS[unit]).same_as(UNITS[unit]):
        pytest.skip("AVX2 code runs on an x86-64 CPU with AVX2 (this host has none)")
    func = _excitation(*EXCITATIONS[case])
    scheduled = _schedule(func, UNITS[unit])
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicExcitationConv2dNCHW"
    assert "meta_schedule.layout_rewrite_preproc" in scheduled.script()  # the weights repacked at compile time
    _check_sizes(func, scheduled, ("batch", "height", "width"), [(1, 40, 40), (2, 13, 17), (3, 1, 1)], len(case),
                 UNITS[unit])


def _transpose(c_in: int, c_out: int, kernel: int, stride: int, padding: int, output_padding: int,
               groups: int = 1, epilogue: bool = True, rank: int = 2) -> tirx.PrimFunc:
    batch = tirx.Var("batch", "int64")
    sizes = [tirx.Var(name, "int64") for name in ("height", "width")[2 - rank:]]
    x = relax.Var("x", relax.TensorType([batch, c_in, *sizes], "float32"))
    w = relax.Var("w", relax.TensorType([c_in, c_out // groups] + [kernel] * rank, "float32"))
    b = relax.Var("b", relax.TensorType([1, c_out] + [1] * rank, "float32"))
    op = relax.op.nn.conv2d_transpose if rank == 2 else relax.op.nn.conv1d_transpose

    def build(bb, x, w, b=None):  # noqa: ANN001, ANN202
        y = op(x, w, strides=stride, padding=padding, output_padding=output_padding, groups=groups)
        return relax.op.nn.relu(relax.op.add(bb.emit(y), b)) if epilogue else y

    return _fused([x, w, b] if epilogue else [x, w], build)


TRANSPOSES = {
    # name: (c_in, c_out, kernel, stride, padding, output_padding, groups, epilogue)
    "2x2-stride-2": (24, 24, 2, 2, 0, 0, 1, True),  # DBNet's heads: one tap a phase, no padded input
    "to-one-channel": (24, 1, 2, 2, 0, 0, 1, False),
    "3x3-stride-2-output-padding": (16, 8, 3, 2, 1, 1, 1, True),
    "4x4-stride-2": (16, 8, 4, 2, 1, 0, 1, False),
    "3x3-stride-1": (8, 12, 3, 1, 1, 0, 1, True),
    "grouped": (16, 16, 4, 4, 0, 0, 2, True),
    "5x5-stride-3": (6, 10, 5, 3, 2, 2, 1, True),
}


@pytest.mark.parametrize("case", list(TRANSPOSES))
def test_a_transposed_convolution_over_a_dynamic_size_computes_its_unscheduled_values(case):
    func = _transpose(*TRANSPOSES[case])
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "ConvTransposeNCHW"
    assert "x_start" in scheduled.script()  # the clamped tile
    _check_sizes(func, scheduled, ("batch", "height", "width"),
                 [(1, 12, 12), (2, 7, 9), (1, 1, 1), (1, 3, 20)], len(case))


@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("case", ["to-one-channel", "grouped"])
def test_a_transposed_convolution_to_few_channels_over_a_dynamic_size_tiles_pixels(case, unit):
    """Fewer output channels than a vector (DBNet's 24->1 head), or groups, over a row of whole stride periods:
    the static rule's pixel tile (channels x phases x vectors of input positions, the accumulators phase-major),
    its last tile of a row clamped. Rows narrower than a tile (guarded), whole tiles (AVX2: 48 pixels, AVX-512:
    128) and a clamped last tile."""
    if not runnable_here(UNITS[unit]).same_as(UNITS[unit]):
        pytest.skip("AVX2 code runs on an x86-64 CPU with AVX2 (this host has none)")
    func = _transpose(*TRANSPOSES[case])
    scheduled = _schedule(func, UNITS[unit])
    assert str(scheduled.attrs[RULE_ATTR]) == "ConvTransposeNCHW"
    script = scheduled.script()
    assert "x_start" in script
    # Phase-major accumulators: [batch, channels, rows, phase, q].
    (local,) = {len(b.ty.shape) for b in scheduled.body.block.alloc_buffers if str(b.ty.storage_scope) == "local"}
    assert local == 5
    _check_sizes(func, scheduled, ("batch", "height", "width"),
                 [(1, 3, 20), (2, 5, 24), (1, 4, 37), (1, 2, 64), (1, 5, 70), (1, 1, 1)], len(case), UNITS[unit])


POOLS = {
    # name: (kind, window, stride, padding, rank, ceil_mode, count_include_pad, epilogue)
    "max-2x2-stride-2": ("max", 2, 2, 0, 2, False, True, False),  # no padded input; the stride folds into x0
    "max-3x3-stride-2-padded": ("max", 3, 2, 1, 2, False, True, False),
    "avg-3x3-padded": ("avg", 3, 1, 1, 2, False, True, False),
    "avg-excluding-padding": ("avg", 3, 1, 1, 2, False, False, False),
    "max-ceil-mode": ("max", 2, 2, 0, 2, True, True, False),
    "max-relu": ("max", 3, 1, 1, 2, False, True, True),
    "max-1d": ("max", 3, 2, 1, 1, False, True, False),
    "avg-1d": ("avg", 2, 2, 0, 1, False, True, False),
}


def _pool(kind: str, window: int, stride: int, padding: int, rank: int, ceil: bool, include_pad: bool,
          epilogue: bool) -> tirx.PrimFunc:
    batch = tirx.Var("batch", "int64")
    sizes = [tirx.Var(name, "int64") for name in ("height", "width")[2 - rank:]]
    x = relax.Var("x", relax.TensorType([batch, 8, *sizes], "float32"))
    ops = {(2, "max"): relax.op.nn.max_pool2d, (2, "avg"): relax.op.nn.avg_pool2d,
           (1, "max"): relax.op.nn.max_pool1d, (1, "avg"): relax.op.nn.avg_pool1d}

    def build(bb, x):  # noqa: ANN001, ANN202
        extra = {} if kind == "max" else {"count_include_pad": include_pad}
        y = ops[rank, kind](x, pool_size=window, strides=stride, padding=padding, ceil_mode=ceil, **extra)
        return relax.op.nn.relu(bb.emit(y)) if epilogue else y

    return _fused([x], build)


@pytest.mark.parametrize("case", list(POOLS))
def test_pooling_over_a_dynamic_size_computes_its_unscheduled_values(case):
    func = _pool(*POOLS[case])
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicWindowPoolNCX"
    if POOLS[case][4] == 2:
        _check_sizes(func, scheduled, ("batch", "height", "width"), [(1, 12, 12), (2, 7, 9), (1, 2, 3), (1, 5, 33)],
                     len(case))
    else:
        _check_sizes(func, scheduled, ("batch", "width"), [(1, 12), (2, 9), (1, 2), (1, 33)], len(case))


def _reduce(kind: str, rank: int, dynamic_batch: bool) -> tirx.PrimFunc:
    """A reduction over the trailing ``rank`` axes of a dynamic size, keeping them (a global pool's form)."""
    dims = [tirx.Var(name, "int64") for name in ("height", "width")[2 - rank:]]
    batch = tirx.Var("batch", "int64") if dynamic_batch else 1
    x = relax.Var("x", relax.TensorType([batch, 24, *dims], "float32"))
    axes = list(range(2, 2 + rank))

    def build(bb, x):  # noqa: ANN001, ANN202
        if kind == "mean":
            return relax.op.mean(x, axis=axes, keepdims=True)
        if kind == "max":
            return relax.op.max(x, axis=axes, keepdims=True)
        return relax.op.sum(relax.op.multiply(x, x), axis=axes, keepdims=True)  # a sum of squares

    return _fused([x], build)


REDUCTIONS = {
    # name: (kind, rank, dynamic batch)
    "mean-2d": ("mean", 2, False),  # a squeeze-and-excite mean, a global average pool
    "max-2d-dynamic-batch": ("max", 2, True),  # a global max pool
    "sum-of-squares-2d": ("squares", 2, False),  # an elementwise producer inlined into the reduction
    "mean-1d": ("mean", 1, True),  # over a dynamic length (a conv1d model's time axis)
}


@pytest.mark.parametrize("case", list(REDUCTIONS))
def test_a_reduction_over_planes_of_a_dynamic_size_computes_its_unscheduled_values(case):
    """Each plane by vectors of partial results, the last step guarded: sizes that are whole steps, not whole
    steps, smaller than a step, a single element."""
    kind, rank, dynamic_batch = REDUCTIONS[case]
    func = _reduce(kind, rank, dynamic_batch)
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicPlaneReduction"
    sizes = [(80, 80), (13, 17), (7, 5), (1, 1), (3, 64)] if rank == 2 else [(64,), (1000,), (37,), (1,)]
    names = ("height", "width") if rank == 2 else ("width",)
    if dynamic_batch:
        names, sizes = ("batch", *names), [(2, *size) for size in sizes]
    _check_sizes(func, scheduled, names, sizes, len(case))


def test_a_1d_transposed_convolution_over_a_dynamic_length():
    func = _transpose(16, 16, 4, 2, 1, 0, rank=1)
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "ConvTransposeNCHW"
    _check_sizes(func, scheduled, ("batch", "width"), [(1, 7), (2, 1), (1, 40)], 1)


@pytest.mark.parametrize("make", [
    lambda: _conv(16, 32, 3, 1, True), lambda: _conv(16, 24, 1, 1, "residual"),
    lambda: _conv(16, 16, 3, 2, True, groups=16),
    lambda: _transpose(24, 24, 2, 2, 0, 0), lambda: _pool(*POOLS["max-3x3-stride-2-padded"]),
    lambda: _reduce("mean", 2, False), lambda: _excitation(16, 40, "hard-sigmoid")],
    ids=["conv", "pointwise", "depthwise", "transposed", "pool", "mean", "excitation"])
def test_verification_mode_checks_it_at_bound_sizes(make):
    before = tvm.IRModule({"main": make()})
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
    assert sum(rule == "DynamicConv2dNCHW" for rule in rules.values()) == 3, rules
    assert sum(rule == "DynamicPointwiseConv2dNCHW" for rule in rules.values()) == 1, rules
    runtime = forge.Runtime(tmp_path / "artifact")
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for size in [(1, 3, 64, 96), (2, 3, 33, 17), (1, 3, 4, 4)]:
        x = rng.standard_normal(size).astype("float32")
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(runtime.infer(x)[0], want, rtol=1e-4, atol=1e-5, err_msg=str(size))


def _squeeze_excite_model():
    """x -> 1x1 conv + ReLU -> squeeze-and-excite (global average pool, 1x1 conv, sigmoid, scale), every dim but
    the channels dynamic, as a detector's backbone block ships."""
    from onnx import TensorProto, helper, numpy_helper

    from model_factory import make_model

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
             for name, shape in (("w1", (24, 16, 1, 1)), ("b1", (24,)), ("w2", (24, 24, 1, 1)), ("b2", (24,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="expand"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["m"], name="squeeze"),
             helper.make_node("Conv", ["m", "w2", "b2"], ["e"], name="excite"),
             helper.make_node("Sigmoid", ["e"], ["g"], name="gate"),
             helper.make_node("Mul", ["r", "g"], ["y"], name="scale")]
    dims = ["batch", 16, "height", "width"]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 24, "height", "width"])],
                      inits)


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
def test_a_squeeze_excite_block_over_a_dynamic_size_matches_onnxruntime_at_every_opt_level(opt_level, tmp_path):
    """The pointwise and plane-reduction rules over a dynamic size in a model, against onnxruntime at sizes whose
    pixel count is whole tiles, not, and below a tile (opt_level 4: fast-math, a few ulps)."""
    import forge

    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference (installed by ./scripts/setup)")
    model = _squeeze_excite_model()
    forge.from_onnx(model).compile(output_path=tmp_path / "a", opt_level=opt_level, export_metadata=True)
    if opt_level == 3:
        rules = json.loads((tmp_path / "a" / "model_metadata.json").read_text())["schedules"]["rules"]
        assert {"DynamicPointwiseConv2dNCHW", "DynamicPlaneReduction"} <= set(rules.values()), rules
    runtime = forge.Runtime(tmp_path / "a")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(opt_level)
    for size in [(1, 16, 32, 40), (2, 16, 13, 17), (1, 16, 3, 5), (1, 16, 1, 1)]:
        x = rng.standard_normal(size).astype("float32")
        (want,) = session.run(None, {"x": x})
        np.testing.assert_allclose(runtime.infer(x)[0], want, rtol=1e-4, atol=1e-5, err_msg=str(size))
