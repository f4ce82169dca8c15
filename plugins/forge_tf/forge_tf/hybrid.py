"""TFLite's dynamic-range ("hybrid") quantization: int8 weights under float activations.

``TFLiteConverter`` with ``optimizations=[tf.lite.Optimize.DEFAULT]`` and no
representative dataset stores the weights of convolutions, transposed
convolutions, fully connected layers and batch matmuls as int8 with a scale
(per output channel, or per tensor), and keeps every activation float32.
(An embedding table it stores as int8 too, read by a GATHER of int8 values
and a DEQUANTIZE: a quantized GATHER, which TVM converts.) TVM's
converters compute a float op on float weights only, so Forge reads such a
weight as the float tensor it stands for, ``(q - zero_point) * scale`` along
the tensor's quantized dimension, and the op computes in float32.

This is the model's float function on its quantized weights, as TFLite's GPU
delegate computes it. TFLite's CPU kernels (its reference kernels and
XNNPACK's) also quantize each activation to int8 on the fly, which moves
their results by about one activation step (1/127 of its range) from the float
function, and the two CPU kernels differ from each other by as much.

Other ops with int8 weights under float activations (the hybrid LSTM, SVDF,
RNN and EMBEDDING_LOOKUP) stay refused by
:func:`forge_tf.operator_support.check_operators`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tflite.TensorType import TensorType

# The ops whose int8 constant inputs Forge reads as float weights when they run on float activations.
HYBRID_OPS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "BATCH_MATMUL"})
_INT_WEIGHT_TYPES = {TensorType.INT8: np.int8, TensorType.UINT8: np.uint8}
_FLOAT = TensorType.FLOAT32


def _is_constant(model: Any, tensor: Any) -> bool:
    buffer = model.Buffers(tensor.Buffer())
    return buffer is not None and buffer.DataLength() > 0


def _quantized_weight(model: Any, tensor: Any) -> bool:
    params = tensor.Quantization()
    return (tensor.Type() in _INT_WEIGHT_TYPES and params is not None and params.ScaleLength() > 0
            and _is_constant(model, tensor))


def is_hybrid_op(model: Any, subgraph: Any, op: Any, code: str) -> bool:
    """Whether ``op`` computes float outputs from int8 constant weights and unquantized run-time inputs, in an
    op whose int8 weights Forge reads as floats."""
    if code not in HYBRID_OPS or not op.InputsLength() or not op.OutputsLength():
        return False
    outputs = [int(i) for i in op.OutputsAsNumpy()]
    if any(o < 0 or subgraph.Tensors(o).Type() != _FLOAT for o in outputs):
        return False
    weights = 0
    for i in (int(i) for i in op.InputsAsNumpy()):
        if i < 0:
            continue
        tensor = subgraph.Tensors(i)
        if _quantized_weight(model, tensor):
            weights += 1
        elif not _is_constant(model, tensor) and tensor.Type() in _INT_WEIGHT_TYPES \
                and tensor.Quantization() is not None and tensor.Quantization().ScaleLength() > 0:
            return False  # a quantized activation: a full-integer op
    return weights > 0


def dequantized(model: Any, tensor: Any) -> np.ndarray:
    """The float32 values an int8 (or uint8) weight tensor stands for."""
    buffer = model.Buffers(tensor.Buffer())
    shape = [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else []
    values = np.frombuffer(buffer.DataAsNumpy().tobytes(), dtype=_INT_WEIGHT_TYPES[tensor.Type()]).reshape(shape)
    params = tensor.Quantization()
    scale = np.asarray(params.ScaleAsNumpy(), dtype=np.float64).reshape(-1)
    zero = (np.asarray(params.ZeroPointAsNumpy(), dtype=np.int64).reshape(-1)
            if params.ZeroPointLength() else np.zeros(1, np.int64))
    if scale.size > 1:  # per channel, along the quantized dimension
        along = [1] * len(shape)
        along[int(params.QuantizedDimension())] = scale.size
        scale = scale.reshape(along)
        zero = zero.reshape(along) if zero.size == scale.size else zero[0]
    else:
        scale, zero = scale[0], zero[0]
    return ((values.astype(np.int64) - zero) * scale).astype(np.float32)


def hybrid_weights(model: Any, subgraph: Any, codes: list[str]) -> set[int]:
    """The indices of the int8 weight tensors that only hybrid ops read (``codes``: each op's name)."""
    readers: dict[int, list[bool]] = {}
    for index in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(index)
        hybrid = is_hybrid_op(model, subgraph, op, codes[index])
        for i in (int(i) for i in op.InputsAsNumpy()) if op.InputsLength() else ():
            if i >= 0 and _quantized_weight(model, subgraph.Tensors(i)):
                readers.setdefault(i, []).append(hybrid)
    return {i for i, hybrid in readers.items() if all(hybrid)}


class FloatView:
    """A flatbuffer tensor as the float32, unquantized tensor it stands for (for TVM's converters)."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def Type(self) -> int:  # noqa: N802 - the flatbuffer's name
        return _FLOAT

    def Quantization(self) -> None:  # noqa: N802
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor, name)
