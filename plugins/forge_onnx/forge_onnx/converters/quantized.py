"""Quantized matrix products and convolutions.

* QLinearMatMul: integer matrix product, requantized with round-half-to-even as ONNX specifies.
* QLinearConv (2-D): the integer convolution below plus its int32 bias, requantized the same way
  (what onnxruntime's ``QOperator`` quantization and the ONNX model zoo's int8 models hold).
* MatMulInteger (what onnxruntime's ``quantize_dynamic`` writes, after a
  ``DynamicQuantizeLinear``): with a constant int8 right-hand side whose zero
  point is 0 and a uint8 left-hand side with one zero point ``z``, the product
  is ``u @ w - z * colsum(w)``, exactly: ``matmul(uint8, int8 constant)`` is
  the form the VNNI rule (``Int8Matmul``) takes, and the zero point's term is
  a constant vector times a scalar. Other operands go to TVM's converter
  (every operand widened to int32 first).
* ConvInteger (``quantize_dynamic``'s convolutions; TVM has no converter):
  ``conv(x - x_zp, w - w_zp)`` in int32, the padding zeros in that centered
  domain as ONNX's reference pads. Unpadded, ungrouped, with a constant int8
  weight whose zero point is 0 and a uint8 input, it is
  ``conv(u8, i8) - z * sum(w)``, the integer convolution rules' form.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax, te

from forge_core.errors import InvalidModelError, ModelImportError
from forge_onnx.converters import ConverterContext


def _centered(bb: relax.BlockBuilder, x: relax.Expr, zero_point: relax.Expr, per_row: bool = False) -> relax.Expr:
    """``x - zero_point`` in int32; ``per_row``: a zero point [M] of the left operand, one per row ([M, 1])."""
    zero = bb.emit(relax.op.astype(zero_point, "int32"))
    if per_row and zero_point.ty.ndim == 1:
        zero = bb.emit(relax.op.expand_dims(zero, -1))
    return bb.emit(relax.op.subtract(relax.op.astype(x, "int32"), zero))


def _row_scale(bb: relax.BlockBuilder, scale: relax.Expr) -> relax.Expr:
    """A per-row scale [M] of the left operand broadcasts as [M, 1] (as float32)."""
    as_float = bb.emit(relax.op.astype(scale, "float32"))
    if scale.ty.ndim == 1:
        return bb.emit(relax.op.expand_dims(as_float, -1))
    return as_float


def round_half_even(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """``x`` rounded to the nearest integer, ties to even (ONNX's QuantizeLinear, onnxruntime's kernels).

    One elementwise kernel on TIR's ``nearbyint``, which each target lowers to its round-to-nearest-even
    instruction (LLVM's ``nearbyint``, CUDA's ``nearbyintf``): it fuses with its neighbours and reads ``x`` once.
    (Relax's ``round`` is half away from zero on CUDA; a composition of floor, mod and selects read ``x`` five
    times, and chained quantized operators fused into one kernel grew five-fold at each of them.)
    """
    def kernel(t: te.Tensor) -> te.Tensor:
        return te.compute(t.shape, lambda *i: tvm.tirx.nearbyint(t(*i)), name="round_half_even")

    return bb.emit(bb.call_te(kernel, x, primfunc_name_hint="round_half_even"))


def requantized(bb: relax.BlockBuilder, value: relax.Expr, zero_point: relax.Expr | None, dtype: str) -> relax.Expr:
    """``saturate(round(value) + zero_point)`` as ``dtype``: a scaled integer product (or ``y / y_scale``) back in
    the quantized domain, rounded half to even before the zero point is added (onnxruntime's requantization)."""
    rounded = round_half_even(bb, value)
    if zero_point is not None:
        rounded = bb.emit(relax.op.add(rounded, relax.op.astype(zero_point, "float32")))
    info = np.iinfo(dtype)
    return bb.emit(relax.op.astype(relax.op.clip(rounded, float(info.min), float(info.max)), dtype))


def dynamically_quantized(bb: relax.BlockBuilder, x: relax.Expr, counted: relax.Expr) -> tuple[relax.Expr, ...]:
    """``x`` in uint8 less its zero point (integers in float32), and its scale: onnxruntime's dynamic
    quantization, from the range of ``counted`` (zero included), scale ``range / 255``, zero point and values
    rounded half to even."""
    f32 = lambda v: relax.const(v, "float32")  # noqa: E731
    low = bb.emit(relax.op.minimum(relax.op.min(counted), f32(0.0)))
    high = bb.emit(relax.op.maximum(relax.op.max(counted), f32(0.0)))
    scale = bb.emit(relax.op.where(relax.op.equal(high, low), f32(1.0),
                                   relax.op.divide(relax.op.subtract(high, low), f32(255.0))))
    zero = round_half_even(bb, bb.emit(relax.op.clip(relax.op.negative(relax.op.divide(low, scale)), 0.0, 255.0)))
    rounded = round_half_even(bb, bb.emit(relax.op.divide(x, scale)))
    levels = bb.emit(relax.op.subtract(relax.op.clip(relax.op.add(rounded, zero), 0.0, 255.0), zero))
    return levels, scale


def qlinear_matmul(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """QLinearMatMul: saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp)."""
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    out_dtype = str(y_zp.ty.dtype)
    product = bb.emit(relax.op.matmul(_centered(bb, a, a_zp, per_row=True), _centered(bb, b, b_zp),
                                      out_dtype="int32"))
    scale = bb.emit(relax.op.divide(relax.op.multiply(_row_scale(bb, a_scale),
                                                      relax.op.astype(b_scale, "float32")),
                                     relax.op.astype(y_scale, "float32")))
    scaled = bb.emit(relax.op.multiply(relax.op.astype(product, "float32"), scale))
    return requantized(bb, scaled, y_zp, out_dtype)


def _scalar_zero(zero_point: Any) -> bool:
    """An absent zero point, or a constant one equal to 0 everywhere."""
    if zero_point is None:
        return True
    value = getattr(zero_point, "value", None)
    return value is not None and hasattr(value, "numpy") and not np.any(value.numpy())


def _one_value(zero_point: Any) -> bool:
    """A zero point that is one value: a scalar, or a vector of one element."""
    shape = zero_point.ty.shape
    return zero_point.ty.ndim == 0 or (zero_point.ty.ndim == 1 and shape is not None
                                       and [int(d) for d in shape.values] == [1])


def _minus_zero_point_term(bb: relax.BlockBuilder, product: relax.Expr, zero_point: Any,
                           weight_sums: np.ndarray) -> relax.Expr:
    """``product - z * weight_sums``: the activation zero point's term of an integer product, ``z`` one value."""
    if zero_point is None or _scalar_zero(zero_point):
        return product
    z = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(zero_point, "int32")), []))
    return relax.op.subtract(product, relax.op.multiply(z, relax.const(weight_sums.astype(np.int32))))


def matmul_integer(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """MatMulInteger: ``(a - a_zp) @ (b - b_zp)`` in int32; as ``u8 @ i8 - z * colsum(b)`` when it can."""
    a, b, a_zp, b_zp = [*inputs, None, None][:4]
    weight = getattr(b, "value", None)
    if weight is None or not hasattr(weight, "numpy") or str(b.ty.dtype) != "int8" or b.ty.ndim != 2 \
            or str(a.ty.dtype) != "uint8" or not _scalar_zero(b_zp) or (a_zp is not None and not _one_value(a_zp)):
        return context.tvm_convert("MatMulInteger", inputs)
    product = bb.emit(relax.op.matmul(a, b, out_dtype="int32"))
    return _minus_zero_point_term(bb, product, a_zp, weight.numpy().astype(np.int64).sum(axis=0))


def conv_integer(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                 context: ConverterContext) -> relax.Expr:
    """ConvInteger: ``conv(x - x_zp, w - w_zp)`` in int32 (2-D; explicit or VALID padding)."""
    x, w, x_zp, w_zp = [*inputs, None, None][:4]
    if x.ty.ndim != 4 or w.ty.ndim != 4:
        raise ModelImportError(f"ConvInteger: Forge converts 2-D convolutions (4-D input and weight); given input rank "
                               f"{x.ty.ndim}, weight rank {w.ty.ndim}")
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "VALID"):
        raise ModelImportError(f"ConvInteger: auto_pad={auto_pad} is not supported; export with explicit pads")
    pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])] if auto_pad == "NOTSET" else [0, 0, 0, 0]
    strides = [int(v) for v in attrs.get("strides", [1, 1])]
    dilations = [int(v) for v in attrs.get("dilations", [1, 1])]
    groups = int(attrs.get("group", 1))
    padding = [pads[0], pads[1], pads[2], pads[3]]  # ONNX: begins (top, left), ends (bottom, right)
    weight = getattr(w, "value", None)
    if weight is not None and hasattr(weight, "numpy") and str(w.ty.dtype) == "int8" and str(x.ty.dtype) == "uint8" \
            and _scalar_zero(w_zp) and groups == 1 and not any(pads) \
            and (x_zp is None or _one_value(x_zp)):
        product = bb.emit(relax.op.nn.conv2d(x, w, strides=strides, dilation=dilations, out_dtype="int32"))
        sums = weight.numpy().astype(np.int64).reshape(weight.shape[0], -1).sum(axis=1)
        return _minus_zero_point_term(bb, product, x_zp, sums.reshape(1, -1, 1, 1))
    data = relax.op.astype(x, "int32")
    if x_zp is not None:
        if not _one_value(x_zp):
            raise InvalidModelError("ConvInteger: x_zero_point must be one value (a scalar or a 1-element vector)")
        data = relax.op.subtract(data, relax.op.reshape(bb.emit(relax.op.astype(x_zp, "int32")), []))
    kernel = relax.op.astype(w, "int32")
    if w_zp is not None:
        w_zero = bb.emit(relax.op.astype(w_zp, "int32"))
        if w_zp.ty.ndim == 1 and not _one_value(w_zp):
            w_zero = relax.op.reshape(w_zero, [-1, 1, 1, 1])  # one per output channel
        else:
            w_zero = relax.op.reshape(w_zero, [])
        kernel = relax.op.subtract(kernel, w_zero)
    return relax.op.nn.conv2d(bb.emit(data), bb.emit(kernel), strides=strides, padding=padding,
                              dilation=dilations, groups=groups, out_dtype="int32")


def qlinear_conv(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                 context: ConverterContext) -> relax.Expr:
    """QLinearConv (2-D): ``conv(x - x_zp, w - w_zp) + B`` in int32 (:func:`conv_integer`), times
    ``x_scale * w_scale / y_scale`` (``w_scale`` one or one per output channel), rounded half to even, plus
    ``y_zp``, saturated: onnxruntime's requantization."""
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias = [*inputs, None, None, None][:9]
    if y_scale is None or y_zp is None or w_scale is None or x_scale is None:
        raise InvalidModelError(f"QLinearConv {context.node!r} needs x_scale, w_scale, y_scale and y_zero_point")
    product = conv_integer(bb, [x, w, x_zp, w_zp], attrs, context)
    product = bb.emit(product)
    if bias is not None:
        offsets = bb.emit(relax.op.astype(bias, "int32"))
        product = bb.emit(relax.op.add(product, relax.op.reshape(offsets, [1, -1, 1, 1])))
    w_scales = bb.emit(relax.op.astype(w_scale, "float32"))
    if w_scale.ty.ndim == 1:
        w_scales = bb.emit(relax.op.reshape(w_scales, [1, -1, 1, 1]))
    scale = bb.emit(relax.op.divide(relax.op.multiply(relax.op.astype(x_scale, "float32"), w_scales),
                                    relax.op.astype(y_scale, "float32")))
    scaled = bb.emit(relax.op.multiply(relax.op.astype(product, "float32"), scale))
    return requantized(bb, scaled, y_zp, str(y_zp.ty.dtype))


CONVERTERS = {"QLinearMatMul": qlinear_matmul, "MatMulInteger": matmul_integer, "ConvInteger": conv_integer,
              "QLinearConv": qlinear_conv}
