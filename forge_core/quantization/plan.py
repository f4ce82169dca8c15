"""Which operators of a model quantization touches, and which tensors calibration must watch.

The policy (documented in the README):

* **Quantized:** convolutions (1-3D, grouped and depthwise included) and
  matmuls with a constant weight (dense layers), each with its bias add; and,
  in static quantization, the adds and concats *between* them: every operand
  an activation, at least one coming from a quantized operator (through
  single-input operators such as ReLU, pooling or reshapes).
* **Kept float:** everything else: softmax, layer and batch norm, GELU,
  activation-by-activation matmuls (attention scores), reductions, and any
  operator named in ``exclude``. A float operator between two quantized ones
  simply sees dequantized values.

Calibration records the activation operands of these operators, so the plan
is computed the same way before calibration and at quantization.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import OptionError
from forge_core.graph.index import GraphIndex, NodeRecord, build_index, tensor_shape

CONV_OPS = ("nn.conv1d", "nn.conv2d", "nn.conv3d")
MATMUL_OPS = ("matmul",)
JOIN_OPS = ("add", "concat")


@dataclass
class QuantOp:
    """One operator to quantize, by node name.

    ``activations`` are its activation operands; ``weight`` its constant
    weight (``weight_axis``: the weight's output-channel axis), ``bias`` the
    add that applies its constant bias (``bias_constant``), and
    ``channel_axis`` its output's channel axis.
    """

    name: str
    kind: str  # "conv", "matmul", "add", "concat"
    activations: list[str]
    weight: str | None = None
    weight_axis: int | None = None
    bias: str | None = None
    bias_constant: str | None = None
    channel_axis: int | None = None

    @property
    def output(self) -> str:
        """The node holding the operator's result: its bias add if it has one (the name ONNX models give it)."""
        return self.bias or self.name


@dataclass
class QuantPlan:
    """The operators to quantize in ``main``, in topological order, and the index they refer to."""

    index: GraphIndex
    ops: list[QuantOp] = field(default_factory=list)

    @property
    def activations(self) -> list[str]:
        """Every activation tensor some quantized operator reads, each once, in order."""
        seen: dict[str, None] = {}
        for op in self.ops:
            for name in op.activations:
                seen.setdefault(name, None)
        return list(seen)

    def constant_value(self, name: str, params: Mapping[str, Any]) -> np.ndarray:
        record = self.index.records[name]
        if record.param is not None:
            value = params[record.param]
            return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        return record.expr.value.numpy()


def _is_activation(record: NodeRecord) -> bool:
    return record.type in ("input", "call") and isinstance(record.ty, relax.TensorType) \
        and str(record.ty.dtype) == "float32" and tensor_shape(record.ty) is not None


def _is_constant(record: NodeRecord) -> bool:
    return record.type == "constant" and isinstance(record.ty, relax.TensorType) \
        and str(record.ty.dtype) == "float32"


def _layout_axis(layout: Any, letter: str) -> int:
    return str(layout).index(letter)


def _bias_add(index: GraphIndex, op_name: str, channel_axis: int) -> tuple[str, str] | None:
    """The add right after ``op_name`` that adds a per-channel constant, if it is the op's only consumer."""
    consumers = index.succ(op_name)
    if len(consumers) != 1:
        return None
    add = index.records[consumers[0]]
    if add.op_name != "add" or len(add.pred) != 2 or add.pred[0] != op_name:
        return None
    constant = index.records[add.pred[1]]
    if not _is_constant(constant):
        return None
    out_shape, bias_shape = tensor_shape(index.records[op_name].ty), tensor_shape(constant.ty)
    if out_shape is None or bias_shape is None or len(bias_shape) > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - len(bias_shape)) + tuple(bias_shape)
    channels = out_shape[channel_axis]
    if any(size != (channels if axis == channel_axis % len(out_shape) else 1) for axis, size in enumerate(padded)):
        return None
    return add.name, constant.name


def _weighted_op(index: GraphIndex, record: NodeRecord) -> QuantOp | None:
    records = index.records
    if len(record.pred) != 2:
        return None
    data, weight = records[record.pred[0]], records[record.pred[1]]
    if not _is_activation(data) or not _is_constant(weight):
        return None
    if record.op_name in CONV_OPS:
        kind = "conv"
        weight_axis = _layout_axis(record.attrs["kernel_layout"], "O")
        channel_axis = _layout_axis(record.attrs.get("out_layout") or record.attrs["data_layout"], "C")
    else:
        shape = tensor_shape(weight.ty)
        if shape is None or len(shape) != 2:
            return None
        kind, weight_axis, channel_axis = "matmul", 1, len(tensor_shape(record.ty) or (0,)) - 1
    op = QuantOp(record.name, kind, [data.name], weight.name, weight_axis, channel_axis=channel_axis)
    bias = _bias_add(index, record.name, channel_axis)
    if bias is not None:
        op.bias, op.bias_constant = bias
    return op


def build_plan(mod: tvm.IRModule, params: Mapping[str, Any], *, joins: bool = True,
               exclude: Iterable[str] = ()) -> QuantPlan:
    """The quantization plan of ``mod["main"]``.

    Args:
        mod: The module.
        params: Its weights held outside the IR.
        joins: Also quantize the adds and concats between quantized operators (static quantization).
        exclude: Node names to keep float (an operator's own node or its bias add's).

    Raises:
        ValueError: A name in ``exclude`` is not a node of ``main`` (close names are suggested).
    """
    index = build_index("main", mod["main"], params)
    excluded = set(exclude)
    unknown = sorted(excluded - set(index.records))
    if unknown:
        hints = {name: difflib.get_close_matches(name, list(index.records), n=3) for name in unknown}
        detail = "; ".join(f"{name!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
                           for name, close in hints.items())
        raise OptionError(f"exclude names nodes that main does not have: {detail}")
    plan = QuantPlan(index)
    quantized_source: set[str] = set()  # nodes whose value comes from a quantized operator
    bias_adds: set[str] = set()
    for name, record in index.records.items():
        if record.type != "call":
            continue
        op: QuantOp | None = None
        if record.op_name in CONV_OPS + MATMUL_OPS and name not in excluded:
            op = _weighted_op(index, record)
            if op is not None and op.output in excluded:
                op = None
        elif joins and record.op_name in JOIN_OPS and name not in excluded and name not in bias_adds:
            operands = [index.records[p] for p in record.pred]
            if len(operands) >= 2 and all(_is_activation(r) for r in operands) \
                    and any(r.name in quantized_source for r in operands):
                op = QuantOp(name, record.op_name, [r.name for r in operands])
        if op is not None:
            plan.ops.append(op)
            quantized_source.add(name)
            if op.bias is not None:
                bias_adds.add(op.bias)
                quantized_source.add(op.bias)
            continue
        activations = [p for p in record.pred if _is_activation(index.records[p])]
        if len(activations) == 1 and activations[0] in quantized_source:
            quantized_source.add(name)
    return plan
