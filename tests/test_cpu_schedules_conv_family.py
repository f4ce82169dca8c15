"""The convolution family's CPU rules against onnxruntime: transposed, 1D and 3D convolutions, pools.

Each test packs many cases into one ONNX model (separate inputs and outputs,
so fusion never crosses two cases): one compile checks every shape and fusion
context, at ``opt_level`` 3 (epilogues fused into the convolution) and 0 (no
fusion: the convolution alone writes its output). Every case's operator must
be taken by its rule; the numbers must match onnxruntime within 1e-4 of the
output's largest magnitude. The suite also runs in verification mode
(conftest), which checks each scheduled function against its unscheduled form.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_factory import IR_VERSION, OPSET
from onnx import TensorProto, helper, numpy_helper

import forge

# Epilogues: none, bias, bias + ReLU, residual add, bias + residual add.
EPILOGUES = ("none", "bias", "bias_relu", "residual", "bias_residual")


@dataclass
class Case:
    """One operator of a packed model: its ONNX node, attributes and fused epilogue."""

    op: str
    shape: list[int]
    attrs: dict = field(default_factory=dict)
    weight: list[int] | None = None
    epilogue: str = "none"
    channels_out: int = 0


def conv(op: str, shape, channels_out: int, kernel, epilogue="none", groups=1, **attrs) -> Case:
    rank = len(shape) - 2
    kernel = [kernel] * rank if isinstance(kernel, int) else list(kernel)
    cin = shape[1]
    weight = [cin, channels_out // groups, *kernel] if op == "ConvTranspose" else [channels_out, cin // groups, *kernel]
    return Case(op, list(shape), dict(kernel_shape=kernel, group=groups, **attrs), weight, epilogue, channels_out)


def pool(op: str, shape, kernel, epilogue="none", **attrs) -> Case:
    kernel = [kernel] * (len(shape) - 2) if isinstance(kernel, int) else list(kernel)
    return Case(op, list(shape), dict(kernel_shape=kernel, **attrs), epilogue=epilogue)


def pack(cases: list[Case], seed: int = 0) -> onnx.ModelProto:
    """One model computing every case from its own input; residual inputs get the output's shape."""
    rng = np.random.default_rng(seed)
    nodes, inputs, inits, outputs = [], [], [], []
    for i, case in enumerate(cases):
        x, y = f"x{i}", f"y{i}"
        inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, case.shape))
        args = [x]
        if case.weight is not None:
            fan_in = int(np.prod(case.weight[1:]))
            w = rng.standard_normal(case.weight) / np.sqrt(fan_in)
            inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
            args.append(f"w{i}")
            if case.epilogue.startswith("bias"):
                inits.append(numpy_helper.from_array(rng.standard_normal(case.channels_out).astype(np.float32),
                                                     f"b{i}"))
                args.append(f"b{i}")
        relu, residual = case.epilogue.endswith("relu"), case.epilogue.endswith("residual")
        op_out = f"op{i}" if relu or residual else y
        nodes.append(helper.make_node(case.op, args, [op_out], name=f"{case.op.lower()}{i}", **case.attrs))
        if relu:
            nodes.append(helper.make_node("Relu", [op_out], [y], name=f"relu{i}"))
        if residual:
            nodes.append(helper.make_node("Add", [op_out, f"r{i}"], [y], name=f"add{i}"))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))

    def model(extra_inputs):
        graph = helper.make_graph(nodes, "conv_family", inputs + extra_inputs, outputs, inits)
        built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
        return onnx.shape_inference.infer_shapes(built, strict_mode=True)

    inferred = model([])
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.output)}
    residuals = [helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, shapes[f"op{i}"])
                 for i, case in enumerate(cases) if case.epilogue.endswith("residual")]
    built = model(residuals)
    onnx.checker.check_model(built)
    return built


def compile_and_compare(model: onnx.ModelProto, opt_level: int, tmp_path, caplog) -> dict[str, int]:
    """Compile at ``opt_level``, compare every output with onnxruntime; the rule counts of the schedule log."""
    rng = np.random.default_rng(1)
    feeds = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        forge.from_onnx(model).compile(output_path=tmp_path / f"o{opt_level}", opt_level=opt_level)
    runtime = forge.Runtime(tmp_path / f"o{opt_level}")
    got = runtime.infer(*[feeds[name] for name in runtime.input_names])
    for name, want, have in zip(runtime.output_names, expected, got):
        assert have.shape == want.shape, name
        scale = max(float(np.abs(want).max()), 1.0)
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4 * scale, err_msg=name)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("schedules:"))
    return {rule: int(n) for rule, n in re.findall(r"(\w+) (\d+)", line)}


# Functions are counted per distinct PrimFunc: no two cases of a pack share an operator configuration.


def _epilogue(i: int) -> str:
    return EPILOGUES[i % len(EPILOGUES)]


# ConvTranspose: strides 1-4, kernels 1-8, padding, output_padding, groups, odd sizes, 1D and 2D. The
# DBNet head's (24 -> 24 and 24 -> 1, kernel 2, stride 2) and wide rows take the pixel tile, channel
# counts of whole vectors on narrow rows the channel tile.
TRANSPOSE_CASES = [
    conv("ConvTranspose", s, f, k, _epilogue(i), g, **a) for i, (s, f, k, g, a) in enumerate([
        ([1, 24, 16, 32], 24, 2, 1, dict(strides=[2, 2])),
        ([1, 24, 16, 32], 1, 2, 1, dict(strides=[2, 2])),
        ([1, 8, 7, 9], 5, 3, 1, dict(strides=[1, 1], pads=[1, 1, 1, 1])),
        ([1, 6, 5, 11], 16, 4, 1, dict(strides=[2, 2], pads=[1, 1, 1, 1])),
        ([1, 5, 6, 7], 12, 3, 1, dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
        ([1, 4, 5, 6], 8, 3, 1, dict(strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[0, 1])),
        ([1, 3, 4, 8], 4, 4, 1, dict(strides=[4, 4])),
        ([1, 3, 3, 5], 7, 8, 1, dict(strides=[4, 4], pads=[2, 2, 2, 2], output_padding=[3, 1])),
        ([1, 4, 5, 5], 6, 5, 1, dict(strides=[3, 3], pads=[2, 2, 2, 2], output_padding=[2, 0])),
        ([1, 4, 6, 9], 3, (3, 2), 1, dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2])),
        # Three channel blocks, rows of stride 4 after a begin padding: see conv_transpose._split_rows.
        ([2, 8, 12, 9], 48, (3, 2), 1, dict(strides=[4, 2], pads=[1, 0, 2, 1], output_padding=[0, 1])),
        ([2, 4, 5, 16], 32, 2, 1, dict(strides=[2, 2])),
        ([1, 12, 5, 7], 32, 3, 1, dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
        ([1, 8, 6, 16], 8, 4, 8, dict(strides=[2, 2], pads=[1, 1, 1, 1])),
        ([1, 8, 5, 7], 8, 3, 8, dict(strides=[2, 2], pads=[1, 1, 1, 1])),
        ([1, 6, 5, 9], 4, 3, 2, dict(strides=[2, 2], pads=[0, 0, 0, 0])),
        ([1, 8, 37], 6, 3, 1, dict(strides=[2], pads=[1, 1], output_padding=[1])),
        ([1, 4, 32], 2, 4, 1, dict(strides=[2], pads=[1, 1])),
        ([2, 16, 9], 32, 5, 1, dict(strides=[3], pads=[2, 2])),
        ([1, 8, 33], 8, 4, 8, dict(strides=[4], pads=[0, 0])),
        ([1, 6, 20], 4, 1, 2, dict(strides=[1], pads=[0, 0])),
    ])
]

# Conv1d and Conv3d, groups=1 (ConvNCX): short rows in batches of frames (a voice-activity detector's),
# strides, dilation, channel counts no vector divides (18, 33: padded), odd sizes.
CONV_CASES = [
    conv("Conv", s, f, k, _epilogue(i), **a) for i, (s, f, k, a) in enumerate([
        ([8, 1, 96], 18, 32, dict(strides=[16], pads=[8, 8])),
        ([8, 17, 4], 32, 3, dict(pads=[1, 1])),
        ([8, 32, 4], 16, 3, dict(strides=[2], pads=[1, 1])),
        ([8, 16, 1], 32, 3, dict(pads=[1, 1])),
        ([1, 8, 50], 16, 1, {}),
        ([2, 5, 37], 24, 5, dict(pads=[4, 4], dilations=[2])),
        ([1, 16, 45], 3, 3, dict(pads=[1, 1])),
        ([3, 4, 9], 33, 4, dict(strides=[3])),
        ([1, 3, 4, 6, 7], 16, 3, dict(pads=[1] * 6)),
        ([1, 4, 5, 5, 9], 8, 3, dict(strides=[2, 2, 2], pads=[1] * 6)),
        ([2, 3, 3, 4, 5], 18, 2, {}),
    ])
]

# Grouped and depthwise Conv1d/Conv3d (GroupedConvNCX).
GROUPED_CASES = [
    conv("Conv", s, f, k, _epilogue(i), g, **a) for i, (s, f, k, g, a) in enumerate([
        ([1, 16, 50], 16, 3, 16, dict(pads=[1, 1])),
        ([2, 8, 33], 8, 5, 8, dict(strides=[2], pads=[2, 2])),
        ([1, 12, 40], 24, 3, 4, dict(pads=[2, 2], dilations=[2])),
        ([4, 32, 7], 32, 3, 32, dict(pads=[1, 1])),
        ([1, 8, 5, 6, 7], 8, 3, 8, dict(pads=[1] * 6)),
        ([1, 8, 4, 5, 6], 16, 2, 4, dict(strides=[2, 2, 2])),
    ])
]

# Windowed pools (WindowPoolNCX): max and average, 1-3 dimensions, strides, padding, ceil mode, odd sizes;
# an activation or a residual add fuses after the pool.
POOL_CASES = [
    pool("MaxPool", [1, 16, 28, 28], 3, strides=[2, 2], pads=[1, 1, 1, 1]),
    pool("MaxPool", [1, 16, 26, 26], 3, "relu", strides=[2, 2], pads=[1, 1, 1, 1]),
    pool("MaxPool", [1, 8, 15, 13], 2, strides=[2, 2]),
    pool("AveragePool", [1, 8, 15, 12], 2, "residual", strides=[2, 2]),
    pool("MaxPool", [1, 8, 9, 11], 3, strides=[1, 1], pads=[1, 1, 1, 1]),
    pool("MaxPool", [1, 4, 11, 10], (3, 2), strides=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1),
    pool("AveragePool", [1, 8, 14, 14], 2, strides=[2, 2]),
    pool("AveragePool", [1, 8, 15, 15], 3, strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0),
    pool("AveragePool", [1, 8, 9, 7], 3, strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1),
    pool("MaxPool", [2, 8, 50], 3, strides=[2], pads=[1, 1]),
    pool("AveragePool", [1, 8, 41], 4, strides=[4]),
    pool("MaxPool", [1, 4, 6, 10, 9], 2, strides=[2, 2, 2]),
]


# Reductions over trailing axes (PlaneReduction): global pools, squeeze-and-excite means, a mean over
# the last axis; an activation or a residual add fuses after them.
REDUCTION_CASES = [
    Case("GlobalAveragePool", [1, 24, 20, 16]),
    Case("GlobalAveragePool", [2, 12, 9, 8], epilogue="relu"),
    Case("GlobalMaxPool", [1, 16, 12, 12]),
    Case("GlobalMaxPool", [1, 10, 8, 6], epilogue="residual"),
    Case("ReduceMean", [2, 5, 64], dict(axes=[2], keepdims=0)),
    Case("ReduceMax", [3, 4, 6, 10], dict(axes=[2, 3], keepdims=1)),
    Case("ReduceMean", [1, 1, 4096], dict(axes=[2], keepdims=1), epilogue="relu"),
]


@pytest.mark.parametrize("opt_level", [3, 0])
@pytest.mark.parametrize("cases, rule", [
    (TRANSPOSE_CASES, "ConvTransposeNCHW"),
    (CONV_CASES, "ConvNCX"),
    (GROUPED_CASES, "GroupedConvNCX"),
    (POOL_CASES, "WindowPoolNCX"),
    (REDUCTION_CASES, "PlaneReduction"),
], ids=["conv_transpose", "conv1d_conv3d", "grouped_conv1d_conv3d", "windowed_pools", "plane_reductions"])
def test_each_operator_is_taken_by_its_rule_and_matches_onnxruntime(cases, rule, opt_level, tmp_path, caplog):
    counts = compile_and_compare(pack(cases), opt_level, tmp_path, caplog)
    assert counts.get(rule) == len(cases), counts
    assert not {"Generic", "Reduction"} & counts.keys(), counts

