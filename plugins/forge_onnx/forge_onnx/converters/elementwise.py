"""Elementwise and small operators TVM's importer or its CPU lowering lacks."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from tvm import relax

from forge_core.errors import InvalidModelError, ModelImportError
from forge_onnx.converters import ConverterContext


def _half(x: relax.Expr) -> relax.Expr:
    return relax.const(0.5, str(x.ty.dtype))


def cosh(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Cosh = (exp(x) + exp(-x)) / 2 (LLVM has no cosh intrinsic)."""
    x = inputs[0]
    return relax.op.multiply(relax.op.add(relax.op.exp(x), relax.op.exp(relax.op.negative(x))), _half(x))


def sinh(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Sinh = (exp(x) - exp(-x)) / 2 (LLVM has no sinh intrinsic)."""
    x = inputs[0]
    return relax.op.multiply(relax.op.subtract(relax.op.exp(x), relax.op.exp(relax.op.negative(x))), _half(x))


def swish(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Swish = x * sigmoid(alpha * x)."""
    x = inputs[0]
    alpha = relax.const(float(attrs.get("alpha", 1.0)), str(x.ty.dtype))
    return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(alpha, x)))


def lp_normalization(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                     context: ConverterContext) -> relax.Expr:
    """LpNormalization: x / ||x||_p along ``axis`` (p = 1 or 2); zero where the norm is zero."""
    x = inputs[0]
    dtype = str(x.ty.dtype)
    axis, p = int(attrs.get("axis", -1)), int(attrs.get("p", 2))
    if p == 1:
        norm = bb.emit(relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True))
    elif p == 2:
        norm = bb.emit(relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True)))
    else:
        raise InvalidModelError(f"LpNormalization supports p = 1 or 2, given {p}")
    zero = relax.const(0, dtype)
    is_zero = bb.emit(relax.op.equal(norm, zero))
    safe = bb.emit(relax.op.where(is_zero, relax.const(1, dtype), norm))
    return relax.op.where(is_zero, relax.op.zeros_like(x), relax.op.divide(x, safe))


def cum_prod(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
             context: ConverterContext) -> relax.Expr:
    """CumProd along a constant axis, with ``exclusive`` and ``reverse``."""
    x, axis = inputs[0], inputs[1]
    if not hasattr(axis, "value"):
        raise ModelImportError("CumProd needs a constant axis")
    axis_value = int(np.asarray(axis.value.numpy()).reshape(-1)[0])
    reverse = bool(attrs.get("reverse", 0))
    data = bb.emit(relax.op.flip(x, axis_value)) if reverse else x
    result = bb.emit(relax.op.cumprod(data, axis_value, exclusive=bool(attrs.get("exclusive", 0))))
    return relax.op.flip(result, axis_value) if reverse else result


def _window(inputs: list[Any], attrs: dict[str, Any], a0: float, a1: float, a2: float) -> relax.Expr:
    size = inputs[0]
    if not hasattr(size, "value"):
        raise ModelImportError("window functions need a constant size")
    n = int(np.asarray(size.value.numpy()).reshape(-1)[0])
    periodic = bool(attrs.get("periodic", 1))
    denominator = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    window = a0 - a1 * np.cos(2 * np.pi * k / denominator) + a2 * np.cos(4 * np.pi * k / denominator)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(int(attrs.get("output_datatype", onnx.TensorProto.FLOAT)))
    return relax.const(window.astype(dtype), str(np.dtype(dtype)))


def blackman_window(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                    context: ConverterContext) -> relax.Expr:
    """BlackmanWindow of a constant size, as a constant."""
    return _window(inputs, attrs, 0.42, 0.5, 0.08)


def hann_window(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
    """HannWindow of a constant size, as a constant."""
    return _window(inputs, attrs, 0.5, 0.5, 0.0)


def hamming_window(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """HammingWindow of a constant size, as a constant."""
    return _window(inputs, attrs, 25 / 46, 21 / 46, 0.0)


def reverse_sequence(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                     context: ConverterContext) -> relax.Expr:
    """ReverseSequence: reverse the first ``sequence_lens[b]`` steps of each batch entry."""
    return relax.op.reverse_sequence(inputs[0], inputs[1], int(attrs.get("time_axis", 0)),
                                     int(attrs.get("batch_axis", 1)))


def pow_(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Pow with mixed base and exponent types; the result has the base's type."""
    base, exponent = inputs
    if not all(isinstance(getattr(t, "ty", None), relax.TensorType) for t in inputs):
        return context.tvm_convert("Pow", inputs)
    base_dtype, exponent_dtype = str(base.ty.dtype), str(exponent.ty.dtype)
    if base_dtype == exponent_dtype and base_dtype.startswith(("float", "bfloat")):
        return relax.op.power(base, exponent)
    if base_dtype.startswith(("float", "bfloat")):
        return relax.op.power(base, relax.op.astype(exponent, base_dtype))
    result = relax.op.power(relax.op.astype(base, "float64"), relax.op.astype(exponent, "float64"))
    return relax.op.astype(result, base_dtype)


def _variadic(combine: Any) -> Any:
    def convert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
        """A chain of broadcasting binary ops over the inputs.

        TVM's converter broadcasts every input to the output shape, stacks them
        and reduces the stack: a copy of each input, and a ``stack`` that
        ``ConvertLayout`` (``set_channel_layout``) cannot place.
        """
        result = inputs[0]
        for other in inputs[1:]:
            result = combine(result, other)
        return result

    return convert


def mean(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Mean(x0, ..., xn-1) = (x0 + ... + xn-1) / n, broadcasting."""
    total = _variadic(relax.op.add)(bb, inputs, attrs, context)
    if len(inputs) == 1:
        return total
    return relax.op.divide(total, relax.const(float(len(inputs)), str(inputs[0].ty.dtype)))


CONVERTERS = {
    "Max": _variadic(relax.op.maximum),
    "Min": _variadic(relax.op.minimum),
    "Mean": mean,
    "Pow": pow_,
    "Cosh": cosh,
    "Sinh": sinh,
    "Swish": swish,
    "LpNormalization": lp_normalization,
    "CumProd": cum_prod,
    "BlackmanWindow": blackman_window,
    "HannWindow": hann_window,
    "HammingWindow": hamming_window,
    "ReverseSequence": reverse_sequence,
}
