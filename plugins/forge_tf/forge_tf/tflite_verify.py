"""Checking a TFLite flatbuffer before Forge, the ``tflite`` package or TVM reads it.

The ``tflite`` package reads a flatbuffer without checking it: an offset, a
vector length or an index that a corrupted file gets wrong surfaces later as
``struct.error``, ``IndexError``, ``TypeError`` or a garbage value deep in a
converter. :func:`verify_tflite` walks every table of the model (operator
codes, buffers, subgraphs, tensors with their quantization and sparsity,
operators, signatures, metadata) with the checks of the FlatBuffers verifier
that TFLite's interpreter runs (offsets, alignment, vtables, vector bounds,
NUL-terminated strings), and then what the schema cannot say: the schema
version 3, every index in range, operator codes that mean one operator to
every reader, every tensor type known, shapes non-negative, each constant's
data as long as its shape and type need and free of NaN, quantization
parameters usable (per-axis and bias zero points 0), every operator's inputs
written before it reads them, and for the common operators the number and the
types of their inputs and outputs, which TFLite's kernels check when the
interpreter prepares them. It raises one
:class:`~forge_core.errors.InvalidModelError` naming the subgraph, tensor,
operator or buffer and the field that is wrong.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator
from tflite.TensorType import TensorType

from forge_core.errors import InvalidModelError

_TENSOR_TYPES = {value: name for name, value in vars(TensorType).items() if isinstance(value, int)}
_BUILTIN_NAMES = {value: name for name, value in vars(BuiltinOperator).items() if isinstance(value, int)}
# Bytes per element of the types whose constants have a fixed size (STRING, RESOURCE, VARIANT and the
# packed INT4 do not).
_ITEM_SIZES = {
    TensorType.FLOAT32: 4, TensorType.FLOAT16: 2, TensorType.INT32: 4, TensorType.UINT8: 1, TensorType.INT64: 8,
    TensorType.BOOL: 1, TensorType.INT16: 2, TensorType.COMPLEX64: 8, TensorType.INT8: 1, TensorType.FLOAT64: 8,
    TensorType.COMPLEX128: 16, TensorType.UINT64: 8, TensorType.UINT32: 4, TensorType.UINT16: 2,
    TensorType.BFLOAT16: 2,
}
# The zero points a quantized type can hold.
_ZERO_POINT_RANGES = {TensorType.INT8: (-128, 127), TensorType.UINT8: (0, 255), TensorType.INT16: (-32768, 32767),
                      TensorType.UINT16: (0, 65535), TensorType.INT4: (-8, 7)}
_FLOAT_DTYPES = {TensorType.FLOAT32: np.float32, TensorType.FLOAT16: np.float16, TensorType.FLOAT64: np.float64}
_SPARSE_INDEX_SIZES = {1: 4, 2: 2, 3: 1}  # SparseIndexVector: Int32Vector, Uint16Vector, Uint8Vector
_MAX_OFFSET = (1 << 31) - 1  # FlatBuffers offsets are signed 32-bit in the verifier
_SCHEMA_VERSION = 3  # tensorflow/lite/version.h: TFLITE_SCHEMA_VERSION
_PLACEHOLDER_FOR_GREATER_OP_CODES = BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES
# Types that quantization scales apply to (integers; INT32 and INT64 for biases).
_QUANTIZABLE_TYPES = {TensorType.INT8, TensorType.UINT8, TensorType.INT16, TensorType.UINT16, TensorType.INT32,
                      TensorType.INT64, TensorType.INT4}


class _Reader:
    """Bounds- and alignment-checked reads of one flatbuffer; each failure names ``source`` and the place."""

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.source = source

    def fail(self, where: str, what: str) -> NoReturn:
        raise InvalidModelError(f"{self.source} is not a valid TFLite flatbuffer: {where}: {what}")

    def scalar(self, pos: int, fmt: str, where: str) -> int | float:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            self.fail(where, f"it reads {size} bytes at offset {pos}, outside the {len(self.data)} bytes")
        if pos % size:
            self.fail(where, f"its {size}-byte value at offset {pos} is misaligned")
        return struct.unpack_from(fmt, self.data, pos)[0]

    def follow(self, pos: int, where: str) -> int:
        """The position a ``uoffset`` at ``pos`` points to, checked."""
        offset = int(self.scalar(pos, "<I", where))
        target = pos + offset
        if offset == 0 or offset > _MAX_OFFSET or target >= len(self.data):
            self.fail(where, f"its offset {offset} at byte {pos} points outside the {len(self.data)} bytes")
        return target

    def table(self, pos: int, where: str) -> _Table:
        """The table at ``pos``, its vtable checked."""
        soffset = int(self.scalar(pos, "<i", where))
        vtable = pos - soffset
        if vtable < 0 or vtable + 4 > len(self.data) or vtable % 2:
            self.fail(where, f"its vtable offset points to byte {vtable}, outside the {len(self.data)} bytes")
        vtable_size = int(self.scalar(vtable, "<H", where))
        table_size = int(self.scalar(vtable + 2, "<H", where))
        if vtable_size < 4 or vtable_size % 2 or vtable + vtable_size > len(self.data):
            self.fail(where, f"its vtable has an invalid size {vtable_size}")
        if table_size < 4 or pos + table_size > len(self.data):
            self.fail(where, f"its size {table_size} runs past the end of the {len(self.data)} bytes")
        return _Table(self, pos, vtable, vtable_size, table_size, where)


@dataclass(frozen=True)
class _Table:
    """One table of the flatbuffer: where it is, and its vtable."""

    reader: _Reader
    pos: int
    vtable: int
    vtable_size: int
    table_size: int
    where: str

    def _field(self, slot: int, size: int, name: str) -> int | None:
        """The absolute position of a field, or None when absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vtable_size:
            return None
        offset = int(self.reader.scalar(self.vtable + entry, "<H", self.where))
        if offset == 0:
            return None
        if offset + size > self.table_size:
            self.reader.fail(self.where, f"field {name!r} lies outside its table")
        return self.pos + offset

    def scalar(self, slot: int, fmt: str, name: str, default: int | float = 0) -> int | float:
        pos = self._field(slot, struct.calcsize(fmt), name)
        return default if pos is None else self.reader.scalar(pos, fmt, f"{self.where}, field {name!r}")

    def _target(self, slot: int, name: str) -> int | None:
        pos = self._field(slot, 4, name)
        return None if pos is None else self.reader.follow(pos, f"{self.where}, field {name!r}")

    def vector(self, slot: int, item_size: int, name: str) -> tuple[int, int]:
        """``(start, length)`` of a vector field; ``(0, 0)`` when absent."""
        target = self._target(slot, name)
        if target is None:
            return 0, 0
        length = int(self.reader.scalar(target, "<I", f"{self.where}, field {name!r}"))
        start = target + 4
        if start + length * item_size > len(self.reader.data):
            self.reader.fail(self.where, f"field {name!r} has {length} elements of {item_size} bytes, which run past "
                             f"the end of the {len(self.reader.data)} bytes")
        return start, length

    def numbers(self, slot: int, fmt: str, name: str) -> list[int | float]:
        start, length = self.vector(slot, struct.calcsize(fmt), name)
        return list(struct.unpack_from(f"<{length}{fmt.lstrip('<')}", self.reader.data, start)) if length else []

    def string(self, slot: int, name: str) -> str | None:
        start, length = self.vector(slot, 1, name)
        if start == 0:
            return None
        data = self.reader.data
        if start + length >= len(data) or data[start + length] != 0:
            self.reader.fail(self.where, f"string field {name!r} is not NUL-terminated")
        try:
            return data[start:start + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            self.reader.fail(self.where, f"string field {name!r} is not UTF-8: {exc}")

    def tables(self, slot: int, name: str, item: str) -> list[_Table]:
        """The tables of a vector-of-tables field, each checked; ``item`` names one (``"tensor"``)."""
        start, length = self.vector(slot, 4, name)
        prefix = "" if self.where == "model" else f"{self.where}, "
        return [self.reader.table(self.reader.follow(start + 4 * i, f"{prefix}{item} {i}"), f"{prefix}{item} {i}")
                for i in range(length)]

    def subtable(self, slot: int, name: str) -> _Table | None:
        target = self._target(slot, name)
        return None if target is None else self.reader.table(target, f"{self.where}, {name}")


# ----------------------------------------------------------------------------------------------------
# The tables, field by field (slots in the order of tensorflow/lite/schema/schema.fbs)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    index: int
    label: str
    is_constant: bool
    """It holds data, or has no element (an empty tensor reads as a constant)."""
    is_variable: bool
    type: int
    shape: tuple[int, ...]
    has_data: bool = False
    """Its buffer holds data: no operator may write it. An empty tensor may be an operator's output (SPLIT_V
    with a split of size 0: the interpreter runs it)."""


def _check_quantization(table: _Table, where: str, shape: list[int], tensor_type: int) -> None:
    quant = table.subtable(4, "quantization")
    if quant is None:
        return
    quant.numbers(0, "<f", "min")
    quant.numbers(1, "<f", "max")
    scales = quant.numbers(2, "<f", "scale")
    zero_points = [int(z) for z in quant.numbers(3, "<q", "zero_point")]
    details_type = int(quant.scalar(4, "<B", "details_type"))
    details = quant.subtable(5, "details")
    if details is not None and details_type == 1:  # CustomQuantization
        details.vector(0, 1, "custom")
    dimension = int(quant.scalar(6, "<i", "quantized_dimension"))
    if not scales:
        return
    if len(zero_points) != len(scales):
        table.reader.fail(where, f"its quantization has {len(scales)} scales and {len(zero_points)} zero points")
    if tensor_type not in _QUANTIZABLE_TYPES:
        table.reader.fail(where, f"it has quantization scales, but its type {_TENSOR_TYPES[tensor_type]} is not an "
                          "integer type")
    bad = [s for s in scales if not (math.isfinite(s) and s > 0)]
    if bad:
        table.reader.fail(where, f"its quantization scale {bad[0]} is not positive and finite")
    low, high = _ZERO_POINT_RANGES.get(tensor_type, (0, 0))  # biases (INT32, INT64) are symmetric
    if len(scales) > 1:
        low, high = 0, 0  # per-axis quantization is symmetric (TFLite's quantization spec; TVM requires it)
    bad_zero = [z for z in zero_points if not low <= z <= high]
    if bad_zero:
        table.reader.fail(where, f"its quantization zero_point {bad_zero[0]} is outside the range "
                          f"[{low}, {high}] of {'per-axis ' if len(scales) > 1 else ''}"
                          f"{_TENSOR_TYPES[tensor_type]} quantization")
    if len(scales) > 1:
        if not 0 <= dimension < len(shape):
            table.reader.fail(where, f"its quantized_dimension {dimension} is not an axis of its shape {shape}")
        if shape[dimension] != len(scales):
            table.reader.fail(where, f"its quantization has {len(scales)} scales for the {shape[dimension]} "
                              f"channels of axis {dimension}")


def _check_sparsity(table: _Table) -> None:
    sparsity = table.subtable(6, "sparsity")
    if sparsity is None:
        return
    sparsity.numbers(0, "<i", "traversal_order")
    sparsity.numbers(1, "<i", "block_map")
    for dim in sparsity.tables(2, "dim_metadata", "dim_metadata"):
        dim.scalar(0, "<b", "format")
        dim.scalar(1, "<i", "dense_size")
        for type_slot, slot, name in ((2, 3, "array_segments"), (4, 5, "array_indices")):
            index_type = int(dim.scalar(type_slot, "<B", f"{name}_type"))
            vector = dim.subtable(slot, name)
            if vector is not None:
                if index_type not in _SPARSE_INDEX_SIZES:
                    table.reader.fail(dim.where, f"field '{name}_type' is {index_type}, no SparseIndexVector")
                vector.vector(0, _SPARSE_INDEX_SIZES[index_type], "values")


def _check_tensor(table: _Table, index: int, buffers: list[tuple[int, int]]) -> _Tensor:
    reader = table.reader
    name = table.string(3, "name")
    where = f"{table.where} ({name!r})" if name else table.where
    shape = [int(d) for d in table.numbers(0, "<i", "shape")]
    tensor_type = int(table.scalar(1, "<b", "type"))
    buffer = int(table.scalar(2, "<I", "buffer"))
    is_variable = bool(table.scalar(5, "<B", "is_variable"))
    signature = [int(d) for d in table.numbers(7, "<i", "shape_signature")]
    table.scalar(8, "<B", "has_rank")
    for variant in table.tables(9, "variant_tensors", "variant tensor"):
        variant.numbers(0, "<i", "shape")
        variant.scalar(1, "<b", "type")
    _check_sparsity(table)
    if tensor_type not in _TENSOR_TYPES:
        reader.fail(where, f"its type {tensor_type} is no TFLite TensorType")
    if any(d < 0 for d in shape):
        reader.fail(where, f"its shape {shape} has a negative dimension")
    if any(d < -1 for d in signature) or (signature and len(signature) != len(shape)):
        reader.fail(where, f"its shape_signature {signature} does not fit its shape {shape}")
    if buffer >= len(buffers):
        reader.fail(where, f"its buffer index {buffer} is out of range: the model has {len(buffers)} buffers")
    _check_quantization(table, where, shape, tensor_type)
    start, size = buffers[buffer]
    item_size = _ITEM_SIZES.get(tensor_type)
    if size and item_size is not None and table.subtable(6, "sparsity") is None:
        expected = math.prod(shape) * item_size
        if size != expected:
            reader.fail(where, f"its shape {shape} and type {_TENSOR_TYPES[tensor_type]} need {expected} bytes of "
                        f"data; its buffer {buffer} holds {size}")
        if tensor_type in _FLOAT_DTYPES and np.isnan(
                np.frombuffer(reader.data, _FLOAT_DTYPES[tensor_type], size // item_size, start)).any():
            reader.fail(where, "its constant data holds NaN")
    empty_constant = item_size is not None and math.prod(shape) == 0
    label = f"tensor {index} ({name!r})" if name else f"tensor {index}"
    return _Tensor(index, label, size > 0 or empty_constant, is_variable, tensor_type, tuple(shape), size > 0)


def _check_operator(op: _Table, codes: list[str], file_size: int) -> str:
    """The operator's code name, after checking its fields' structure."""
    opcode = int(op.scalar(0, "<I", "opcode_index"))
    if opcode >= len(codes):
        op.reader.fail(op.where, f"its opcode_index {opcode} is out of range: the model has {len(codes)} "
                       "operator codes")
    op.scalar(3, "<B", "builtin_options_type")
    op.subtable(4, "builtin_options")
    op.vector(5, 1, "custom_options")
    op.scalar(6, "<b", "custom_options_format")
    op.vector(7, 1, "mutating_variable_inputs")
    offset, size = int(op.scalar(9, "<Q", "large_custom_options_offset")), int(op.scalar(10, "<Q", "large_custom_"
                                                                                        "options_size"))
    if offset > 1 and offset + size > file_size:
        op.reader.fail(op.where, f"its large custom options at offset {offset}, {size} bytes, lie past the end of "
                       f"the {file_size} bytes")
    op.scalar(11, "<B", "builtin_options_2_type")
    op.subtable(12, "builtin_options_2")
    return codes[opcode]


def _check_subgraph(table: _Table, codes: list[str], buffers: list[tuple[int, int]]) -> int:
    """The subgraph's tensor count, after checking it."""
    reader = table.reader
    table.string(4, "name")
    tensors = [_check_tensor(t, i, buffers) for i, t in enumerate(table.tables(0, "tensors", "tensor"))]
    count = len(tensors)

    def checked(where: str, field: str, indices: list[int | float], optional: bool) -> list[int]:
        for position, value in enumerate(indices):
            if not (-1 if optional else 0) <= int(value) < count:
                reader.fail(where, f"{field}[{position}] is tensor index {int(value)}, out of range: the subgraph "
                            f"has {count} tensors")
        return [int(v) for v in indices]

    where = table.where
    inputs = checked(where, "inputs", table.numbers(1, "<i", "inputs"), False)
    outputs = checked(where, "outputs", table.numbers(2, "<i", "outputs"), False)
    readable = {t.index for t in tensors if t.is_constant}
    written = set(inputs) | {t.index for t in tensors if t.has_data or t.is_variable}
    for op in table.tables(3, "operators", "operator"):
        code = _check_operator(op, codes, len(reader.data))
        op_where = f"{op.where} ({code})"
        checked(op_where, "intermediates", op.numbers(8, "<i", "intermediates"), False)
        op_inputs = checked(op_where, "inputs", op.numbers(1, "<i", "inputs"), True)
        for tensor in op_inputs:
            if tensor >= 0 and tensor not in written and tensor not in readable:
                reader.fail(op_where, f"it reads {tensors[tensor].label}, which is neither an input of the "
                            "subgraph, a constant nor the output of an earlier operator")
        op_outputs = checked(op_where, "outputs", op.numbers(2, "<i", "outputs"), False)
        for tensor in op_outputs:
            if tensor in written:
                reader.fail(op_where, f"it writes {tensors[tensor].label}, which is already an input, a constant "
                            "or the output of an earlier operator")
            written.add(tensor)
        problem = _type_problem(code, [tensors[i] if i >= 0 else None for i in op_inputs],
                                [tensors[i] for i in op_outputs])
        if problem is not None:
            reader.fail(op_where, problem)
    for tensor in outputs:
        if tensor not in written and tensor not in readable:
            reader.fail(where, f"its output {tensors[tensor].label} is written by no operator")
    table.scalar(5, "<i", "debug_metadata_index")
    return count


# -- the types an operator takes (TFLite's kernels check them when the interpreter prepares the model) --------

# Ops whose first input and first output have one type (quantized ones too).
_TYPE_PRESERVING = frozenset({
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "MAX_POOL_2D", "AVERAGE_POOL_2D", "L2_POOL_2D", "LOG_SOFTMAX",
    "LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "HARD_SWISH", "ELU", "GELU",
    "PRELU", "MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "PAD", "PADV2", "MIRROR_PAD", "STRIDED_SLICE",
    "SLICE", "GATHER", "GATHER_ND", "TILE", "BROADCAST_TO", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "SPACE_TO_BATCH_ND",
    "BATCH_TO_SPACE_ND", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "NEG", "ABS", "SQRT", "RSQRT", "EXP", "LOG",
    "SIN", "COS", "FLOOR", "CEIL", "ROUND", "SQUARE", "REVERSE_V2", "L2_NORMALIZATION",
    "LOCAL_RESPONSE_NORMALIZATION", "ZEROS_LIKE", "CUMSUM", "SPLIT_V", "UNPACK",
})
# Ops whose inputs and outputs all have one type.
_ONE_TYPE = frozenset({"ADD", "SUB", "DIV", "FLOOR_DIV", "FLOOR_MOD", "MAXIMUM", "MINIMUM", "POW",
                       "SQUARED_DIFFERENCE", "CONCATENATION", "PACK", "ADD_N"})
_COMPARISONS = frozenset({"LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"})
# Convolution-like ops: positions of their data, weights and bias inputs.
_WEIGHTED = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2), "FULLY_CONNECTED": (0, 1, 2),
             "TRANSPOSE_CONV": (2, 1, 3)}
# The weights a quantized input takes (int16 activations with int8 weights: TFLite's "16x8").
_QUANTIZED_WEIGHTS = {TensorType.INT8: {TensorType.INT8, TensorType.INT4}, TensorType.UINT8: {TensorType.UINT8},
                      TensorType.INT16: {TensorType.INT8}}
_FLOATS = {TensorType.FLOAT32, TensorType.FLOAT16}
# How many input entries an op has (an optional one is there as -1), for ops whose kernels read them blindly.
_ARITY = {
    "CONV_2D": (3,), "DEPTHWISE_CONV_2D": (3,), "FULLY_CONNECTED": (2, 3), "TRANSPOSE_CONV": (3, 4),
    "STRIDED_SLICE": (4,), "SLICE": (3,), "GATHER": (2,), "SELECT": (3,), "SELECT_V2": (3,), "PADV2": (3,),
    **{code: (2,) for code in ("ADD", "SUB", "MUL", "DIV", "FLOOR_DIV", "FLOOR_MOD", "MAXIMUM", "MINIMUM", "POW",
                               "SQUARED_DIFFERENCE", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL",
                               "NOT_EQUAL", "MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "PAD",
                               "TRANSPOSE", "EXPAND_DIMS", "TILE", "EMBEDDING_LOOKUP", "BATCH_MATMUL")},
    **{code: (1,) for code in ("SOFTMAX", "LOGISTIC", "TANH", "RELU", "RELU6", "MAX_POOL_2D", "AVERAGE_POOL_2D",
                               "SQUEEZE", "SHAPE", "QUANTIZE", "DEQUANTIZE", "CAST", "NEG", "ABS", "SQRT", "RSQRT",
                               "EXP", "LOG", "FLOOR", "CEIL", "HARD_SWISH", "LEAKY_RELU", "ELU", "GELU")},
}


def _type_problem(code: str, inputs: list[_Tensor | None], outputs: list[_Tensor]) -> str | None:
    """Why an operator's tensor types do not fit it, or None (also for ops not described here)."""

    def named(tensor: _Tensor) -> str:
        return f"{tensor.label} of type {_TENSOR_TYPES[tensor.type]}"

    def differ(tensors: list[_Tensor]) -> str | None:
        kinds = {t.type for t in tensors}
        return None if len(kinds) <= 1 else f"its tensors must have one type: {', '.join(map(named, tensors))}"

    if code in _ARITY and len(inputs) not in _ARITY[code]:
        wanted = " or ".join(map(str, _ARITY[code]))
        return f"it has {len(inputs)} inputs; {code} takes {wanted} (an optional one given as -1)"
    present = [t for t in inputs if t is not None]
    if code == "STRIDED_SLICE" and any(len(t.shape) != 1 for t in present[1:]):
        bad = next(t for t in present[1:] if len(t.shape) != 1)
        return f"its begin, end and strides must be vectors; {bad.label} has the shape {list(bad.shape)}"
    if code in _TYPE_PRESERVING and present and outputs:
        return differ([present[0], outputs[0]])
    if code in _ONE_TYPE:
        return differ(present + outputs)
    if code in ("SELECT", "SELECT_V2") and len(present) == 3:
        return differ(present[1:] + outputs) or (
            None if present[0].type == TensorType.BOOL else f"its condition {named(present[0])} is not BOOL")
    if code in _COMPARISONS:
        if any(t.type != TensorType.BOOL for t in outputs):
            return f"its output {named(outputs[0])} is not BOOL"
        return differ(present)
    if code in _WEIGHTED:
        positions = _WEIGHTED[code]
        data, weights, bias = (inputs[i] if i < len(inputs) else None for i in positions)
        if data is None or weights is None or not outputs:
            return None
        if data.type in _QUANTIZED_WEIGHTS:
            allowed_weights, allowed_bias = _QUANTIZED_WEIGHTS[data.type], {TensorType.INT32, TensorType.INT64}
        elif data.type in _FLOATS:
            # Float weights, or int8 ones of a dynamic-range quantized model (reported as unsupported).
            allowed_weights, allowed_bias = _FLOATS | {TensorType.INT8, TensorType.UINT8, TensorType.INT4}, _FLOATS
        else:
            return f"its input {named(data)} is neither float nor quantized"
        if outputs[0].type != data.type:
            return f"its output {named(outputs[0])} differs from its input {named(data)}"
        if weights.type not in allowed_weights:
            return f"its weights {named(weights)} do not fit its input {named(data)}"
        if bias is not None and bias.type not in allowed_bias:
            return f"its bias {named(bias)} does not fit its input {named(data)}"
    return None


def _operator_code(table: _Table) -> str:
    deprecated, code = int(table.scalar(0, "<b", "deprecated_builtin_code")), int(table.scalar(3, "<i", "builtin_code"))
    # TFLite reads max(deprecated_builtin_code, builtin_code); the tflite package and TVM read
    # deprecated_builtin_code below 127. Writers set both (127 in the old field for codes above it), or only
    # the old one: the two must agree, or the file means different operators to different readers.
    if code and deprecated != min(code, _PLACEHOLDER_FOR_GREATER_OP_CODES):
        table.reader.fail(table.where, f"its deprecated_builtin_code {deprecated} and builtin_code {code} disagree")
    builtin = max(deprecated, code)
    custom = table.string(1, "custom_code")
    table.scalar(2, "<i", "version")
    if builtin == BuiltinOperator.CUSTOM:
        return custom or "CUSTOM"
    return _BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}")


def _buffer_span(table: _Table, file_size: int) -> tuple[int, int]:
    """Where a buffer's data is in the file: ``(start, size)``; size 0 when it has none."""
    start, length = table.vector(0, 1, "data")
    offset, size = int(table.scalar(1, "<Q", "offset")), int(table.scalar(2, "<Q", "size"))
    if offset > 1 and offset + size > file_size:
        table.reader.fail(table.where, f"its data at offset {offset}, {size} bytes, lies past the end of the "
                          f"{file_size} bytes")
    return (start, length) if length else ((offset, size) if offset > 1 else (0, 0))


def _check_signatures(model: _Table, tensor_counts: list[int]) -> None:
    for signature in model.tables(7, "signature_defs", "signature"):
        signature.string(2, "signature_key")
        subgraph = int(signature.scalar(4, "<I", "subgraph_index"))
        if subgraph >= len(tensor_counts):
            model.reader.fail(signature.where, f"its subgraph_index {subgraph} is out of range: the model has "
                              f"{len(tensor_counts)} subgraphs")
        for slot, name in ((0, "inputs"), (1, "outputs")):
            for entry in signature.tables(slot, name, name[:-1]):
                entry.string(0, "name")
                tensor = int(entry.scalar(1, "<I", "tensor_index"))
                if tensor >= tensor_counts[subgraph]:
                    model.reader.fail(entry.where, f"its tensor_index {tensor} is out of range: subgraph {subgraph} "
                                      f"has {tensor_counts[subgraph]} tensors")


def verify_tflite(data: bytes, source: str) -> None:
    """Raise :class:`InvalidModelError` unless ``data`` is a well-formed TFLite flatbuffer.

    ``source`` names the data in the message (``"the given bytes"``, a path).
    """
    reader = _Reader(data, source)
    model = reader.table(reader.follow(0, "the root offset"), "model")
    version = int(model.scalar(0, "<I", "version"))
    if version != _SCHEMA_VERSION:
        reader.fail("model", f"its schema version is {version}; TFLite reads version {_SCHEMA_VERSION} only")
    codes = [_operator_code(t) for t in model.tables(1, "operator_codes", "operator code")]
    model.string(3, "description")
    buffers = [_buffer_span(t, len(data)) for t in model.tables(4, "buffers", "buffer")]
    model.numbers(5, "<i", "metadata_buffer")
    for metadata in model.tables(6, "metadata", "metadata"):
        metadata.string(0, "name")
        buffer = int(metadata.scalar(1, "<I", "buffer"))
        if buffer >= len(buffers):
            reader.fail(metadata.where, f"its buffer index {buffer} is out of range: the model has "
                        f"{len(buffers)} buffers")
    subgraphs = model.tables(2, "subgraphs", "subgraph")
    if not subgraphs:
        reader.fail("model", "it has no subgraph")
    tensor_counts = [_check_subgraph(subgraph, codes, buffers) for subgraph in subgraphs]
    _check_signatures(model, tensor_counts)
