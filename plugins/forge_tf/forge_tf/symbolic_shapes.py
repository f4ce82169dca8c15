"""Shape arithmetic on dynamic dimensions, evaluated while TVM's TFLite importer converts a model.

A graph traced with a dynamic batch computes some shapes at run time: Keras's
``Dense`` on a sequence reshapes through ``SHAPE -> GATHER -> REDUCE_PROD ->
PACK -> RESHAPE``, ``Flatten`` through ``SHAPE -> STRIDED_SLICE -> PACK``,
attention with a dynamic sequence length through ``UNSORTED_SEGMENT_PROD``.
TVM's importer turns ``SHAPE`` into a tensor and then cannot build the
``RESHAPE`` from it. :class:`SymbolicShapes` evaluates these small integer
computations on TIR expressions instead (``batch * 8``), so the ``RESHAPE``
gets a symbolic shape. It steps in only where a value comes from a ``SHAPE``
(static or not: TVM's ``RESHAPE`` cannot take a shape computed at run time,
so Keras's ``Flatten`` failed even on a static model); everything else goes
through TVM's converters unchanged.

It also carries fixes to TVM 0.27's converters that matter for dynamic
shapes: ``EXPAND_DIMS`` (which calls ``relax.op.expand_dims`` with a stray
argument and always fails), ``BATCH_MATMUL`` (whose broadcast calls ``int()``
on every dimension), and the ``to_int_list`` that ``FULLY_CONNECTED``
applies to its input shape (see :func:`symbolic_int_lists`).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.tflite import tflite_frontend

from forge_core.errors import ModelImportError

_INT_TYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8)


@dataclass(frozen=True)
class ShapeValue:
    """An integer tensor of rank 0 or 1 whose elements are known TIR expressions."""

    values: tuple[Any, ...]
    rank: int

    @property
    def is_static(self) -> bool:
        return all(isinstance(v, tirx.IntImm) for v in self.values)


def _imm(value: Any) -> Any:
    return value if tvm.ir.is_prim_expr(value) else tirx.IntImm("int64", int(value))


def _simplify(value: Any) -> Any:
    return tvm.sym.Analyzer().simplify(value)


def _show(dims: Any) -> str:
    """Dimensions as a user reads them: ``(batch, 3, 3)``."""
    shown = [str(int(d)) if isinstance(d, tirx.IntImm) else re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(d))
             for d in dims]
    return "(" + ", ".join(shown) + ("," if len(shown) == 1 else "") + ")"


def _tolerant_to_int_list(np_array: Any) -> list[Any]:
    """``to_int_list`` that keeps a dimension that is not a constant as its TIR expression."""
    result = []
    for x in np_array:
        if tvm.ir.is_prim_expr(x) and not isinstance(x, tirx.IntImm):
            result.append(x)
        else:
            result.append(int(x))
    return result


@contextlib.contextmanager
def symbolic_int_lists() -> Iterator[None]:
    """While converting, let TVM's ``to_int_list`` pass symbolic dimensions through.

    TVM's converters call ``to_int_list`` on shapes (``FULLY_CONNECTED`` with
    ``keep_num_dims`` rebuilds its output shape from its input's), which raises
    on a symbolic batch. The tolerant version is installed in TVM's TFLite
    frontend module for the duration of one import only.
    """
    original = tflite_frontend.to_int_list
    tflite_frontend.to_int_list = _tolerant_to_int_list
    try:
        yield
    finally:
        tflite_frontend.to_int_list = original


class SymbolicShapes:
    """Mixin for TVM's ``OperatorConverter``: shape arithmetic on dynamic dimensions (see the module doc)."""

    # Set by OperatorConverter.
    subgraph: Any
    model: Any

    _SYMBOLIC_OPS = ("SHAPE", "GATHER", "STRIDED_SLICE", "REDUCE_PROD", "UNSORTED_SEGMENT_PROD", "PACK",
                     "CONCATENATION", "CAST", "RESHAPE")

    def _init_symbolic_shapes(self) -> None:
        self._shape_values: dict[int, ShapeValue] = {}

    def symbolic_converter(self, code: str) -> Callable[[Any], Any] | None:
        """The symbolic converter of an op type, or None."""
        if code not in self._SYMBOLIC_OPS:
            return None
        return getattr(self, f"_symbolic_{code.lower()}")

    # -- values ----------------------------------------------------------------

    def _known(self, tensor: Any) -> ShapeValue | None:
        """An input's value when Forge knows it: a recorded shape value, or a small integer constant."""
        if tensor.tensor_idx in self._shape_values:
            return self._shape_values[tensor.tensor_idx]
        if tensor.tensor_idx < 0 or self.has_expr(tensor.tensor_idx) or tensor.buffer.DataLength() == 0:
            return None
        value = np.asarray(self.get_tensor_value(tensor))
        if value.dtype.type not in _INT_TYPES or value.ndim > 1:
            return None
        return ShapeValue(tuple(_imm(v) for v in value.reshape(-1)), value.ndim)

    def _record(self, op: Any, value: ShapeValue, dtype: str) -> Any:
        """Record the op's output value; return it as a Relax tensor for converters that read it."""
        output = self.get_output_tensors(op)[0]
        self._shape_values[output.tensor_idx] = value
        tensor = relax.op.shape_to_tensor(relax.ShapeExpr([_simplify(v) for v in value.values]))
        if value.rank == 0:
            tensor = relax.op.reshape(tensor, [])
        return relax.op.astype(tensor, dtype) if dtype != "int64" else tensor

    def _output_dtype(self, op: Any) -> str:
        return self.get_tensor_type_str(self.get_output_tensors(op)[0].tensor.Type())

    def _inputs_known(self, op: Any) -> list[ShapeValue] | None:
        """Every input's value, when all are known and one at least comes from a dynamic ``SHAPE``."""
        inputs = self.get_input_tensors(op)
        if not any(t.tensor_idx in self._shape_values for t in inputs):
            return None
        values = [self._known(t) for t in inputs]
        if any(v is None for v in values):
            return None
        return values  # type: ignore[return-value]

    def _options(self, op: Any, options_class: type) -> Any:
        """The op's builtin options as ``options_class``; None when absent or of another type."""
        from tflite.BuiltinOptions import BuiltinOptions

        table = op.BuiltinOptions()
        if table is None or op.BuiltinOptionsType() != getattr(BuiltinOptions, options_class.__name__):
            return None
        options = options_class()
        options.Init(table.Bytes, table.Pos)
        return options

    def _same_types(self, op: Any) -> bool:
        """Whether every input has the output's type (TFLite's PACK and CONCATENATION require it)."""
        output = self.get_output_tensors(op)[0].tensor.Type()
        return all(t.tensor.Type() == output for t in self.get_input_tensors(op))

    # -- the ops -----------------------------------------------------------------

    def _symbolic_shape(self, op: Any) -> Any:
        """SHAPE, recorded even when static: TVM's RESHAPE cannot take a shape computed from its tensor."""
        from tflite.ShapeOptions import ShapeOptions
        from tflite.TensorType import TensorType

        inputs, options = self.get_input_tensors(op), self._options(op, ShapeOptions)
        out_type = self.get_output_tensors(op)[0].tensor.Type()
        if len(inputs) != 1 or options is None or options.OutType() != out_type \
                or out_type not in (TensorType.INT32, TensorType.INT64):
            return None  # TVM's converter checks these (and the output's type is then checked)
        expr = self.get_tensor_expr(inputs[0])
        shape = getattr(self.bb.normalize(expr).ty, "shape", None)
        if shape is None:
            return None
        return self._record(op, ShapeValue(tuple(shape.values), 1), self._output_dtype(op))

    def _symbolic_gather(self, op: Any) -> Any:
        from tflite.GatherOptions import GatherOptions

        values = self._inputs_known(op)
        options = self._options(op, GatherOptions)
        if values is None or values[0].rank != 1 or options is None or options.Axis() not in (0, -1):
            return None
        data, indices = values
        picked = tuple(data.values[int(i)] for i in indices.values)
        return self._record(op, ShapeValue(picked, indices.rank), self._output_dtype(op))

    def _symbolic_strided_slice(self, op: Any) -> Any:
        from tflite.StridedSliceOptions import StridedSliceOptions

        values = self._inputs_known(op)
        options = self._options(op, StridedSliceOptions)
        if values is None or options is None or values[0].rank != 1 or options.EllipsisMask() \
                or options.NewAxisMask() or any(len(v.values) != 1 for v in values[1:]):
            return None
        data = list(values[0].values)
        begin, end, stride = (int(v.values[0]) for v in values[1:])
        if options.ShrinkAxisMask() & 1:
            return self._record(op, ShapeValue((data[begin],), 0), self._output_dtype(op))
        start = None if options.BeginMask() & 1 else begin
        stop = None if options.EndMask() & 1 else end
        return self._record(op, ShapeValue(tuple(data[start:stop:stride]), 1), self._output_dtype(op))

    def _symbolic_reduce_prod(self, op: Any) -> Any:
        from tflite.ReducerOptions import ReducerOptions

        values = self._inputs_known(op)
        options = self._options(op, ReducerOptions)
        if values is None or len(values) != 2 or values[0].rank != 1 or options is None \
                or [int(v) for v in values[1].values] not in ([0], [-1]):
            return None
        product = functools.reduce(operator.mul, values[0].values, _imm(1))
        rank = 1 if options.KeepDims() else 0
        return self._record(op, ShapeValue((_simplify(product),), rank), self._output_dtype(op))

    def _symbolic_unsorted_segment_prod(self, op: Any) -> Any:
        """Products of groups of dimensions (how TFLite merges the heads axes of an attention output)."""
        values = self._inputs_known(op)
        if values is None or len(values) != 3 or values[0].rank != 1 or len(values[2].values) != 1:
            return None
        data, segments, count = values
        products = [_imm(1)] * int(count.values[0])
        for value, segment in zip(data.values, segments.values):
            products[int(segment)] = products[int(segment)] * value
        return self._record(op, ShapeValue(tuple(_simplify(p) for p in products), 1), self._output_dtype(op))

    def _symbolic_pack(self, op: Any) -> Any:
        from tflite.PackOptions import PackOptions

        values = self._inputs_known(op)
        options = self._options(op, PackOptions)
        if values is None or any(v.rank != 0 for v in values) or options is None or options.Axis() != 0 \
                or options.ValuesCount() != len(values) or not self._same_types(op):
            return None
        return self._record(op, ShapeValue(tuple(v.values[0] for v in values), 1), self._output_dtype(op))

    def _symbolic_concatenation(self, op: Any) -> Any:
        from tflite.ConcatenationOptions import ConcatenationOptions

        values = self._inputs_known(op)
        options = self._options(op, ConcatenationOptions)
        if values is None or any(v.rank != 1 for v in values) or options is None or options.Axis() not in (0, -1) \
                or options.FusedActivationFunction() != 0 or not self._same_types(op):
            return None
        joined = tuple(item for v in values for item in v.values)
        return self._record(op, ShapeValue(joined, 1), self._output_dtype(op))

    def _symbolic_cast(self, op: Any) -> Any:
        values = self._inputs_known(op)
        dtype = self._output_dtype(op)
        if values is None or not dtype.startswith(("int", "uint")):
            return None
        return self._record(op, values[0], dtype)

    def _symbolic_reshape(self, op: Any) -> Any:
        """RESHAPE to a shape computed from dynamic dimensions, or with a -1 beside a dynamic input dimension."""
        inputs = self.get_input_tensors(op)
        if len(inputs) != 2:
            return None
        target = self._known(inputs[1])
        if target is None and inputs[1].tensor_idx >= 0 and self.has_expr(inputs[1].tensor_idx):
            # TVM's converter builds a ShapeExpr of whatever it is given, and fails on a tensor computed at run time.
            raise ModelImportError(f"its new shape, tensor {inputs[1].tensor.Name().decode(errors='replace')!r}, is "
                                   "computed from values known only at run time; Relax needs it at import")
        data = self.get_tensor_expr(inputs[0])
        shape = getattr(self.bb.normalize(data).ty, "shape", None)
        if target is None or shape is None:
            return None
        dynamic_input = any(not isinstance(d, tirx.IntImm) for d in shape.values)
        dims = list(target.values)
        has_wildcard = any(isinstance(d, tirx.IntImm) and int(d) == -1 for d in dims)
        computed = inputs[1].tensor_idx in self._shape_values
        if target.is_static and not computed and not (dynamic_input and has_wildcard):
            return None
        if self.get_input_tensors(op)[0].qnn_params:
            return None
        total = functools.reduce(operator.mul, shape.values, _imm(1))
        if has_wildcard:
            known = functools.reduce(
                operator.mul, [d for d in dims if not (isinstance(d, tirx.IntImm) and int(d) == -1)], _imm(1))
            dims = [tirx.floordiv(total, known) if isinstance(d, tirx.IntImm) and int(d) == -1 else d for d in dims]
        dims = [_simplify(_imm(d)) for d in dims]
        # Relax checks a reshape of symbolic shapes neither here nor when it runs: one that changed the number of
        # elements would read past its input (a corrupt model, or one only valid for some batch sizes).
        count = functools.reduce(operator.mul, dims, _imm(1))
        if not tvm.sym.Analyzer().can_prove_equal(count, total):
            raise ModelImportError(f"RESHAPE of the shape {_show(shape.values)}, {_show([_simplify(total)])[1:-2]} "
                                   f"elements, to {_show(dims)}, {_show([_simplify(count)])[1:-2]} elements: the "
                                   "counts are not equal for every size of the dynamic dimensions")
        return relax.op.reshape(data, relax.ShapeExpr(dims))

    # -- converters TVM 0.27 writes for static shapes only ------------------------

    def get_tensor_shape(self, tensor_wrapper: Any) -> Any:
        """A tensor's shape with its dynamic dimensions as TIR expressions.

        TVM's converters read shapes from the flatbuffer, which stores a
        dynamic dimension as 1 (``shape_signature`` has the -1): a converter
        would then silently compute for a batch of 1. Where the signature says
        a dimension is dynamic and the tensor already has a Relax expression,
        the shape comes from that expression instead.
        """
        tensor = tensor_wrapper.tensor
        if tensor_wrapper.tensor_idx >= 0 and tensor.ShapeSignatureLength() > 0 \
                and (tensor.ShapeSignatureAsNumpy() < 0).any() and self.has_expr(tensor_wrapper.tensor_idx):
            shape = getattr(self.bb.normalize(self.get_expr(tensor_wrapper.tensor_idx)).ty, "shape", None)
            if shape is not None:
                return np.array([int(d) if isinstance(d, tirx.IntImm) else d for d in shape.values], dtype=object)
        return super().get_tensor_shape(tensor_wrapper)  # type: ignore[misc]

    def convert_batch_matmul(self, op: Any) -> Any:
        """BATCH_MATMUL: Relax's ``matmul`` broadcasts batch dimensions as TFLite does.

        TVM's converter computes the broadcast with ``int()`` on every dimension (a dynamic batch fails), and
        reads both operands as computed tensors: one that is a constant (onnx-tf's exports) failed with
        ``KeyError: 'Const'``. Quantized ones still take TVM's converter.
        """
        from tflite.BatchMatMulOptions import BatchMatMulOptions

        inputs = self.get_input_tensors(op)
        if len(inputs) != 2 or self.is_quantized(op):
            return super().convert_batch_matmul(op)  # type: ignore[misc]
        a, b = (self.get_tensor_expr(t) for t in inputs)
        shapes = [getattr(self.bb.normalize(x).ty, "shape", None) for x in (a, b)]
        if any(s is None for s in shapes):
            return super().convert_batch_matmul(op)  # type: ignore[misc]
        options = self._options(op, BatchMatMulOptions)
        if options is not None and options.AdjX():
            a = relax.op.permute_dims(a, [*range(len(shapes[0].values) - 2), -1, -2])  # type: ignore[union-attr]
        if options is not None and options.AdjY():
            b = relax.op.permute_dims(b, [*range(len(shapes[1].values) - 2), -1, -2])  # type: ignore[union-attr]
        return relax.op.matmul(a, b)

    # -- a fix to TVM 0.27 --------------------------------------------------------

    def convert_expand_dims(self, op: Any) -> Any:
        """TFLite EXPAND_DIMS (TVM 0.27's converter passes ``expand_dims`` a third argument and always fails)."""
        inputs = self.get_input_tensors(op)
        if len(inputs) != 2:
            raise tvm.error.OpNotImplemented("EXPAND_DIMS expects two inputs")
        if inputs[0].qnn_params and not self.has_same_qnn_params(inputs[0], self.get_output_tensors(op)[0]):
            raise tvm.error.OpNotImplemented("quantized EXPAND_DIMS needs equal input and output quantization")
        axis = np.asarray(self.get_tensor_value(inputs[1])).reshape(-1)
        if axis.size != 1:
            raise tvm.error.OpNotImplemented("EXPAND_DIMS takes one axis")
        return relax.op.expand_dims(self.get_tensor_expr(inputs[0]), int(axis[0]))
