"""Activations TVM's ONNX importer lacks."""

from __future__ import annotations

from typing import Any

from tvm import relax

from forge_onnx.converters import ConverterContext


def celu(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = inputs[0]
    dtype = str(x.ty.dtype)
    alpha = relax.const(float(attrs.get("alpha", 1.0)), dtype)
    zero = relax.const(0.0, dtype)
    one = relax.const(1.0, dtype)
    negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)), one))
    return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(zero, negative))


CONVERTERS = {"Celu": celu}
