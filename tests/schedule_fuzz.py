"""A seeded differential fuzzer for the compiled path: random operator cases, Forge against onnxruntime.

Each case is one operator (with, for convolutions and matrix products, an
epilogue: none, bias, bias+ReLU, bias+Clip, residual add, folded batch norm,
SiLU) on random shapes with odd sizes. Several cases share one ONNX model, each
with its own inputs and output, so one compile checks many schedules; fusion
never crosses two cases. A pack compiles under one set of options (``opt_level``
0-4, ``set_channel_layout``, ``set_float16``) in verification mode, and every
output is compared with onnxruntime on random inputs, the inference function's too.

The test suite runs a bounded number of packs (tests/test_schedule_fuzz.py).
A longer run, from the repository root::

    .venv/bin/python tests/schedule_fuzz.py --minutes 30 --seed 7

prints each failing case with what reproduces it (``--seed S --pack P``), and
re-runs a failing pack case by case to name the culprit.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

from model_factory import IR_VERSION, make_model  # noqa: E402

OPSET = 17
# Largest |forge - onnxruntime| allowed, relative to max(1, max |onnxruntime|).
TOLERANCE = {False: 2e-4, True: 2e-2}  # keyed by set_float16
EPILOGUES = ("none", "bias", "bias_relu", "bias_clip", "residual", "batch_norm", "silu")
OPTIONS = [dict(opt_level=level, set_channel_layout=layout, set_float16=fp16)
           for level in range(5) for layout in (None, "first", "last") for fp16 in (False, True)]


@dataclass
class Case:
    """One operator case: its ONNX nodes, graph inputs with their data, initializers and the output name."""

    family: str
    params: dict[str, Any]
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    output: str = ""
    batched: list[str] = field(default_factory=list)
    """Inputs whose first axis is the case's batch: dynamic (one dim shared by them) in a dynamic-batch pack."""

    def describe(self) -> str:
        return f"{self.family}({', '.join(f'{k}={v}' for k, v in self.params.items())})"


class _Builder:
    """Names scoped by case, random tensors with sane statistics."""

    def __init__(self, rng: np.random.Generator, prefix: str, case: Case):
        self.rng, self.prefix, self.case = rng, prefix, case

    def name(self, base: str) -> str:
        return f"{self.prefix}_{base}"

    def input(self, base: str, shape: Sequence[int], batched: bool = False) -> str:
        name = self.name(base)
        self.case.inputs[name] = self.rng.standard_normal(tuple(shape)).astype(np.float32)
        if batched:
            self.case.batched.append(name)
        return name

    def weight(self, base: str, shape: Sequence[int], fan_in: int | None = None, positive: bool = False) -> str:
        name = self.name(base)
        scale = 1.0 / math.sqrt(fan_in) if fan_in else 0.5
        data = self.rng.standard_normal(tuple(shape)) * scale
        if positive:
            data = np.abs(data) + 0.5
        self.case.initializers.append(numpy_helper.from_array(data.astype(np.float32), name))
        return name

    def ints(self, base: str, values: Sequence[int]) -> str:
        name = self.name(base)
        self.case.initializers.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def node(self, op: str, inputs: Sequence[str], base: str, **attrs: Any) -> str:
        out = self.name(base)
        self.case.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out


def _epilogue(b: _Builder, value: str, channels: int, out_shape: Sequence[int], kind: str, rank: int,
              channel_axis: int = 1) -> str:
    """``kind`` applied to ``value`` (channels on ``channel_axis``)."""
    if kind == "none":
        return value
    bshape = [1] * rank
    bshape[channel_axis] = channels
    if kind in ("bias", "bias_relu", "bias_clip"):
        value = b.node("Add", [value, b.weight("bias", bshape)], "biased")
        if kind == "bias_relu":
            value = b.node("Relu", [value], "relu")
        elif kind == "bias_clip":
            lo, hi = b.name("lo"), b.name("hi")
            b.case.initializers += [numpy_helper.from_array(np.array(0.0, np.float32), lo),
                                    numpy_helper.from_array(np.array(0.5, np.float32), hi)]
            value = b.node("Clip", [value, lo, hi], "clip")
        return value
    if kind == "residual":
        return b.node("Add", [value, b.input("skip", out_shape, batched=True)], "residual")
    if kind == "batch_norm" and channel_axis == 1:
        c = [channels]
        args = [b.weight("gamma", c, positive=True), b.weight("beta", c), b.weight("mean", c),
                b.weight("var", c, positive=True)]
        return b.node("BatchNormalization", [value, *args], "bn")
    sig = b.node("Sigmoid", [value], "sigmoid")  # silu (and batch_norm off the channel axis)
    return b.node("Mul", [value, sig], "silu")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _conv_case(rng: np.random.Generator, b: _Builder, case: Case, dims: int, transpose: bool) -> None:
    batch = int(rng.choice([1, 1, 2]))
    spatial = [int(rng.integers(3, 24 if dims < 3 else 9)) for _ in range(dims)]
    if dims == 1:
        spatial = [int(rng.integers(5, 120))]
    kernel = [int(rng.choice([1, 2, 3, 3, 4, 5])) for _ in range(dims)]
    if rng.random() < 0.3:
        kernel = [kernel[0]] * dims
    strides = [int(rng.choice([1, 1, 2, 3] if not transpose else [1, 2, 2, 4])) for _ in range(dims)]
    dilations = [int(rng.choice([1, 1, 1, 2])) for _ in range(dims)]
    c_in = int(rng.choice([1, 3, 4, 8, 13, 16, 24, 32]))
    c_out = int(rng.choice([1, 5, 8, 16, 24, 32, 48]))
    group_kind = rng.choice(["one", "one", "depthwise", "grouped"])
    group = 1
    if group_kind == "depthwise":
        group, c_out = c_in, c_in * int(rng.choice([1, 1, 2]))
    elif group_kind == "grouped":
        common = [g for g in _divisors(c_in) if g > 1]
        if common:
            group = int(rng.choice(common))
            c_out = group * int(rng.choice([1, 2, 3]))
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if transpose:
        pads = [int(rng.integers(0, e)) for e in eff for _ in range(2)]
        pads = pads[0::2] + pads[1::2]
        output_padding = [int(rng.integers(0, s)) if rng.random() < 0.3 else 0
                          for s in strides]
        out = [s * (i - 1) + op + e - pads[k] - pads[k + dims]
               for k, (s, i, op, e) in enumerate(zip(strides, spatial, output_padding, eff))]
        if min(out) < 1:
            pads = [0] * (2 * dims)
            out = [s * (i - 1) + op + e for s, i, op, e in zip(strides, spatial, output_padding, eff)]
    else:
        spatial = [max(i, e) for i, e in zip(spatial, eff)]
        pads = [int(rng.integers(0, k)) for k in kernel for _ in range(2)]
        pads = pads[0::2] + pads[1::2]
        if dims == 2 and rng.random() < 0.3:
            # Output rows of whole vectors (32 or 48 pixels, stride 1 along them) on a few rows: the
            # convolution tiles' full-width paths, which rows of 3-23 pixels never reach.
            strides[-1] = 1
            spatial[0] = min(spatial[0], max(8, eff[0]))
            spatial[-1] = int(rng.choice([32, 48])) - pads[dims - 1] - pads[-1] + eff[-1] - 1
        out = [(i + pads[k] + pads[k + dims] - e) // s + 1
               for k, (i, e, s) in enumerate(zip(spatial, eff, strides))]
        output_padding = []
    epilogue = str(rng.choice(EPILOGUES))
    case.params.update(batch=batch, c_in=c_in, c_out=c_out, spatial=spatial, kernel=kernel, strides=strides,
                       pads=pads, dilations=dilations, group=group, epilogue=epilogue)
    if output_padding and any(output_padding):
        case.params["output_padding"] = output_padding
    x = b.input("x", [batch, c_in, *spatial], batched=True)
    if transpose:
        w = b.weight("w", [c_in, c_out // group, *kernel], fan_in=c_in * int(np.prod(kernel)) // group)
    else:
        w = b.weight("w", [c_out, c_in // group, *kernel], fan_in=c_in * int(np.prod(kernel)) // group)
    attrs: dict[str, Any] = dict(kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations, group=group)
    if output_padding and any(output_padding):
        attrs["output_padding"] = output_padding
    y = b.node("ConvTranspose" if transpose else "Conv", [x, w], "conv", **attrs)
    case.output = _epilogue(b, y, c_out, [batch, c_out, *out], epilogue, dims + 2)


def conv1d(rng, b, case):
    _conv_case(rng, b, case, 1, transpose=False)


def conv2d(rng, b, case):
    _conv_case(rng, b, case, 2, transpose=False)


def conv3d(rng, b, case):
    _conv_case(rng, b, case, 3, transpose=False)


def conv1d_transpose(rng, b, case):
    _conv_case(rng, b, case, 1, transpose=True)


def conv2d_transpose(rng, b, case):
    _conv_case(rng, b, case, 2, transpose=True)


def matmul(rng, b, case):
    m, k, n = (int(rng.choice([1, 2, 3, 7, 16, 33, 64, 100])) for _ in range(3))
    batch = [int(rng.choice([1, 2, 3])) for _ in range(int(rng.integers(0, 3)))]
    kind = str(rng.choice(["weight", "batched", "gemm"]))
    epilogue = str(rng.choice(EPILOGUES[:5] + ("silu",)))
    case.params.update(kind=kind, batch=batch, m=m, k=k, n=n, epilogue=epilogue)
    if kind == "gemm":
        x = b.input("x", [m, k], batched=True)
        w = b.weight("w", [n, k], fan_in=k)
        y = b.node("Gemm", [x, w, b.weight("c", [n])], "gemm", transB=1)
        out = [m, n]
    elif kind == "batched":
        x = b.input("x", [*batch, m, k], batched=True)
        other_batch = [d if rng.random() < 0.7 else 1 for d in batch]
        # y shares x's batch where it has it (not broadcast); a y without batch dims has k first: static.
        shares = bool(batch) and other_batch[0] == batch[0] and len(other_batch) == len(batch)
        y = b.node("MatMul", [x, b.input("y", [*other_batch, k, n], batched=shares)], "matmul")
        out = [*batch, m, n]
    else:
        x = b.input("x", [*batch, m, k], batched=True)
        y = b.node("MatMul", [x, b.weight("w", [k, n], fan_in=k)], "matmul")
        out = [*batch, m, n]
    case.output = _epilogue(b, y, n, out, epilogue, len(out), channel_axis=len(out) - 1)


def pool(rng, b, case):
    dims = int(rng.choice([1, 2, 2, 2]))
    kind = str(rng.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    c = int(rng.choice([1, 3, 16, 17, 32]))
    spatial = [int(rng.integers(3, 30)) for _ in range(dims)]
    case.params.update(kind=kind, c=c, spatial=spatial)
    x = b.input("x", [1, c, *spatial], batched=True)
    if kind.startswith("Global"):
        case.output = b.node(kind, [x], "pool")
        return
    kernel = [int(rng.integers(1, min(4, s) + 1)) for s in spatial]
    strides = [int(rng.choice([1, 2, 3])) for _ in range(dims)]
    pads = [int(rng.integers(0, k)) for k in kernel for _ in range(2)]
    pads = pads[0::2] + pads[1::2]
    attrs: dict[str, Any] = dict(kernel_shape=kernel, strides=strides, pads=pads)
    if rng.random() < 0.3:
        attrs["ceil_mode"] = 1
    if kind == "AveragePool" and rng.random() < 0.5:
        attrs["count_include_pad"] = 1
    case.params.update({k: v for k, v in attrs.items() if k != "kernel_shape"}, kernel=kernel)
    case.output = b.node(kind, [x], "pool", **attrs)


def reduction(rng, b, case):
    rank = int(rng.integers(1, 5))
    shape = [int(rng.choice([1, 2, 3, 7, 16, 31, 64])) for _ in range(rank)]
    axes = sorted({int(a) for a in rng.choice(rank, size=int(rng.integers(1, rank + 1)))})
    op = str(rng.choice(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2"]))
    keep = int(rng.integers(0, 2))
    case.params.update(op=op, shape=shape, axes=axes, keepdims=keep)
    x = b.input("x", shape, batched=True)
    if op == "ReduceSum":
        case.output = b.node(op, [x, b.ints("axes", axes)], "reduce", keepdims=keep)
    else:
        case.output = b.node(op, [x], "reduce", axes=axes, keepdims=keep)


def normalization(rng, b, case):
    rank = int(rng.integers(2, 5))
    shape = [int(rng.choice([1, 2, 5, 16, 33, 128])) for _ in range(rank)]
    op = str(rng.choice(["Softmax", "LogSoftmax", "LayerNormalization"]))
    axis = int(rng.integers(-rank, rank)) if op != "LayerNormalization" else int(rng.choice([-1, -1, -2]))
    case.params.update(op=op, shape=shape, axis=axis)
    x = b.input("x", shape, batched=op != "LayerNormalization" or len(shape) + axis > 0)
    if op == "LayerNormalization":
        norm_shape = shape[axis:]
        case.output = b.node(op, [x, b.weight("scale", norm_shape, positive=True), b.weight("b", norm_shape)],
                             "norm", axis=axis)
    else:
        case.output = b.node(op, [x], "norm", axis=axis)


def elementwise(rng, b, case):
    rank = int(rng.integers(1, 5))
    shape = [int(rng.choice([1, 2, 3, 8, 17, 64])) for _ in range(rank)]
    other = [d if rng.random() < 0.6 else 1 for d in shape][int(rng.integers(0, rank)):]
    if rng.random() < 0.5:
        shape, other = other, shape  # broadcasting either way
    op = str(rng.choice(["Add", "Sub", "Mul", "Div", "Max", "Pow"]))
    unary = str(rng.choice(["none", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Abs", "Neg", "Sqrt", "HardSigmoid"]))
    case.params.update(op=op, shape=shape, other=other, unary=unary)
    x = b.input("x", shape)
    y = b.weight("y", other, positive=True) if op in ("Div", "Pow") else b.input("y", other)
    value = b.node(op, [b.node("Abs", [x], "abs") if op == "Pow" else x, y], "binary")
    if unary == "Sqrt":
        value = b.node("Abs", [value], "abs2")
    if unary != "none":
        value = b.node(unary, [value], "unary")
    case.output = value


def transpose(rng, b, case):
    rank = int(rng.integers(2, 6))
    shape = [int(rng.choice([1, 2, 3, 5, 8, 16, 33])) for _ in range(rank)]
    perm = [int(p) for p in rng.permutation(rank)]
    case.params.update(shape=shape, perm=perm)
    case.output = b.node("Transpose", [b.input("x", shape, batched=True)], "transpose", perm=perm)


def concat(rng, b, case):
    rank = int(rng.integers(1, 5))
    shape = [int(rng.choice([1, 2, 3, 8, 17])) for _ in range(rank)]
    axis = int(rng.integers(-rank, rank))
    parts = []
    for i in range(int(rng.integers(2, 4))):
        part = list(shape)
        part[axis] = int(rng.integers(1, 9))
        # Along axis 0 each part has its own length: the first one's is the dynamic dim.
        parts.append(b.input(f"x{i}", part, batched=i == 0 or axis % rank != 0))
    case.params.update(shape=shape, axis=axis, count=len(parts))
    relu = rng.random() < 0.5
    value = b.node("Concat", parts, "concat", axis=axis)
    case.output = b.node("Relu", [value], "relu") if relu else value


def resize(rng, b, case):
    c = int(rng.choice([1, 3, 8, 16]))
    h, w = int(rng.integers(2, 20)), int(rng.integers(2, 20))
    mode = str(rng.choice(["nearest", "linear"]))
    ctm = str(rng.choice(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
    if mode == "nearest":
        ctm = str(rng.choice(["asymmetric", "half_pixel"]))
    scale = float(rng.choice([2.0, 2.0, 3.0, 0.5]))
    if ctm == "align_corners" and min(h, w) * scale < 2:
        h, w = max(h, 4), max(w, 4)  # an output axis of 1 is refused with an error (test_onnx_converters)
    if scale == 0.5:
        h, w = h + h % 2, w + w % 2  # a fractional output size is refused with an error (test_onnx_converters)
    case.params.update(c=c, h=h, w=w, mode=mode, coordinate_transformation_mode=ctm, scale=scale)
    x = b.input("x", [1, c, h, w], batched=True)
    scales = b.name("scales")
    case.initializers.append(numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), scales))
    attrs: dict[str, Any] = dict(mode=mode, coordinate_transformation_mode=ctm)
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    case.output = b.node("Resize", [x, "", scales], "resize", **attrs)


FAMILIES: dict[str, Callable[[np.random.Generator, _Builder, Case], None]] = {
    "conv2d": conv2d, "conv1d": conv1d, "conv3d": conv3d, "conv2d_transpose": conv2d_transpose,
    "conv1d_transpose": conv1d_transpose, "matmul": matmul, "pool": pool, "reduction": reduction,
    "normalization": normalization, "elementwise": elementwise, "transpose": transpose, "concat": concat,
    "resize": resize,
}
# Convolutions and matrix products carry the schedules most likely to be wrong: drawn more often.
WEIGHTS = {"conv2d": 4, "matmul": 2, "conv1d": 2, "conv2d_transpose": 2}


@dataclass
class Pack:
    """Cases compiled together under one set of options."""

    seed: int
    index: int
    options: dict[str, Any]
    cases: list[Case]
    dynamic_batch: bool = False
    """Each case's batched inputs take a dynamic first dim; the pack runs at two sizes of it."""

    @property
    def label(self) -> str:
        o = self.options
        return (f"seed{self.seed}-pack{self.index}-opt{o['opt_level']}-{o['set_channel_layout'] or 'default'}"
                f"{'-fp16' if o['set_float16'] else ''}{'-dynamic-batch' if self.dynamic_batch else ''}")

    def _dims(self, case: Case, slot: int, name: str, data: np.ndarray) -> list[int | str]:
        dims: list[int | str] = list(data.shape)
        if self.dynamic_batch and name in case.batched and dims:
            dims[0] = f"batch{slot}"
        return dims

    def model(self) -> onnx.ModelProto:
        nodes = [n for c in self.cases for n in c.nodes]
        inits = [i for c in self.cases for i in c.initializers]
        inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, self._dims(c, slot, name, data))
                  for slot, c in enumerate(self.cases) for name, data in c.inputs.items()]
        # Output shapes from onnx's shape inference.
        draft = helper.make_model(helper.make_graph(nodes, self.label, inputs, [], inits),
                                  opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(draft, strict_mode=True).graph.value_info}
        outputs = [inferred[c.output] for c in self.cases]
        return make_model(nodes, inputs, outputs, inits, name=self.label, opset=OPSET)

    def feeds(self, grow: int = 0) -> dict[str, np.ndarray]:
        """The inputs; with ``grow``, each batched input's first axis ``grow`` longer (new random data)."""
        feeds = {}
        for slot, case in enumerate(self.cases):
            rng = np.random.default_rng([self.seed, self.index, slot, grow])
            for name, data in case.inputs.items():
                if grow and self.dynamic_batch and name in case.batched:
                    data = rng.standard_normal((data.shape[0] + grow, *data.shape[1:])).astype(np.float32)
                feeds[name] = data
        return feeds


def make_case(seed: int, pack: int, slot: int, families: Sequence[str]) -> Case:
    rng = np.random.default_rng([seed, pack, slot])
    weights = np.array([WEIGHTS.get(f, 1) for f in families], float)
    family = str(rng.choice(list(families), p=weights / weights.sum()))
    case = Case(family, {})
    FAMILIES[family](rng, _Builder(rng, f"c{slot}", case), case)
    return case


def make_pack(seed: int, index: int, size: int = 6, families: Sequence[str] | None = None,
              dynamic_batch: bool = False) -> Pack:
    families = list(families or FAMILIES)
    # 7 is prime to the 30 option sets: consecutive packs walk through all of them.
    options = OPTIONS[(index * 7 + seed) % len(OPTIONS)]
    return Pack(seed, index, options, [make_case(seed, index, slot, families) for slot in range(size)],
                dynamic_batch)


@dataclass
class Failure:
    pack: str
    case: str
    detail: str


def run_pack(pack: Pack, artifact_dir: Path | None = None) -> list[Failure]:
    """Compile ``pack`` (into ``artifact_dir`` when given, else in memory), run it, compare with onnxruntime."""
    import onnxruntime as ort

    import forge
    from forge_core.compiler.compile import compile_to_function
    from forge_core.schedules.verify import verifying

    everything = ", ".join(c.describe() for c in pack.cases)
    # A dynamic-batch pack runs at its cases' sizes and at batches 2 longer: one artifact, two sizes.
    runs = [pack.feeds(), pack.feeds(grow=2)] if pack.dynamic_batch else [pack.feeds()]
    try:
        model = pack.model()
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = [session.run(None, feeds) for feeds in runs]
    except Exception as exc:  # noqa: BLE001 - a generator bug, not Forge's
        return [Failure(pack.label, everything, f"invalid case (onnx/onnxruntime rejects it): {exc}")]
    try:
        with verifying():
            ir = forge.from_onnx(model)
            if artifact_dir is not None:
                ir.compile(output_path=artifact_dir, force_overwrite=True, **pack.options)
                run = forge.Runtime(artifact_dir).infer
            else:
                run = compile_to_function(ir, **pack.options)
            got = [run(*[feeds[s.name] for s in ir.input_specs]) for feeds in runs]
            # The inference function too: its own schedule (schedules/reference_order.py), generic code, fp32.
            reference = ir.get_inference_function()
            checked = [reference(*[feeds[s.name] for s in ir.input_specs]) for feeds in runs]
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        return [Failure(pack.label, everything, f"{type(exc).__name__}: {exc}")]
    return (_compare(pack, expected, got, TOLERANCE[bool(pack.options["set_float16"])], "")
            + _compare(pack, expected, checked, TOLERANCE[False], " (inference function)"))


def _compare(pack: Pack, expected: list, got: list, tolerance: float, what: str) -> list[Failure]:
    failures = []
    for size, (wants, haves) in enumerate(zip(expected, got)):
        haves = haves if isinstance(haves, list) else [haves]
        at = f" (batches {2 * size} longer)" if size else ""
        for case, want, have in zip(pack.cases, wants, haves):
            have = np.asarray(have)
            if have.shape != want.shape:
                failures.append(Failure(pack.label, case.describe(),
                                        f"shape {have.shape}, onnxruntime {want.shape}{at}{what}"))
                continue
            scale = max(1.0, float(np.abs(want).max(initial=0.0)))
            error = float(np.abs(have.astype(np.float64) - want).max(initial=0.0))
            if not error <= tolerance * scale:  # NaN fails too
                failures.append(Failure(pack.label, case.describe(), f"max |error| {error:.3g} > "
                                        f"{tolerance * scale:.3g} (max |reference| {scale:.3g}){at}{what}"))
    return failures


def isolate(pack: Pack) -> list[Failure]:
    """Re-run a failed pack one case at a time, to name the cases that fail."""
    failures = []
    for case in pack.cases:
        failures += run_pack(Pack(pack.seed, pack.index, pack.options, [case], pack.dynamic_batch))
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--packs", type=int, default=10 ** 9, help="most packs (default: until --minutes)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=6, help="cases a pack")
    parser.add_argument("--first-pack", type=int, default=0)
    parser.add_argument("--pack", type=int, help="run just this pack (a failure's reproduction)")
    parser.add_argument("--families", help=f"comma-separated subset of: {', '.join(FAMILIES)}")
    parser.add_argument("--dynamic-batch", action="store_true", help="batched inputs take a dynamic first dim")
    args = parser.parse_args(argv)
    families = args.families.split(",") if args.families else None
    deadline = time.monotonic() + args.minutes * 60
    indices = [args.pack] if args.pack is not None else itertools.count(args.first_pack)
    cases = packs = 0
    failures: list[Failure] = []
    for index in indices:
        if packs >= args.packs or time.monotonic() > deadline:
            break
        pack = make_pack(args.seed, index, args.size, families, args.dynamic_batch)
        try:
            found = run_pack(pack)
        except Exception:  # noqa: BLE001
            found = [Failure(pack.label, "", traceback.format_exc())]
        if found:
            found = isolate(pack) or found
            for f in found:
                print(f"FAIL {f.pack}: {f.case}\n    {f.detail}\n    reproduce: --seed {args.seed} --pack {index} "
                      f"--size {args.size}", flush=True)
        failures += found
        packs += 1
        cases += len(pack.cases)
        print(f"pack {index} ({pack.label}): {len(pack.cases)} cases, {len(found)} failing", flush=True)
    print(f"{cases} cases in {packs} packs, {len(failures)} failing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
