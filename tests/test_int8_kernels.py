"""Integer kernels (issue 14): the VNNI rules bit-exact, and quantized models computed in integers.

* Kernels: uint8 x int8 -> int32 convolutions and dense layers, with each
  epilogue (none, int32 bias, the requantizing float epilogue with relu, and
  with a residual add), odd sizes, and shapes the VNNI rules decline, built
  by Forge's pipeline and compared with a numpy int64 reference (integer
  outputs) and with TVM's unscheduled build (float epilogues), bit for bit.
* The assembly holds ``vpdpbusd`` on a VNNI target and not on an AVX-512
  target without VNNI, whose results stay exact.
* Whole quantized models (a conv net with a residual, a depthwise and a
  strided convolution and a dense layer; a BERT encoder from transformers)
  computed in integers against the fake-quantized inference function.

Speed is measured in benchmarks/int8_speed.py, never asserted here.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import forge
from cpu_features import VNNI, can_run, needs_vnni, requires_isa

# Whole models in integers: VNNI's vpdpbusd where the CPU has it, else AVX2's vpmaddwd (the same rules).
needs_integer_kernels = requires_isa("avx2", "fma", why="to run the integer kernels (vpmaddwd or vpdpbusd) on")
from model_factory import export_torch, onnxruntime_int8_references, onnxruntime_quantized
from forge_core.compiler.pipeline import build
from forge_core.schedules.int8 import has_vnni
from forge_core.targets.parsing import resolve_target

NO_VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
HOST_VNNI = has_vnni(resolve_target({"kind": "llvm"}))  # this CPU's target takes the integer (VNNI) rules
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})  # compiled for, never run here
RNG = np.random.default_rng(14)


@pytest.fixture(autouse=True)
def integer_kernels_on_every_host(monkeypatch):
    """These tests check the integer kernels' numbers on whatever CPU runs them: without a byte dot product
    (AVX2) Forge computes quantized models in float32 by default, faster there, so ask for integers. The tests
    of that default set ``auto`` themselves."""
    monkeypatch.setenv("FORGE_INT8_LOWERING", "integer")


def _bias(channels: int, channel_shape: list[int]) -> np.ndarray:
    """The int32 bias :func:`_epilogue` adds (seeded by the channel count, so references can rebuild it)."""
    return np.random.default_rng(channels).integers(-5000, 5000, channel_shape).astype(np.int32)


def _epilogue(bb: relax.BlockBuilder, acc: relax.Expr, kind: str, channels: int, channel_shape: list[int],
              residual: relax.Expr | None) -> relax.Expr:
    if kind == "none":
        return acc
    acc = bb.emit(relax.op.add(acc, relax.const(_bias(channels, channel_shape))))
    if kind == "bias":
        return acc
    scale = (RNG.uniform(0.5, 2.0, channel_shape) * 1e-4).astype(np.float32)
    value = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale)))
    value = bb.emit(relax.op.nn.relu(value))
    if kind == "residual":
        assert residual is not None
        value = bb.emit(relax.op.add(value, relax.op.dequantize(residual, relax.const(0.01, "float32"),
                                                                relax.const(np.uint8(7)), out_dtype="float32")))
    return bb.emit(relax.op.quantize(value, relax.const(0.02, "float32"), relax.const(np.uint8(3)),
                                     out_dtype="uint8"))


def _module(op: str, data_shape, weight: np.ndarray, kind: str, out_shape, **attrs) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(data_shape, "uint8"))
    residual = relax.Var("residual", relax.TensorType(out_shape, "uint8"))
    params = [data, residual] if kind == "residual" else [data]
    with bb.function("main", params):
        with bb.dataflow():
            if op == "conv2d":
                acc = bb.emit(relax.op.nn.conv2d(data, relax.const(weight), out_dtype="int32", **attrs))
                channels, channel_shape = weight.shape[0], [weight.shape[0], 1, 1]
            else:
                acc = bb.emit(relax.op.matmul(data, relax.const(weight), out_dtype="int32"))
                channels, channel_shape = weight.shape[1], [weight.shape[1]]
            out = bb.emit_output(_epilogue(bb, acc, kind, channels, channel_shape, residual))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, target: tvm.target.Target, inputs: list[np.ndarray], *, forge_build: bool):
    schedules: dict = {}
    if forge_build:
        executable = build(mod, target, 3, schedules=schedules)
    else:
        executable = tvm.compile(mod, target=target)  # legalized only: plain loops, the reference
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    return out, set(schedules.get("rules", {}).values()), executable


def _reference_conv(data: np.ndarray, weight: np.ndarray, stride: int, padding: int) -> np.ndarray:
    x = np.pad(data.astype(np.int64), [(0, 0), (0, 0), (padding, padding), (padding, padding)])
    f, c, kh, kw = weight.shape
    n, _, h, w = x.shape
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((n, f, oh, ow), np.int64)
    for ry in range(kh):
        for rx in range(kw):
            window = x[:, :, ry:ry + stride * oh:stride, rx:rx + stride * ow:stride]
            out += np.einsum("nchw,fc->nfhw", window, weight[:, :, ry, rx].astype(np.int64))
    return out


def _rules_of(mod, target):
    """Build only (for a target this CPU may not run): ``(rules, executable)``."""
    schedules: dict = {}
    executable = build(mod, target, 3, schedules=schedules)
    return set(schedules.get("rules", {}).values()), executable


def _check_rule(rules, rule):
    if rule is not None:
        assert rule in rules, rules
    else:
        assert not {"Int8Conv2dNCHW", "Int8PointwiseConv2dNCHW", "Int8Matmul"} & rules, rules


def _check(mod, inputs, reference, kind, rule, target=VNNI, run=True):
    """Integer outputs against numpy's int64 products; float epilogues against TVM's unscheduled build.

    With ``run=False`` (a target this CPU cannot execute) only the schedule rule is checked.
    """
    if not run:
        rules, executable = _rules_of(mod, target)
        _check_rule(rules, rule)
        return executable
    got, rules, executable = _run(mod, target, inputs, forge_build=True)
    if kind in ("none", "bias"):
        np.testing.assert_array_equal(got, reference)
    else:
        plain, _, _ = _run(mod, target, inputs, forge_build=False)
        # The float epilogue: LLVM may contract a residual's multiply-add into an FMA in one build and not
        # the other, which moves a value lying on a rounding tie by one step (1 of 225,792 in the largest case).
        steps = np.abs(got.astype(np.int64) - plain.astype(np.int64))
        assert steps.max() <= 1 and np.count_nonzero(steps) <= max(1, got.size // 10_000), \
            (steps.max(), np.count_nonzero(steps))
    _check_rule(rules, rule)
    return executable


CONV_CASES = [
    # (C, F, H, W, kernel, stride, padding, rule)
    (4, 16, 9, 9, 3, 1, 0, "Int8Conv2dNCHW"),
    (12, 48, 7, 13, 3, 2, 1, "Int8Conv2dNCHW"),
    (8, 32, 7, 7, 1, 1, 0, "Int8Conv2dNCHW"),  # two vectors of output channels
    (4, 32, 15, 15, 7, 2, 3, "Int8Conv2dNCHW"),  # a stem: 7x7 stride 2
    (6, 16, 5, 5, 3, 1, 1, None),  # input channels not a multiple of 4: the generic rule
    (8, 24, 6, 6, 1, 1, 0, "Int8Conv2dNCHW"),  # 24 output channels: 8-lane (256-bit) accumulators
    (8, 20, 6, 6, 1, 1, 0, None),  # output channels not a multiple of 8: the generic rule
    # 1x1, stride 1, 16 | H*W: pixels as lanes.
    (16, 24, 8, 8, 1, 1, 0, "Int8PointwiseConv2dNCHW"),  # 2 vectors of pixels x 12 channels
    (12, 20, 6, 8, 1, 1, 0, "Int8PointwiseConv2dNCHW"),  # 48 pixels: one vector; 20 channels, no 8 | F needed
    (24, 144, 28, 28, 1, 1, 0, "Int8PointwiseConv2dNCHW"),  # MobileNetV2's expansion; rows of 28 straddled
    (4, 16, 4, 12, 1, 1, 0, "Int8PointwiseConv2dNCHW"),  # one group of 4 input channels
    (8, 16, 8, 8, 1, 2, 0, "Int8Conv2dNCHW"),  # stride 2: channel lanes
    (6, 16, 8, 8, 1, 1, 0, None),  # 4 does not divide C: the generic rule
    # The input repack as vector interleaves of 16, 8, 14, 4, 7 or 2 pixels (the first dividing W), else a loop.
    (8, 32, 4, 16, 1, 1, 0, "Int8PointwiseConv2dNCHW"),  # 16 pixels
    (8, 32, 5, 16, 3, 1, 0, "Int8Conv2dNCHW"),  # unpadded 3x3 on rows of 16
    (12, 16, 14, 14, 1, 1, 0, "Int8Conv2dNCHW"),  # rows of 14: one interleave a row, 196 pixels
    (4, 16, 9, 26, 3, 2, 0, "Int8Conv2dNCHW"),  # a stem's pre-padded input (226 wide in MobileNetV2): 2 pixels
    (4, 16, 7, 15, 3, 1, 0, "Int8Conv2dNCHW"),  # odd rows: the repack stays a loop
]


@needs_vnni
@pytest.mark.parametrize("kind", ["none", "bias", "requantize", "residual"])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"c{c[0]}f{c[1]}_{c[2]}x{c[3]}_k{c[4]}s{c[5]}p{c[6]}")
def test_int8_conv2d_is_bit_exact_in_every_epilogue(case, kind):
    channels_in, channels_out, height, width, k, stride, padding, rule = case
    data = RNG.integers(0, 256, (2, channels_in, height, width)).astype(np.uint8)
    weight = RNG.integers(-128, 128, (channels_out, channels_in, k, k)).astype(np.int8)
    reference = _reference_conv(data, weight, stride, padding)
    mod = _module("conv2d", data.shape, weight, kind, reference.shape, strides=stride, padding=padding)
    residual = RNG.integers(0, 256, reference.shape).astype(np.uint8)
    inputs = [data, residual] if kind == "residual" else [data]
    _check(mod, inputs, reference + (_bias(channels_out, [channels_out, 1, 1]) if kind == "bias" else 0), kind, rule)


MATMUL_CASES = [
    # (batch dims + rows, K, N, rule)
    ((1, 64), 64, 16, "Int8Matmul"),
    ((5, 388), 388, 48, "Int8Matmul"),
    ((2, 7, 96), 96, 96, "Int8Matmul"),
    ((3, 64), 64, 40, "Int8Matmul"),  # 8-lane accumulators
    ((3, 64), 64, 36, None),  # N not a multiple of 8: the generic rule
    ((2, 1040, 516), 516, 48, "Int8Matmul"),  # 536 KB of activations: two row blocks (blocks.ROW_BLOCK_BYTES)
]


@needs_vnni
@pytest.mark.parametrize("kind", ["none", "bias", "requantize"])
@pytest.mark.parametrize("case", MATMUL_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}_n{c[2]}")
def test_int8_matmul_is_bit_exact_in_every_epilogue(case, kind):
    shape, depth, columns, rule = case
    data = RNG.integers(0, 256, shape).astype(np.uint8)
    weight = RNG.integers(-128, 128, (depth, columns)).astype(np.int8)
    reference = data.astype(np.int64) @ weight.astype(np.int64)
    mod = _module("matmul", data.shape, weight, kind, reference.shape)
    _check(mod, [data], reference + (_bias(columns, [columns]) if kind == "bias" else 0), kind, rule)


def _asm(executable: relax.VMExecutable) -> str:
    """The kernels' assembly (the VM executable imports one LLVM module)."""
    return "\n".join(m.inspect_source("asm") for m in executable.mod.imports if m.kind == "llvm")


def _vnni_case():
    data = np.random.default_rng(187).integers(0, 256, (1, 8, 6, 6)).astype(np.uint8)
    weight = np.random.default_rng(188).integers(-128, 128, (32, 8, 3, 3)).astype(np.int8)
    reference = _reference_conv(data, weight, 1, 1)
    return data, reference, _module("conv2d", data.shape, weight, "none", reference.shape, padding=1)


def test_vnni_target_emits_vpdpbusd_and_a_target_without_vnni_does_not():
    """Compiled only, on any host: the assembly of each target."""
    assert has_vnni(VNNI) and not has_vnni(NO_VNNI)
    _, _, mod = _vnni_case()
    assert "vpdpbusd" in _asm(build(mod, VNNI, 3))
    assert "vpdpbusd" not in _asm(build(mod, NO_VNNI, 3))


@requires_isa("avx512f", "avx512bw", "avx512dq", "avx512vl", why="to run Skylake-SP (AVX-512 without VNNI) code on")
def test_a_target_with_avx512_and_without_vnni_stays_exact():
    data, reference, mod = _vnni_case()
    fallback = build(mod, NO_VNNI, 3)
    got = relax.VirtualMachine(fallback, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize("op,case", [("conv2d", case) for case in CONV_CASES] + [("matmul", case) for case in MATMUL_CASES],
                         ids=lambda c: c if isinstance(c, str) else "x".join(str(v) for v in c[:-1]).replace(" ", ""))
def test_vnni_rules_are_chosen_for_an_avx512_vnni_target_on_any_host(op, case):
    """Compiled only for Zen 4 (AVX-512 VNNI), so the rule choice stays covered where the kernels cannot run:
    each case takes the rule the bit-exact tests above expect, with 512- or 256-bit ``vpdpbusd`` when it is an
    integer rule."""
    if op == "conv2d":
        channels_in, channels_out, height, width, k, stride, padding, rule = case
        weight = RNG.integers(-128, 128, (channels_out, channels_in, k, k)).astype(np.int8)
        oh, ow = (height + 2 * padding - k) // stride + 1, (width + 2 * padding - k) // stride + 1
        mod = _module("conv2d", (2, channels_in, height, width), weight, "requantize", (2, channels_out, oh, ow),
                      strides=stride, padding=padding)
    else:
        shape, depth, columns, rule = case
        weight = RNG.integers(-128, 128, (depth, columns)).astype(np.int8)
        mod = _module("matmul", shape, weight, "requantize", (*shape[:-1], columns))
    rules, executable = _rules_of(mod, ZEN4)
    _check_rule(rules, rule)
    asm = _asm(executable)
    assert ("vpdpbusd" in asm) == (rule is not None)


AVX_VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "alderlake", "num-cores": 2})  # AVX-VNNI, no AVX-512


@pytest.mark.parametrize("op,case", [
    ("conv2d", (8, 24, 9, 11, 3, 1, 1, "Int8Conv2dNCHW")),  # 3 vectors of 8 lanes
    ("conv2d", (12, 16, 16, 16, 1, 1, 0, "Int8Conv2dNCHW")),  # no pixel lanes without 16-lane accumulators
    ("conv2d", (8, 20, 6, 6, 1, 1, 0, None)),  # 8 does not divide F: the generic rule
    ("matmul", ((33, 64), 64, 40, "Int8Matmul")),  # 33 rows: a tile of 11
    ("matmul", ((2, 7, 96), 96, 96, "Int8Matmul")),
], ids=lambda c: c if isinstance(c, str) else "x".join(str(v) for v in c[:-1]).replace(" ", ""))
@pytest.mark.parametrize("kind", ["none", "requantize"])
def test_avx_vnni_target_without_avx512_uses_256_bit_vpdpbusd_and_is_bit_exact(op, case, kind):
    """Alder Lake and later cores without AVX-512 (AVX-VNNI): 8-lane ``vpdpbusd`` on ymm registers only.

    The assembly is checked on any host; the kernels run (bit-exact) where this CPU has AVX-VNNI."""
    assert has_vnni(AVX_VNNI)
    if op == "conv2d":
        channels_in, channels_out, height, width, k, stride, padding, rule = case
        data = RNG.integers(0, 256, (2, channels_in, height, width)).astype(np.uint8)
        weight = RNG.integers(-128, 128, (channels_out, channels_in, k, k)).astype(np.int8)
        reference = _reference_conv(data, weight, stride, padding)
        mod = _module("conv2d", data.shape, weight, kind, reference.shape, strides=stride, padding=padding)
    else:
        shape, depth, columns, rule = case
        data = RNG.integers(0, 256, shape).astype(np.uint8)
        weight = RNG.integers(-128, 128, (depth, columns)).astype(np.int8)
        reference = data.astype(np.int64) @ weight.astype(np.int64)
        mod = _module("matmul", data.shape, weight, kind, reference.shape)
    executable = _check(mod, [data], reference, kind, rule, target=AVX_VNNI,
                        run=can_run(AVX_VNNI))
    asm = _asm(executable)
    assert "zmm" not in asm, "AVX-512 code for a target without it"
    if rule is not None:
        assert "vpdpbusd" in asm and "ymm" in asm


WIDENED = {  # x86 without a byte dot product: operands widened to int16 pairs, vpmaddwd
    "x86-64-v3": tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2}),  # AVX2 + FMA
    "skylake-avx512": NO_VNNI,  # AVX-512 without VNNI
}


WIDENED_CASES = [
    ("conv2d", (8, 24, 9, 11, 3, 1, 1, "Int8Conv2dNCHW")),  # 3 vectors of 8 lanes (AVX-512: 8 lanes too)
    ("conv2d", (12, 32, 16, 16, 1, 1, 0, "Int8PointwiseConv2dNCHW")),  # a 1x1: pixels as lanes
    ("conv2d", (16, 24, 7, 7, 1, 1, 0, "Int8Conv2dNCHW")),  # a 1x1 over 49 pixels: channel lanes
    ("conv2d", (32, 64, 14, 14, 3, 2, 1, "Int8Conv2dNCHW")),  # strided; 2 vectors of 16 (AVX-512) or of 8
    ("conv2d", (4, 16, 7, 7, 3, 1, 1, "Int8Conv2dNCHW")),  # 4 input channels (a padded RGB stem), rows of 7
    ("conv2d", (8, 20, 6, 6, 1, 1, 0, None)),  # 8 does not divide F: the generic rule
    ("matmul", ((33, 64), 64, 40, "Int8Matmul")),  # 33 rows: a tile of 11
    ("matmul", ((2, 7, 96), 96, 96, "Int8Matmul")),
    ("matmul", ((300, 1000), 1000, 24, "Int8Matmul")),  # 600 KB widened: two row blocks of 150
]


def test_a_matmul_whose_activations_outgrow_l2_is_cut_into_row_blocks():
    """The row blocks of the cases above: each weight panel is loaded once a block, the block's activations
    within ``ROW_BLOCK_BYTES``, and every block a whole number of register tiles."""
    from forge_core.schedules.blocks import ROW_BLOCK_BYTES, row_block as _row_block

    assert _row_block(1040, 13, 516) == 520 and 520 * 516 <= ROW_BLOCK_BYTES < 1040 * 516
    assert _row_block(300, 6, 2000) == 150
    assert _row_block(128, 4, 768) == 128 and _row_block(128, 4, 3072) == 128  # BERT-6: one block
    assert _row_block(7, 7, 10**7) == 7  # a tile's rows at least


@pytest.mark.parametrize("op,case,kind", [
    (op, case, kind) for op, case in WIDENED_CASES
    for kind in (("none", "requantize", "residual") if op == "conv2d" else ("none", "bias", "requantize"))],
    ids=lambda c: c if isinstance(c, str) else "x".join(str(v) for v in c[:-1]).replace(" ", ""))
@pytest.mark.parametrize("cpu", list(WIDENED))
def test_x86_without_vnni_widens_to_int16_pairs_on_vpmaddwd_and_is_bit_exact(cpu, op, case, kind):
    """AVX2 (and AVX-512 without VNNI): int8 weights held as int16 by the lowering, uint8 activations widened
    to int16 as they are repacked, ``vpmaddwd`` (no saturation, unlike ``pmaddubsw``) into int32 accumulators: bit-exact in every
    epilogue, on every host that runs the class (the assembly is checked on any host)."""
    target = WIDENED[cpu]
    if op == "conv2d":
        channels_in, channels_out, height, width, k, stride, padding, rule = case
        data = RNG.integers(0, 256, (2, channels_in, height, width)).astype(np.uint8)
        weight = RNG.integers(-128, 128, (channels_out, channels_in, k, k)).astype(np.int8)
        weight[0, 0] = -128  # the widest products: 255 x -128 in every pair of the first channel's first row
        data[0, 0] = 255
        reference = _reference_conv(data, weight, stride, padding)
        # held as int16, as the lowering holds them for this class (the same values)
        mod = _module("conv2d", data.shape, weight.astype(np.int16), kind, reference.shape, strides=stride,
                      padding=padding)
    else:
        shape, depth, columns, rule = case
        data = RNG.integers(0, 256, shape).astype(np.uint8)
        weight = RNG.integers(-128, 128, (depth, columns)).astype(np.int8)
        weight[:, 0] = -128
        data[..., 0, :] = 255
        reference = data.astype(np.int64) @ weight.astype(np.int64)
        mod = _module("matmul", data.shape, weight.astype(np.int16), kind, reference.shape)
    inputs = [data] if kind != "residual" else [data, RNG.integers(0, 256, reference.shape).astype(np.uint8)]
    channels = reference.shape[-1] if op == "matmul" else reference.shape[1]
    bias = _bias(channels, [channels] if op == "matmul" else [channels, 1, 1]) if kind == "bias" else 0
    executable = _check(mod, inputs, reference + bias, kind, rule, target=target, run=can_run(target))
    asm = _asm(executable)
    assert "vpdpbusd" not in asm and "vpmaddubsw" not in asm
    if cpu == "x86-64-v3":
        assert "zmm" not in asm, "AVX-512 code for an AVX2 target"
    if rule is not None:
        assert "vpmaddwd" in asm


# ----------------------------------------------------------------------------------------------------
# Whole quantized models: computed in integers, against the fake-quantized inference function
# ----------------------------------------------------------------------------------------------------

_export = export_torch


class ConvNet(torch.nn.Module):
    """A stem on 3 channels (padded to 4), a residual block, a 1x1, a depthwise, a strided conv, a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.c3 = torch.nn.Conv2d(32, 48, 1)
        self.dw = torch.nn.Conv2d(48, 48, 3, padding=1, groups=48)
        self.c4 = torch.nn.Conv2d(48, 64, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(64, 32)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        z = torch.relu(self.c2(y)) + y
        w = torch.clamp(self.dw(self.c3(z)), 0, 6)
        return self.fc(self.c4(w).mean((2, 3)))


def _conv_net_model():
    torch.manual_seed(4)
    proto = _export(ConvNet().eval(), (torch.randn(2, 3, 15, 15),), ["x"])
    rng = np.random.default_rng(5)
    return proto, [rng.standard_normal((2, 3, 15, 15)).astype(np.float32) for _ in range(5)]


@pytest.fixture(scope="module")
def conv_net():
    return _conv_net_model()


def _assert_close_to_fake_quantized(got: np.ndarray, expected: np.ndarray) -> None:
    """Integer and float accumulation round differently in the last bit, which may move a requantized
    value by one step; the outputs agree to within a few steps, and mostly exactly."""
    error = np.abs(got - expected)
    scale = np.abs(expected).max()
    assert error.max() <= 0.03 * scale, (error.max(), scale)
    sqnr = 10 * np.log10((expected ** 2).sum() / max((error ** 2).sum(), 1e-30))
    assert sqnr >= 35, sqnr


@needs_integer_kernels
@pytest.mark.parametrize("per_channel,quant_type,opt_level,layout", [
    (True, "static", 3, None), (False, "static", 0, None), (True, "static", 1, None), (True, "static", 4, "first"),
    (True, "static", 3, "last"), (True, "dynamic", 2, None)])
def test_quantized_conv_net_computes_in_integers(conv_net, tmp_path, per_channel, quant_type, opt_level, layout,
                                                 caplog):
    import json
    import logging

    proto, samples = conv_net
    ir = forge.from_onnx(proto)
    ir.calibrate(samples[:4])
    ir.quantize(per_channel=per_channel, quant_type=quant_type, calib_method="minmax")
    with caplog.at_level(logging.INFO, logger="forge.quantization"):
        ir.compile(output_path=str(tmp_path / "q"), opt_level=opt_level, set_channel_layout=layout,
                   export_metadata=True)
    lowered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("integer lowering")]
    # Static: all but the depthwise convolution (float by design); dynamic: the dense layer and the 1x1
    # convolution (padded convolutions need a constant zero point and stay float).
    # The depthwise convolution reads the uint8 activation when its scale and zero point are constants (static).
    assert lowered == [f"integer lowering: {5 if quant_type == 'static' else 2} quantized operator(s) computed "
                       f"as uint8 x int8 -> int32, {1 if quant_type == 'static' else 0} grouped convolution(s) "
                       "reading uint8"], lowered
    rules = set(json.loads((tmp_path / "q" / "model_metadata.json").read_text())["schedules"]["rules"].values())
    if layout != "last":
        assert {"Int8Matmul", "Int8Conv2dNCHW"} <= rules, rules
    if layout != "last" and quant_type == "static" and opt_level >= 1:  # requantized rows of 15: on the flat grid
        assert "FlatDepthwiseNCHW" in rules, rules
    runtime = forge.Runtime(str(tmp_path / "q"))
    reference = ir.get_inference_function()
    x = samples[4]
    _assert_close_to_fake_quantized(runtime.infer(x)[0], np.asarray(reference(x)))


class InvertedResiduals(torch.nn.Module):
    """MobileNetV2's blocks: 1x1 expansions and projections (16 | pixels), depthwise at strides 1 and 2 after a
    ReLU6 (uint8 zero point 0: the convolution's own padding), and one depthwise after no activation (a zero
    point inside the range: explicit padding), a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.expand1, self.dw1, self.project1 = (torch.nn.Conv2d(16, 48, 1), torch.nn.Conv2d(48, 48, 3, padding=1,
                                                 groups=48), torch.nn.Conv2d(48, 16, 1))
        self.expand2, self.dw2, self.project2 = (torch.nn.Conv2d(16, 48, 1), torch.nn.Conv2d(48, 48, 3, stride=2,
                                                 padding=1, groups=48), torch.nn.Conv2d(48, 24, 1))
        self.dw3 = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.fc = torch.nn.Linear(24, 10)

    def forward(self, x):
        relu6 = torch.nn.functional.relu6
        x = relu6(self.stem(x))
        x = x + self.project1(relu6(self.dw1(relu6(self.expand1(x)))))
        x = self.project2(relu6(self.dw2(relu6(self.expand2(x)))))
        return self.fc(self.dw3(x).mean((2, 3)))


@needs_integer_kernels
@pytest.mark.parametrize("opt_level,per_channel", [(3, True), (1, False), (4, True)])
def test_mobilenet_blocks_compute_in_integers_and_their_depthwise_reads_bytes(tmp_path, caplog, opt_level,
                                                                              per_channel):
    import json
    import logging

    torch.manual_seed(7)
    proto = _export(InvertedResiduals().eval(), (torch.randn(1, 3, 16, 16),), ["x"])
    rng = np.random.default_rng(8)
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(5)]
    ir = forge.from_onnx(proto)
    ir.calibrate(samples[:4])
    ir.quantize(per_channel=per_channel, calib_method="minmax")
    with caplog.at_level(logging.INFO, logger="forge.quantization"):
        ir.compile(output_path=str(tmp_path / "q"), opt_level=opt_level, export_metadata=True)
    lowered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("integer lowering")]
    assert lowered == ["integer lowering: 6 quantized operator(s) computed as uint8 x int8 -> int32, "
                       "3 grouped convolution(s) reading uint8"], lowered
    rules = json.loads((tmp_path / "q" / "model_metadata.json").read_text())["schedules"]["rules"]
    assert sum(r == "Int8PointwiseConv2dNCHW" for r in rules.values()) >= 3, rules
    depthwise = [name for name, rule in rules.items() if rule == "GroupedConv2dNCHW"]
    assert len(depthwise) == 3 and not any("dequantize" in name for name in depthwise), rules
    x = samples[4]
    _assert_close_to_fake_quantized(forge.Runtime(str(tmp_path / "q")).infer(x)[0],
                                    np.asarray(ir.get_inference_function()(x)))


# ----------------------------------------------------------------------------------------------------
# onnxruntime's own int8 models (quantize_static, QDQ): computed in integers, against onnxruntime's int8
# ----------------------------------------------------------------------------------------------------


def _assert_onnxruntimes_int8(got: np.ndarray, references: list[np.ndarray]) -> None:
    """Both engines compute the same integers; a requantized value at a rounding tie may differ by one step
    (the folded multiplier rounds once), so nearly every element is equal and none is far. ``references``:
    :func:`model_factory.onnxruntime_int8_references`, each of onnxruntime's exact computations on this CPU."""
    for expected in references:
        equal = float((got == expected).mean())
        print(f"equal to onnxruntime's int8: {equal:.4%} of {got.size}")
        assert equal >= 0.99, equal
        assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()


@pytest.fixture(scope="module")
def onnxruntime_int8_models(tmp_path_factory):
    """MobileNet blocks (uint8 activations, per-channel weights, a dynamic batch; a Gemm with transB) and the
    conv net (int8 activations, per-tensor weights, 15x15 pixels), quantized by onnxruntime."""
    import onnx

    models = {}
    torch.manual_seed(7)
    proto = _export(InvertedResiduals().eval(), (torch.randn(1, 3, 16, 16),), ["x"])
    for value in (*proto.graph.input, *proto.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.checker.check_model(proto)
    rng = np.random.default_rng(8)
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(5)]
    path = onnxruntime_quantized(proto, [{"x": s} for s in samples[:4]], tmp_path_factory.mktemp("blocks"),
                                  "QUInt8", per_channel=True)
    models["mobilenet_blocks"] = (path, samples[4], "6 quantized operator(s) computed as uint8 x int8 -> int32, "
                                                    "3 grouped convolution(s) reading uint8")
    proto, samples = _conv_net_model()
    path = onnxruntime_quantized(proto, [{"x": s} for s in samples[:4]], tmp_path_factory.mktemp("conv_net"),
                                  "QInt8", per_channel=False)
    models["conv_net"] = (path, samples[4], "5 quantized operator(s) computed as uint8 x int8 -> int32, "
                                            "1 grouped convolution(s) reading uint8")
    return models


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("name", ["mobilenet_blocks", "conv_net"])
def test_onnxruntime_int8_model_computes_in_integers_and_gives_onnxruntimes_numbers(onnxruntime_int8_models, name,
                                                                                    opt_level, tmp_path, caplog):
    """An imported QDQ model keeps its int8 weights through import (and ``set_batch_size``), is lowered like
    Forge's own, and its compiled output is onnxruntime's int8 output, at every opt_level."""
    import json
    import logging

    path, x, lowered_as = onnxruntime_int8_models[name]
    ir = forge.from_onnx(path)
    assert ir.is_quantized
    if name == "mobilenet_blocks":
        ir.set_batch_size(1)  # binds the symbolic batch and folds constants again: the int8 weights stay
    with caplog.at_level(logging.INFO, logger="forge.quantization"):
        ir.compile(output_path=str(tmp_path / "q"), opt_level=opt_level, export_metadata=True)
    lowered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("integer lowering")]
    assert lowered == [f"integer lowering: {lowered_as}"], lowered
    if name == "conv_net" and opt_level >= 1:  # fused: its depthwise layer requantizes rows of 15 on the flat grid
        rules = json.loads((tmp_path / "q" / "model_metadata.json").read_text())["schedules"]["rules"]
        assert "FlatDepthwiseNCHW" in rules.values(), rules
    expected = onnxruntime_int8_references(path, {"x": x})
    _assert_onnxruntimes_int8(forge.Runtime(str(tmp_path / "q")).infer(x)[0], expected)
    if opt_level == 3:
        _assert_onnxruntimes_int8(np.asarray(ir.get_inference_function()(x)), expected)


def test_int8_weights_not_lowered_are_dequantized_at_compile_time_not_at_run_time(onnxruntime_int8_models):
    """Arm's sdot reads int8 activations, so onnxruntime's uint8 ones stay float: each weight the lowering cannot
    take is dequantized once by the lowering (any opt_level), and the numbers stay onnxruntime's."""
    from forge_core.quantization.expand import expand_quantize
    from forge_core.quantization.held_weights import is_dequantized_constant
    from forge_core.quantization.lowering import lower_to_integer

    path, x, _ = onnxruntime_int8_models["mobilenet_blocks"]
    mod = forge.from_onnx(path).mod
    held = [b for block in mod["main"].body.blocks for b in block.bindings if is_dequantized_constant(b.value)]
    assert len(held) == 9  # 8 convolution weights and the Gemm's, kept through import
    lowered = lower_to_integer(mod, data_dtype="int8")
    assert not any(is_dequantized_constant(b.value) for block in lowered["main"].body.blocks for b in block.bindings)
    vm = relax.VirtualMachine(tvm.compile(expand_quantize(lowered), target="llvm"), tvm.cpu())
    _assert_onnxruntimes_int8(vm["main"](tvm.runtime.tensor(x)).numpy(), onnxruntime_int8_references(path, {"x": x}))


def test_onnxruntime_int8_bert_with_an_infinite_mask_range_gives_onnxruntimes_numbers(tmp_path, caplog):
    """onnxruntime calibrates the attention mask (0 or -inf) to the scale inf: -inf / inf is NaN, which ONNX
    quantizes to -128, so the mask comes back as -inf. Forge's quantize does the same (TVM's gave +127, and
    so +inf: every masked score won). The twelve dense layers compute in integers."""
    import logging

    from hf_models import ARCHITECTURES

    arch = ARCHITECTURES["bert"]
    model = arch.build(seed=3)
    names = list(arch.input_names)
    batches = [arch.inputs(batch=1, length=16, seed=s) for s in range(5)]
    feeds = [{n: t.numpy() for n, t in zip(names, batch)} for batch in batches]
    assert (feeds[4]["attention_mask"] == 0).any()  # some positions are masked
    proto = _export(model, batches[0], names)
    path = onnxruntime_quantized(proto, feeds[:4], tmp_path, "QInt8", per_channel=True)
    ir = forge.from_onnx(path)
    with caplog.at_level(logging.INFO, logger="forge.quantization"):
        ir.compile(output_path=str(tmp_path / "q"))
    lowered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("integer lowering")]
    assert lowered and lowered[0].startswith("integer lowering: 12 quantized operator(s)"), lowered
    expected = onnxruntime_int8_references(path, feeds[4])
    # Compiled, the mask's quantize is the lowering's uint8 requantize; in the inference function, relax.quantize.
    _assert_onnxruntimes_int8(forge.Runtime(str(tmp_path / "q")).infer(*feeds[4].values())[0], expected)
    _assert_onnxruntimes_int8(np.asarray(ir.get_inference_function()(*feeds[4].values())), expected)


def test_onnxruntime_dynamic_int8_bert_computes_its_matmuls_on_the_vnni_rule(tmp_path):
    """onnxruntime's ``quantize_dynamic``: DynamicQuantizeLinear (a min and a max of each activation) then
    MatMulInteger with int8 weights. Forge's converter writes ``u8 @ i8 - z * colsum(w)``, which the VNNI rule
    takes on a VNNI target; the min and max take the scalar-reduction rule. The output is onnxruntime's on the
    model with exact int32 matmuls, and onnxruntime's own where this CPU has VNNI (without it, onnxruntime's
    ``vpmaddubsw`` saturates: 0.045 of 3.3 off on an AVX2 Zen)."""
    import json

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from hf_models import ARCHITECTURES

    arch = ARCHITECTURES["bert"]
    names = list(arch.input_names)
    inputs = arch.inputs(batch=1, length=16, seed=4)
    source, target = tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx"
    onnx.save(_export(arch.build(seed=3), inputs, names), source)
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    assert sum(n.op_type == "MatMulInteger" for n in onnx.load(str(target)).graph.node) == 12
    feed = {n: t.numpy() for n, t in zip(names, inputs)}
    forge.from_onnx(str(target)).compile(output_path=str(tmp_path / "q"), export_metadata=True)
    got = forge.Runtime(str(tmp_path / "q")).infer(*feed.values())[0]
    for expected in onnxruntime_int8_references(str(target), feed):
        assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max(), np.abs(got - expected).max()
    if HOST_VNNI:  # the integer rules are VNNI's; their choice is covered compiled for Zen 4 on any host
        rules = json.loads((tmp_path / "q" / "model_metadata.json").read_text())["schedules"]["rules"]
        matmuls = [name for name, rule in rules.items() if "matmul" in name and rule == "Int8Matmul"]
        assert len(matmuls) >= 4, rules  # q/k/v/o, the two FFN layers (kernels of equal shapes shared)
        assert "Generic" not in rules.values(), rules


@pytest.mark.parametrize("opt_level", [0, 3])
def test_onnxruntime_dynamic_int8_conv_net_loads_and_gives_onnxruntimes_numbers(tmp_path, opt_level):
    """quantize_dynamic on MobileNet blocks: ConvInteger (which TVM does not convert) for every convolution;
    the unpadded 1x1 ones take the integer rules, the padded ones compute in int32; exact against onnxruntime."""
    import json

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(7)
    source, target = tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx"
    onnx.save(_export(InvertedResiduals().eval(), (torch.randn(1, 3, 16, 16),), ["x"]), source)
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    assert sum(n.op_type == "ConvInteger" for n in onnx.load(str(target)).graph.node) == 8
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    forge.from_onnx(str(target)).compile(output_path=str(tmp_path / "q"), opt_level=opt_level, export_metadata=True)
    got = forge.Runtime(str(tmp_path / "q")).infer(x)[0]
    for expected in onnxruntime_int8_references(str(target), {"x": x}):
        assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), np.abs(got - expected).max()
    rules = set(json.loads((tmp_path / "q" / "model_metadata.json").read_text())["schedules"]["rules"].values())
    assert "ScalarReduction" in rules, rules
    if HOST_VNNI:  # the integer rules are VNNI's; their choice is covered compiled for Zen 4 on any host
        assert "Int8PointwiseConv2dNCHW" in rules, rules


@needs_integer_kernels
def test_quantized_bert_encoder_computes_its_dense_layers_in_integers(tmp_path, caplog):
    import json
    import logging

    from hf_models import ARCHITECTURES

    arch = ARCHITECTURES["bert"]
    model = arch.build(seed=3)
    inputs = arch.inputs(batch=2, length=16, seed=1)
    ir = forge.from_onnx(_export(model, inputs, list(arch.input_names)))
    ir.calibrate([tuple(t.numpy() for t in arch.inputs(batch=2, length=16, seed=s)) for s in range(2, 6)])
    ir.quantize(per_channel=True, calib_method="minmax")
    with caplog.at_level(logging.INFO, logger="forge.quantization"):
        ir.compile(output_path=str(tmp_path / "q"), export_metadata=True)
    assert any(r.getMessage().startswith("integer lowering: 12 ") for r in caplog.records)  # q, k, v, o, FFN x2
    rules = json.loads((tmp_path / "q" / "model_metadata.json").read_text())["schedules"]["rules"]
    # Kernels are shared between layers (and between q, k and v): one per shape and epilogue.
    assert sum(rule == "Int8Matmul" for rule in rules.values()) >= 4, rules
    feeds = [t.numpy() for t in inputs]
    got = forge.Runtime(str(tmp_path / "q")).infer(*feeds)[0]
    _assert_close_to_fake_quantized(got, np.asarray(ir.get_inference_function()(*feeds)))


# ----------------------------------------------------------------------------------------------------
# Arm +dotprod: int8 activations, sdot kernels
# ----------------------------------------------------------------------------------------------------

def test_raspberry_pi_5_int8_artifact_builds_with_sdot_and_its_int8_lowering_is_exact(conv_net, tmp_path):
    """Cortex-A76 has +dotprod: activations stay int8 and the kernels use sdot (built here, run on Arm)."""
    from forge_core.compiler.options import CompileOptions
    from forge_core.compiler.pipeline import prepare_graph
    from forge_core.ir import weights
    from forge_core.quantization.lowering import lower_to_integer

    proto, samples = conv_net
    ir = forge.from_onnx(proto)
    ir.calibrate(samples[:4])
    ir.quantize(per_channel=True)
    pi5 = resolve_target("raspberry-pi/5")
    schedules: dict = {}
    executable = build(prepare_graph(weights.bind_params(ir.mod, ir.params), CompileOptions.validate(), pi5),
                       pi5, 3, schedules=schedules)
    assert "sdot" in _asm(executable) and "vpdpbusd" not in _asm(executable)
    assert {"Int8Conv2dNCHW", "Int8Matmul"} <= set(schedules["rules"].values())
    # The int8-activation form of the lowering, run here: the same values as the fake-quantized model.
    lowered = lower_to_integer(weights.bind_params(ir.mod, ir.params), data_dtype="int8")
    vm = relax.VirtualMachine(tvm.compile(lowered, target=resolve_target("llvm")), tvm.cpu())  # this CPU
    x = samples[4]
    _assert_close_to_fake_quantized(vm["main"](tvm.runtime.tensor(x)).numpy(),
                                    np.asarray(ir.get_inference_function()(x)))


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="aarch64-linux-gnu-gcc is not installed (./scripts/setup installs Debian's gcc-aarch64-linux-gnu)")
def test_raspberry_pi_5_int8_library_is_an_aarch64_elf(conv_net, tmp_path):
    import json

    from forge_core.runtime.library_file import elf_machine

    proto, samples = conv_net
    ir = forge.from_onnx(proto)
    ir.calibrate(samples[:4])
    ir.quantize(per_channel=True)
    ir.compile(output_path=str(tmp_path / "pi5"), target="raspberry-pi/5", export_metadata=True)
    metadata = json.loads((tmp_path / "pi5" / "model_metadata.json").read_text())
    assert metadata["precision"] == "int8"
    assert {"Int8Conv2dNCHW", "Int8Matmul"} <= set(metadata["schedules"]["rules"].values())
    assert elf_machine((tmp_path / "pi5" / "model_library.so").read_bytes()) == "aarch64"


@pytest.mark.parametrize("op", ["conv2d", "conv2d_unpadded", "matmul"])
def test_arm_dotprod_schedules_are_exact_with_the_instruction_emulated(op, monkeypatch):
    """The sdot kernels' tiling, repacking and tensorization, run here: the same schedule with the 4x4 dot
    product as plain loops (the one-instruction body runs only on Arm)."""
    from tvm.s_tir import TensorIntrin

    from forge_core.schedules import dot_intrinsics, int8

    name = "forge_test_dot_4x4_i8i8i32_loops"
    TensorIntrin.register(name, dot_intrinsics._description(4, "int8"), dot_intrinsics._description(4, "int8"),
                          override=True)
    monkeypatch.setattr(int8, "dot_product", lambda target: int8.DotProduct("int8", {4: name}, 4))
    if op.startswith("conv2d"):
        padding = 0 if op == "conv2d_unpadded" else 1  # unpadded: the int8 input repacked by interleaves of 14
        data = RNG.integers(-128, 128, (1, 12, 9, 14 if padding == 0 else 11)).astype(np.int8)
        weight = RNG.integers(-128, 128, (20, 12, 3, 3)).astype(np.int8)
        reference = _reference_conv(data, weight, 1, padding)
        attrs = {"padding": padding}
    else:
        data = RNG.integers(-128, 128, (2, 5, 36)).astype(np.int8)
        weight = RNG.integers(-128, 128, (36, 28)).astype(np.int8)
        reference = data.astype(np.int64) @ weight.astype(np.int64)
        attrs = {}
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType(data.shape, "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            call = (relax.op.nn.conv2d(x, relax.const(weight), out_dtype="int32", **attrs) if op.startswith("conv2d")
                    else relax.op.matmul(x, relax.const(weight), out_dtype="int32"))
            out = bb.emit_output(bb.emit(call))
        bb.emit_func_output(out)
    got, rules, _ = _run(bb.get(), resolve_target({"kind": "llvm", "num-cores": 2}), [data], forge_build=True)
    assert {"Int8Conv2dNCHW" if op.startswith("conv2d") else "Int8Matmul"} <= rules, rules
    np.testing.assert_array_equal(got, reference)



@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("channels,height,width", [(8, 2, 32), (4, 3, 56), (12, 2, 28), (8, 3, 12), (16, 2, 7),
                                                   (8, 2, 6), (4, 3, 226), (8, 2, 15)])
def test_input_repack_interleaves_pixels_exactly(dtype, channels, height, width):
    """pack_channels: NCHW -> [N, C/4, H, W, 4] as vector interleaves (16, 8, 14, 4, 7, 2 pixels), else a loop."""
    from tvm.s_tir import Schedule
    from tvm.script import tirx as T

    from forge_core.schedules.int8 import pack_channels

    @T.prim_func(s_tir=True)
    def repack(data: T.Buffer((1, channels, height, width), dtype),
               packed: T.Buffer((1, channels // 4, height, width, 4), dtype)):
        T.func_attr({"tirx.noalias": True, "global_symbol": "main"})
        for a, c, h, w in T.grid(1, channels, height, width):
            with T.sblock("packed"):
                va, vc, vh, vw = T.axis.remap("SSSS", [a, c, h, w])
                packed[va, vc // 4, vh, vw, vc % 4] = data[va, vc, vh, vw]

    sch = Schedule(repack)
    pack_channels(sch, sch.get_sblock("packed"))
    interleaved = "T.Shuffle" in sch.mod["main"].script()
    assert interleaved == any(width % p == 0 for p in (16, 8, 14, 4, 7, 2))
    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, (1, channels, height, width)).astype(dtype)
    lib = tvm.compile(sch.mod, target=tvm.target.Target({"kind": "llvm", "num-cores": 2}))
    got = tvm.runtime.tensor(np.zeros((1, channels // 4, height, width, 4), dtype))
    lib["main"](tvm.runtime.tensor(data), got)
    np.testing.assert_array_equal(got.numpy(), data.reshape(1, channels // 4, 4, height, width).transpose(0, 1, 3, 4, 2))


@pytest.mark.parametrize("activation", ["relu6", "clip", "relu", "none", "shared"])
def test_folded_requantize_epilogue_gives_the_same_bytes(activation):
    """fold_requantize: the clamp moves into the final clip (here inside 0..255: 6 * 20 + 3 = 123), the scales
    into one constant; the bytes match the epilogue as written, but for a value within an ulp of a tie."""
    from forge_core.quantization.expand import saturate
    from forge_core.quantization.lowering import fold_requantize

    bb = relax.BlockBuilder()
    acc = relax.Var("acc", relax.TensorType((2, 8, 5, 7), "int32"))
    scale = (RNG.uniform(0.5, 2.0, (8, 1, 1)) * 1e-3).astype(np.float32)
    with bb.function("main", [acc]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale)))
            if activation in ("relu6", "shared"):
                y = bb.emit(relax.op.minimum(bb.emit(relax.op.maximum(y, relax.const(np.float32(0)))),
                                             relax.const(np.float32(6))))
            elif activation == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif activation == "clip":
                y = bb.emit(relax.op.clip(y, 0, 6))
            q = bb.emit(relax.op.multiply(y, relax.const(np.float32(20))))
            q = bb.emit(relax.op.add(relax.op.round(q), relax.const(np.float32(3))))
            q = bb.emit(relax.op.astype(saturate(q, 0, 255), "uint8"))
            out = bb.emit_output(relax.Tuple([q, y]) if activation == "shared" else q)
        bb.emit_func_output(out)
    mod = bb.get()
    folded = tvm.IRModule({"main": fold_requantize(mod["main"])})
    text = folded["main"].script()
    if activation == "shared":  # the clamp's output is read twice: left as it is
        assert text.count("R.maximum") == 2 and text.count("R.minimum") == 2 and text.count("R.multiply") == 2, text
    else:  # one clamp left, the final one
        assert text.count("R.maximum") == 1 and text.count("R.minimum") == 1, text
        assert not any(op in text for op in ("relu", "R.clip")), text
        assert text.count("R.multiply") == 1, text
        if activation in ("relu6", "clip"):  # min(max(round(y * 20) + 3, max(0, 0 + 3)), min(255, 120 + 3))
            assert "R.const(3.0" in text and "R.const(123.0" in text, text
    x = tvm.runtime.tensor(RNG.integers(-10_000, 10_000, (2, 8, 5, 7)).astype(np.int32))

    def run(m):
        out = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](x)
        return (out[0] if activation == "shared" else out).numpy().astype(np.int64)

    steps = np.abs(run(folded) - run(mod))
    assert steps.max() <= 1 and np.count_nonzero(steps) <= 2, steps.max()


# ----------------------------------------------------------------------
# Integer kernels only where they are faster than float32 (AVX2 and up on x86, +dotprod on Arm); else float,
# and the compile log says so (issue: int8 slower than fp32 on AVX2)
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ort_qdq_conv_net(tmp_path_factory):
    """onnxruntime's QDQ model (uint8 activations) of a conv net, and an input it was not calibrated on."""
    from model_factory import conv_bn_net

    rng = np.random.default_rng(3)
    samples = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(5)]
    folder = tmp_path_factory.mktemp("qdq_conv_net")
    return onnxruntime_quantized(conv_bn_net(seed=2, channels=16), samples[:4], folder, "QUInt8"), samples[4]


def _integer_convolutions(mod) -> int:
    count = 0
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.nn.conv2d" \
                    and str(value.attrs.out_dtype) == "int32":
                count += 1
    return count


@pytest.mark.parametrize("target, integer", [
    ("llvm -mcpu=x86-64-v3", 3),         # AVX2 + FMA: int16 pairs on vpmaddwd
    ("llvm -mcpu=znver1", 3),
    ("llvm -mcpu=skylake-avx512", 3),    # AVX-512 without VNNI: vpmaddwd on zmm
    ("llvm -mcpu=sandybridge", None),    # AVX without AVX2: int32 multiply-adds would be slower than float32
    ("raspberry-pi/4", None),            # Cortex-A72: no +dotprod
    ("llvm -mcpu=alderlake", 3),         # AVX-VNNI
    ("llvm -mcpu=znver4", 3),            # AVX-512 VNNI
    ("raspberry-pi/5", 0),               # Cortex-A76: +dotprod (sdot reads int8: these uint8 activations stay float)
])
def test_integer_kernels_only_where_the_cpu_has_a_byte_dot_product(ort_qdq_conv_net, caplog, monkeypatch, target,
                                                                   integer):
    import logging

    monkeypatch.setenv("FORGE_INT8_LOWERING", "auto")
    from forge_core.ir import weights
    from forge_core.passes import PassContext, run_passes

    path, _ = ort_qdq_conv_net
    ir = forge.from_onnx(str(path))
    mod = weights.bind_params(ir.mod, ir.params)
    with caplog.at_level(logging.WARNING, logger="forge.quantization"):
        lowered = run_passes(mod, ["lower_quantized"], PassContext(target=resolve_target(target)))
    said = [r.getMessage() for r in caplog.records if "no byte dot product" in r.getMessage()]
    if integer is not None:
        assert _integer_convolutions(lowered) == integer and not said
    else:
        assert _integer_convolutions(lowered) == 0
        assert len(said) == 1 and "compute in float32" in said[0] and "-mcpu=x86-64-v3 (AVX2)" in said[0], said


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("cpu", ["x86-64-v3", "skylake-avx512"])
def test_an_x86_target_without_vnni_computes_quantized_models_in_integers_with_onnxruntimes_numbers(
        ort_qdq_conv_net, tmp_path, monkeypatch, caplog, opt_level, cpu):
    import logging

    monkeypatch.setenv("FORGE_INT8_LOWERING", "auto")
    target = resolve_target(f"llvm -mcpu={cpu}")
    if not can_run(target):
        pytest.skip(f"this CPU cannot run {cpu} code")
    path, sample = ort_qdq_conv_net
    with caplog.at_level(logging.WARNING, logger="forge.quantization"):
        forge.from_onnx(str(path)).compile(target=f"llvm -mcpu={cpu}", output_path=str(tmp_path / "q"),
                                           opt_level=opt_level)
    assert not [r for r in caplog.records if "no byte dot product" in r.getMessage()]
    from forge_core.runtime.metadata import read_artifact

    rules = set(read_artifact(tmp_path / "q")[0]["schedules"]["rules"].values())
    assert {"Int8Conv2dNCHW", "Int8PointwiseConv2dNCHW"} & rules, rules
    got = forge.Runtime(str(tmp_path / "q")).infer(sample["x"])[0]
    _assert_onnxruntimes_int8(got, onnxruntime_int8_references(str(path), sample))


def test_a_target_before_avx2_computes_quantized_models_in_float_with_onnxruntimes_numbers(ort_qdq_conv_net,
                                                                                            tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_INT8_LOWERING", "auto")
    path, sample = ort_qdq_conv_net
    forge.from_onnx(str(path)).compile(target="llvm -mcpu=sandybridge", output_path=str(tmp_path / "q"))
    got = forge.Runtime(str(tmp_path / "q")).infer(sample["x"])[0]
    for expected in onnxruntime_int8_references(str(path), sample):
        # the fake-quantized reference's numbers: float sums of the same products round alike here
        assert (got == expected).mean() >= 0.99 and np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()



@pytest.mark.parametrize("choice, integer", [("float", 0), ("integer", 3)])
def test_the_environment_chooses_integer_or_float_kernels_on_any_target(ort_qdq_conv_net, monkeypatch, choice,
                                                                          integer):
    from forge_core.ir import weights
    from forge_core.passes import PassContext, run_passes

    monkeypatch.setenv("FORGE_INT8_LOWERING", choice)
    path, _ = ort_qdq_conv_net
    ir = forge.from_onnx(str(path))
    mod = weights.bind_params(ir.mod, ir.params)
    for target in ("llvm -mcpu=x86-64-v3", "llvm -mcpu=znver4"):
        lowered = run_passes(mod, ["lower_quantized"], PassContext(target=resolve_target(target)))
        assert _integer_convolutions(lowered) == integer, target
    monkeypatch.setenv("FORGE_INT8_LOWERING", "fastest")
    with pytest.raises(forge.OptionError, match="FORGE_INT8_LOWERING must be auto, integer or float, given 'fastest'"):
        run_passes(mod, ["lower_quantized"], PassContext(target=resolve_target("llvm")))
