"""Reductions over an empty axis (ONNX defines their value: the reduction's identity), and IsInf."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import static_shape

# The value of a reduction over no element
_EMPTY = {
    "ReduceSum": 0.0, "ReduceSumSquare": 0.0, "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceMean": np.nan,
    "ReduceProd": 1.0, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSum": -np.inf,
    "ReduceLogSumExp": -np.inf,
}


def _axes(inputs: list[Any], attrs: dict[str, Any], rank: int) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        if not hasattr(inputs[1], "value"):
            return None
        return [int(a) % rank for a in np.asarray(inputs[1].value.numpy()).reshape(-1)]
    if "axes" in attrs:
        return [int(a) % rank for a in attrs["axes"]]
    return []


def _reduction(op_type: str):  # noqa: ANN202 - a converter factory
    def convert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
        x = inputs[0]
        shape = static_shape(x)
        if shape is not None:
            axes = _axes(inputs, attrs, len(shape))
            if axes is not None:
                noop = not axes and bool(attrs.get("noop_with_empty_axes", 0))
                reduced = list(range(len(shape))) if not axes else axes
                if not noop and any(shape[a] == 0 for a in reduced):
                    keep = bool(attrs.get("keepdims", 1))
                    out = [1 if i in reduced else d for i, d in enumerate(shape)] if keep else \
                        [d for i, d in enumerate(shape) if i not in reduced]
                    dtype = str(x.ty.dtype)
                    value = _EMPTY[op_type]
                    if not dtype.startswith(("float", "bfloat")):
                        info = np.iinfo(dtype) if dtype != "bool" else None
                        value = {np.inf: info.max if info else True, -np.inf: info.min if info else False}.get(
                            value, 0 if np.isnan(value) else value)
                    return relax.const(np.full(out, value, dtype=dtype), dtype)
        return context.tvm_convert(op_type, inputs)

    convert.__name__ = op_type
    convert.__doc__ = f"{op_type}; over an empty axis, the value ONNX defines."
    return convert


def is_inf(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """IsInf with ``detect_negative`` and ``detect_positive``."""
    x = inputs[0]
    dtype = str(x.ty.dtype)
    checks = []
    if int(attrs.get("detect_positive", 1)):
        checks.append(relax.op.equal(x, relax.const(np.inf, dtype)))
    if int(attrs.get("detect_negative", 1)):
        checks.append(relax.op.equal(x, relax.const(-np.inf, dtype)))
    if not checks:
        return relax.op.zeros_like(x, "bool")
    return checks[0] if len(checks) == 1 else relax.op.logical_or(checks[0], checks[1])


CONVERTERS = {op: _reduction(op) for op in _EMPTY} | {"IsInf": is_inf}
