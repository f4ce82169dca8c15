"""Unique over the whole tensor, with the 1-D inverse indices ONNX defines."""

from __future__ import annotations

from typing import Any

from tvm import relax

from forge_onnx.converters import ConverterContext


def unique(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Unique: without ``axis``, of the flattened input.

    ONNX's outputs without ``axis`` are those of the flattened input, ``inverse_indices`` 1-D. Relax's
    ``unique`` gives the inverse indices the input's shape instead, and TVM's converter then casts them
    to 1-D: a rank-2 input compiled, and failed on every run (``match_cast shape size mismatch``), even
    where nothing reads the inverse indices. Flattening first gives every output ONNX's shape.
    """
    data = inputs[0]
    if "axis" not in attrs and len(getattr(data.ty, "shape", None) or ()) != 1:
        data = bb.normalize(relax.op.reshape(data, [-1]))
    return context.tvm_convert("Unique", [data, *inputs[1:]])


CONVERTERS = {"Unique": unique}
