"""Shape, Size and Constant: static values become constants, so that the arithmetic on them folds.

TVM's importer turns ``Shape`` into a Relax shape value, which most operators
cannot take ("cannot handle ShapeExpr inputs"). When the input's shape is
static, Forge emits an int64 constant instead; dynamic shapes still go to TVM.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from tvm import relax, tirx

from forge_onnx.converters import ConverterContext


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The dims of a tensor expression whose shape is fully static, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = []
    for value in ty.shape.values:
        if not isinstance(value, tirx.IntImm):
            return None
        dims.append(int(value.value))
    return dims


def shape(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Shape: an int64 constant for a static input shape (``start``/``end`` honoured)."""
    dims = static_shape(inputs[0])
    if dims is None:
        return context.tvm_convert("Shape", inputs)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    selected = dims[start:] if end is None else dims[start:int(end)]
    return relax.const(np.array(selected, dtype=np.int64), "int64")


def size(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Size: an int64 scalar constant for a static input shape."""
    dims = static_shape(inputs[0])
    if dims is None:
        return context.tvm_convert("Size", inputs)
    return relax.const(np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64), "int64")


_SCALAR_ATTRS = {
    "value_float": np.float32,
    "value_int": np.int64,
}
_LIST_ATTRS = {
    "value_floats": np.float32,
    "value_ints": np.int64,
}


def constant(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
             context: ConverterContext) -> relax.Expr:
    """Constant, from any of its value attributes (tensor, sparse tensor, scalars, lists)."""
    if "value" in attrs:
        array = numpy_helper.to_array(attrs["value"])
    elif "sparse_value" in attrs:
        sparse: onnx.SparseTensorProto = attrs["sparse_value"]
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices)
        array = np.zeros(tuple(sparse.dims), dtype=values.dtype)
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, array.shape)
        array.reshape(-1)[flat] = values
    else:
        for name, dtype in _SCALAR_ATTRS.items():
            if name in attrs:
                array = np.array(attrs[name], dtype=dtype)
                break
        else:
            for name, dtype in _LIST_ATTRS.items():
                if name in attrs:
                    array = np.array(list(attrs[name]), dtype=dtype)
                    break
            else:
                raise ValueError(f"Constant has no supported value attribute (given: {', '.join(attrs) or 'none'})")
    if array.dtype == object:
        raise ValueError("string constants are not supported")
    return relax.const(array, str(array.dtype))  # relax.const alone narrows int64 to int32


CONVERTERS = {"Shape": shape, "Size": size, "Constant": constant}


def center_crop_pad(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                    context: ConverterContext) -> relax.Expr:
    """CenterCropPad to a constant shape: crop centered (extra on the end), pad with zeros centered."""
    x, target = inputs[0], inputs[1]
    dims = static_shape(x)
    if dims is None or not hasattr(target, "value"):
        raise ValueError("CenterCropPad needs a static input shape and a constant target shape")
    sizes = [int(v) for v in np.asarray(target.value.numpy()).reshape(-1)]
    rank = len(dims)
    axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
    begin, end, pads = [], [], [0] * (2 * rank)
    for axis, size in zip(axes, sizes):
        current = dims[axis]
        if size < current:
            start = (current - size) // 2
            begin.append(start)
            end.append(start + size)
        else:
            begin.append(0)
            end.append(current)
            before = (size - current) // 2
            pads[2 * axis], pads[2 * axis + 1] = before, size - current - before
    cropped = bb.emit(relax.op.strided_slice(x, axes=axes, begin=begin, end=end))
    if any(pads):
        return relax.op.nn.pad(cropped, pads, pad_value=0.0)
    return cropped


CONVERTERS["CenterCropPad"] = center_crop_pad
