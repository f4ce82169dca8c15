"""Gather, GatherElements, GatherND, ScatterElements and ScatterND: indices checked when the model runs.

TVM's kernels for these read (or write) wherever an index points: its ``take`` runs in "fast" mode, with no
bounds check. An index outside its axis gave a wrong number without a word (a Gather of row 10 from 10 rows
returned 0.0, the memory after the table) or a segfault (row 100000000); a scatter wrote past its buffer.
onnxruntime refuses such a run ("indices element out of data bounds"). Forge does too: the indices that are
not constants are checked when the model runs (the count of those outside ``[-n, n-1]``, ``n`` the extent of
the axis they index, must be 0), and the runtime raises :class:`~forge_core.errors.InputError` naming the
node, the axis and its extent (:data:`~forge_core.runtime.signature.RUN_TIME_CHECK`). Constant indices within
range cost nothing; out of range, they get the same check (it fails when the node runs, as in onnxruntime,
and not at import, since a node in an If branch not taken never runs). The check is one pass over the
indices, not over the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax, tirx

from forge_core.ir.index_checks import emit_index_check
from forge_onnx.converters import ConverterContext, constant_value


def _dims(expr: relax.Expr) -> list[Any] | None:
    """The dims of a tensor expression (IntImm or symbolic), None when its rank or shape is unknown."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _static(dims: list[Any]) -> list[int] | None:
    return [int(d.value) for d in dims] if all(isinstance(d, tirx.IntImm) for d in dims) else None


def _in_range(indices: np.ndarray, extents: list[int]) -> bool:
    """Whether every index lies in ``[-n, n-1]`` of its extent (``extents`` broadcast over ``indices``)."""
    bound = np.asarray(extents, dtype=np.int64)
    values = indices.astype(np.int64)
    return bool(np.all((values >= -bound) & (values < bound)))


def _checked(bb: relax.BlockBuilder, op: str, indices: relax.Expr, extents: list[Any], context: ConverterContext,
             what: str) -> None:
    """Emit the run-time check that every element of ``indices`` lies in ``[-n, n-1]`` of its extent.

    ``extents`` has one dim (the extent of the indexed axis, broadcast over every index) or one per
    coordinate (GatherND, ScatterND: the last axis of ``indices``). ``what`` says which axes, for the message.
    """
    values = constant_value(indices)
    static = _static(extents)
    if values is not None and static is not None and _in_range(values, static):
        return
    emit_index_check(bb, indices, extents, label=f"{op} {context.node!r}", where=what, reference="onnxruntime",
                     negative=True, branch=context.branch_taken())


def _axis(attrs: dict[str, Any], rank: int) -> int:
    axis = int(attrs.get("axis", 0))
    return axis + rank if axis < 0 else axis


def _delegated(data: Any, indices: Any) -> bool:
    """Cases left to TVM's converter as they are: shape values (TVM indexes them while importing), both
    inputs constant (folded with numpy, which raises on an index out of range), an unknown rank."""
    return (isinstance(data, relax.ShapeExpr) or isinstance(indices, relax.ShapeExpr)
            or (constant_value(data) is not None and constant_value(indices) is not None)
            or _dims(data) is None or _dims(indices) is None)


def _along_axis(op: str, indices_at: int):
    """A converter for an op whose every index addresses one axis (``attrs["axis"]``) of its first input."""

    def convert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
        data, indices = inputs[0], inputs[indices_at]
        if not _delegated(data, indices):
            dims = _dims(data)
            axis = _axis(attrs, len(dims))
            if 0 <= axis < len(dims):
                _checked(bb, op, indices, [dims[axis]], context, f"data's axis {axis}")
        return context.tvm_convert(op, inputs)

    convert.__name__ = op.lower()
    convert.__doc__ = f"{op}: TVM's conversion, its indices checked at run time against data's axis."
    return convert


def _coordinates(op: str, batch_dims_attr: bool):
    """A converter for an op whose indices' last axis holds coordinates of data's axes (after ``batch_dims``)."""

    def convert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
        data, indices = inputs[0], inputs[1]
        if not _delegated(data, indices):
            dims, index_dims = _dims(data), _dims(indices)
            start = int(attrs.get("batch_dims", 0)) if batch_dims_attr else 0
            last = index_dims[-1] if index_dims else None
            if isinstance(last, tirx.IntImm) and 0 < int(last.value) <= len(dims) - start:
                coordinates = int(last.value)
                _checked(bb, op, indices, dims[start:start + coordinates], context,
                         f"data's axes {start} to {start + coordinates - 1}" if coordinates > 1
                         else f"data's axis {start}")
        return context.tvm_convert(op, inputs)

    convert.__name__ = op.lower()
    convert.__doc__ = f"{op}: TVM's conversion, each coordinate of its indices checked at run time."
    return convert


CONVERTERS = {
    "Gather": _along_axis("Gather", 1),
    "GatherElements": _along_axis("GatherElements", 1),
    "ScatterElements": _along_axis("ScatterElements", 1),
    "GatherND": _coordinates("GatherND", True),
    "ScatterND": _coordinates("ScatterND", False),
}

# onnxruntime's com.microsoft GatherND (the contrib op that ONNX's predates: no batch_dims), which TVM converts as
# ONNX's, and onnxruntime checks the same way ("invalid index found").
MICROSOFT_CONVERTERS = {"GatherND": _coordinates("GatherND", False)}
