"""Reading a TFLite model from what the user hands over, and the facts Forge needs from it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tflite
from tflite.TensorType import TensorType

from forge_core.errors import InvalidModelError, OptionTypeError, PathNotFoundError
from forge_tf.tflite_verify import verify_tflite

_FILE_IDENTIFIER = b"TFL3"

_DTYPES = {
    TensorType.FLOAT32: "float32", TensorType.FLOAT16: "float16", TensorType.FLOAT64: "float64",
    TensorType.INT8: "int8", TensorType.UINT8: "uint8", TensorType.INT16: "int16", TensorType.UINT16: "uint16",
    TensorType.INT32: "int32", TensorType.UINT32: "uint32", TensorType.INT64: "int64",
    TensorType.UINT64: "uint64", TensorType.BOOL: "bool", TensorType.STRING: "string",
    TensorType.COMPLEX64: "complex64",
}
_QUANTIZED_TYPES = {TensorType.INT8, TensorType.UINT8, TensorType.INT16}


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output, as the flatbuffer declares it."""

    index: int
    name: str
    shape: tuple[int, ...]
    """The static shape the flatbuffer stores (a dynamic batch is stored as 1)."""
    signature: tuple[int, ...]
    """``shape_signature``: -1 where the converter knew the dimension is dynamic."""
    dtype: str


@dataclass(frozen=True)
class TFLiteModel:
    """A parsed TFLite flatbuffer, with its bytes when Forge has them."""

    model: Any
    """The ``tflite.Model``; with resource variables, seen with their state as inputs and outputs
    (:mod:`forge_tf.resource_variables`)."""
    buffer: bytes
    state: tuple[Any, ...] = ()
    """The :class:`~forge_tf.resource_variables.StateVariable` s, whose inputs and outputs follow the model's."""

    @property
    def subgraph(self) -> Any:
        return self.model.Subgraphs(0)

    def tensor_info(self, index: int) -> TensorInfo:
        tensor = self.subgraph.Tensors(index)
        shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
        signature = tuple(int(d) for d in tensor.ShapeSignatureAsNumpy()) if tensor.ShapeSignatureLength() else shape
        return TensorInfo(index, tensor_name(self.subgraph, index), shape, signature,
                          _DTYPES.get(tensor.Type(), f"tflite type {tensor.Type()}"))

    @property
    def inputs(self) -> list[TensorInfo]:
        return [self.tensor_info(int(i)) for i in self.subgraph.InputsAsNumpy()] if self.subgraph.InputsLength() else []

    @property
    def outputs(self) -> list[TensorInfo]:
        subgraph = self.subgraph
        return [self.tensor_info(int(i)) for i in subgraph.OutputsAsNumpy()] if subgraph.OutputsLength() else []

    @property
    def is_quantized(self) -> bool:
        """Whether the model computes on int8/uint8/int16 quantized tensors (full-integer quantization);
        int8 weights that only hybrid ops read (:mod:`forge_tf.hybrid`) are float weights stored small."""
        from forge_tf.hybrid import hybrid_weights
        from forge_tf.operator_support import operator_code

        for s in range(self.model.SubgraphsLength()):
            subgraph = self.model.Subgraphs(s)
            codes = [operator_code(self.model, subgraph.Operators(i)) for i in range(subgraph.OperatorsLength())]
            hybrid = hybrid_weights(self.model, subgraph, codes)
            for t in range(subgraph.TensorsLength()):
                if t in hybrid:
                    continue
                tensor = subgraph.Tensors(t)
                params = tensor.Quantization()
                if tensor.Type() in _QUANTIZED_TYPES and params is not None and params.ScaleLength() > 0:
                    return True
        return False


def tensor_name(subgraph: Any, index: int) -> str:
    """A tensor's name, as TVM's TFLite importer names it."""
    name = subgraph.Tensors(index).Name()
    return name.decode("utf-8") if name is not None else f"tvmgen_tensor_{index}"


def stored_array(model: Any, subgraph: Any, index: int) -> np.ndarray | None:
    """The value a constant tensor stores, in its own type (a quantized tensor's integers); None when it
    stores none or a type numpy has no dtype for."""
    tensor = subgraph.Tensors(index)
    dtype = _DTYPES.get(tensor.Type())
    buffer = model.Buffers(tensor.Buffer())
    if dtype in (None, "string", "complex64") or buffer is None or buffer.DataLength() == 0:
        return None
    shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
    data = buffer.DataAsNumpy().tobytes()
    if len(data) != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
        return None
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def parse_tflite(buffer: bytes, source: str) -> TFLiteModel:
    """Parse and check TFLite flatbuffer bytes; ``source`` names them in errors."""
    if len(buffer) < 8 or buffer[4:8] != _FILE_IDENTIFIER:
        raise InvalidModelError(
            f"Not a TFLite model ({source}): a TFLite flatbuffer carries the identifier 'TFL3' at bytes 4-8; "
            f"found {bytes(buffer[4:8])!r}"
        )
    # The tflite package reads without bounds checks: a corrupt offset or index would surface later as a
    # struct.error or IndexError deep in a converter. verify_tflite names the field that is wrong instead.
    verify_tflite(bytes(buffer), source)
    from forge_tf.resource_variables import explicit_state

    model, state = explicit_state(tflite.Model.GetRootAsModel(buffer, 0))
    return TFLiteModel(model, bytes(buffer), state)


def read_tflite(model: Any) -> TFLiteModel:
    """A :class:`TFLiteModel` from bytes, a path to a ``.tflite`` file, or a parsed ``tflite.Model``."""
    if isinstance(model, tflite.Model):
        return parse_tflite(bytes(model._tab.Bytes), "the given tflite.Model")
    if isinstance(model, (bytes, bytearray, memoryview)):
        return parse_tflite(bytes(model), "the given bytes")
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise PathNotFoundError(f"TFLite model file {str(path)!r} does not exist")
        return parse_tflite(path.read_bytes(), repr(str(path)))
    raise OptionTypeError(
        f"from_tflite expects the bytes of a .tflite flatbuffer, a path to one, or a tflite.Model, "
        f"not {type(model).__name__}"
    )
