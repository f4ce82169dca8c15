"""onnxruntime's quantized operators of the ``com.microsoft`` domain, as its static quantizer writes them.

``quantize_static(..., quant_format=QuantFormat.QOperator)`` (and the int8
models of the ONNX model zoo) keep each quantized operator as one node:
``QLinearConv`` and ``QLinearMatMul`` of ONNX, and these of onnxruntime's
contrib domain. Each computes what onnxruntime's CPU kernel computes, in its
order of float32 operations, rounded half to even and saturated:

* ``QLinearAdd``: ``a * (sa / sc) + b * (sb / sc) + (zc - za * sa / sc - zb * sb / sc)``;
* ``QLinearMul``: ``(a - za) * (b - zb) * (sa * sb / sc) + zc``;
* ``QLinearSigmoid``, ``QLinearLeakyRelu`` (onnxruntime: a table of the 256
  values): the function of the dequantized input, quantized;
* ``QLinearConcat``, ``QLinearWhere``: each input dequantized, then quantized
  to the output's scale and zero point (an input already in them is copied
  as is);
* ``QLinearAveragePool``: the mean of the dequantized window, quantized with
  the zero point added before rounding, as onnxruntime's kernel does;
  ``QLinearGlobalAveragePool``: the mean of each dequantized plane, quantized
  (``channels_last`` as NHWC for both);
* ``QLinearSoftmax``: onnxruntime's exponentials in float64 shifted to its
  range, their sum and the division in float32 (see the function);
* ``QGemm``: ``(A - za) (B - zb) + C`` in int32, times ``alpha * sa * sb / sy``
  and quantized, or a float32 output without ``y_scale``;
* ``MatMulIntegerToFloat`` and ``DynamicQuantizeMatMul`` (onnxruntime's
  optimizer fuses ``quantize_dynamic``'s matrix products into them): the
  integer product times the scales, plus the bias, in float32; the second
  quantizes ``A`` to uint8 first, as ``DynamicQuantizeLinear`` does.

A value that falls within float32 rounding of a half step may take the other
step than onnxruntime's vectorized kernels (which may contract a multiply and
an add): one quantization step, rarely.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from forge_core.errors import InvalidModelError, ModelImportError
from forge_onnx.converters import ConverterContext, attr_text
from forge_onnx.converters.quantized import dynamically_quantized, requantized

DOMAIN = "com.microsoft"


def _f32(value: float) -> relax.Expr:
    return relax.const(value, "float32")


def _padded(inputs: list[Any], count: int) -> list[Any]:
    return list(inputs) + [None] * (count - len(inputs))


def _float(bb: relax.BlockBuilder, value: Any) -> relax.Expr:
    """A scale or zero point as float32 (an absent zero point is 0)."""
    if value is None:
        return _f32(0.0)
    return bb.emit(relax.op.astype(value, "float32"))


def _dequantized(bb: relax.BlockBuilder, x: relax.Expr, scale: Any, zero_point: Any) -> relax.Expr:
    """``(x - zero_point) * scale`` in float32."""
    centered = relax.op.subtract(relax.op.astype(x, "float32"), _float(bb, zero_point))
    return bb.emit(relax.op.multiply(centered, _float(bb, scale)))


def _quantized(bb: relax.BlockBuilder, y: relax.Expr, scale: Any, zero_point: Any, dtype: str) -> relax.Expr:
    """ONNX's QuantizeLinear of a float32 ``y``: ``saturate(round(y / scale) + zero_point)``."""
    return requantized(bb, bb.emit(relax.op.divide(y, _float(bb, scale))), zero_point, dtype)


def _quantized_after_shift(bb: relax.BlockBuilder, y: relax.Expr, scale: Any, zero_point: Any,
                           dtype: str) -> relax.Expr:
    """onnxruntime's pooling kernels' quantization: ``saturate(round(y / scale + zero_point))``, the zero point added
    before rounding (a value within float32 rounding of a half step may round otherwise than in
    :func:`_quantized`)."""
    shifted = bb.emit(relax.op.add(relax.op.divide(y, _float(bb, scale)), _float(bb, zero_point)))
    return requantized(bb, shifted, None, dtype)


def _out_dtype(zero_point: Any, x: relax.Expr) -> str:
    """The output's integer type: its zero point's, else the input's."""
    return str((zero_point if zero_point is not None else x).ty.dtype)


def qlinear_add(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
    """QLinearAdd: ``a * (sa/sc) + b * (sb/sc) + (zc - za*sa/sc - zb*sb/sc)``, rounded and saturated."""
    a, sa, za, b, sb, zb, sc, zc = _padded(inputs, 8)
    scale_c = _float(bb, sc)
    ratio_a = bb.emit(relax.op.divide(_float(bb, sa), scale_c))
    ratio_b = bb.emit(relax.op.divide(_float(bb, sb), scale_c))
    constant = bb.emit(relax.op.subtract(
        relax.op.subtract(_float(bb, zc), relax.op.multiply(ratio_a, _float(bb, za))),
        relax.op.multiply(ratio_b, _float(bb, zb))))
    value = relax.op.add(relax.op.add(relax.op.multiply(ratio_a, relax.op.astype(a, "float32")),
                                      relax.op.multiply(ratio_b, relax.op.astype(b, "float32"))), constant)
    return requantized(bb, bb.emit(value), None, _out_dtype(zc, a))


def qlinear_mul(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
    """QLinearMul: ``(a - za) * (b - zb) * (sa * sb / sc) + zc``, rounded and saturated."""
    a, sa, za, b, sb, zb, sc, zc = _padded(inputs, 8)
    ratio = bb.emit(relax.op.divide(relax.op.multiply(_float(bb, sa), _float(bb, sb)), _float(bb, sc)))
    centered_a = relax.op.subtract(relax.op.astype(a, "float32"), _float(bb, za))
    centered_b = relax.op.subtract(relax.op.astype(b, "float32"), _float(bb, zb))
    value = relax.op.add(relax.op.multiply(relax.op.multiply(centered_a, centered_b), ratio), _float(bb, zc))
    return requantized(bb, bb.emit(value), None, _out_dtype(zc, a))


def _unary(function: Any) -> Any:
    def convert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                context: ConverterContext) -> relax.Expr:
        x, sx, zx, sy, zy = _padded(inputs, 5)
        y = bb.emit(function(_dequantized(bb, x, sx, zx), attrs))
        return _quantized(bb, y, sy, zy, _out_dtype(zy, x))

    return convert


qlinear_sigmoid = _unary(lambda x, attrs: relax.op.sigmoid(x))
qlinear_sigmoid.__doc__ = "QLinearSigmoid: the sigmoid of the dequantized input, quantized."
qlinear_leaky_relu = _unary(lambda x, attrs: relax.op.nn.leakyrelu(x, float(attrs.get("alpha", 0.01))))
qlinear_leaky_relu.__doc__ = ("QLinearLeakyRelu: LeakyRelu (``alpha``, 0.01 by default) of the dequantized input, "
                              "quantized.")


def qlinear_concat(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """QLinearConcat: inputs ``y_scale, y_zero_point`` then ``(x, scale, zero_point)`` for each tensor joined."""
    if len(inputs) < 5 or (len(inputs) - 2) % 3:
        raise InvalidModelError(f"QLinearConcat {context.node!r} takes y_scale, y_zero_point and then three inputs "
                                f"(tensor, scale, zero point) for each tensor joined; given {len(inputs)} inputs")
    sy, zy = inputs[0], inputs[1]
    triples = [inputs[i:i + 3] for i in range(2, len(inputs), 3)]
    dtype = _out_dtype(zy, triples[0][0])
    parts = [_quantized(bb, _dequantized(bb, x, s, z), sy, zy, dtype) for x, s, z in triples]
    return relax.op.concat(parts, axis=int(attrs.get("axis", 0)))


def qlinear_where(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                  context: ConverterContext) -> relax.Expr:
    """QLinearWhere: ``where(condition, X, Y)``, each of X and Y requantized to the output's scale and zero point
    (dequantized, then quantized: onnxruntime's tables), broadcast."""
    condition, x, sx, zx, y, sy, zy, sz, zz = _padded(inputs, 9)
    dtype = _out_dtype(zz, x)
    chosen = [_quantized(bb, _dequantized(bb, v, s, z), sz, zz, dtype) for v, s, z in ((x, sx, zx), (y, sy, zy))]
    return relax.op.where(condition, *chosen)


def _pool_padding(attrs: dict[str, Any], x: relax.Expr, kernel: list[int], strides: list[int], node: str) -> list[int]:
    """ONNX's pads (or ``auto_pad``) as Relax's ``(top, left, bottom, right)``."""
    auto_pad = attr_text(attrs.get("auto_pad"), "NOTSET")
    if auto_pad == "NOTSET":
        return [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    shape = x.ty.shape
    channels_last = bool(attrs.get("channels_last", 0))
    dims = None if shape is None else shape.values[1:3] if channels_last else shape.values[2:4]
    if dims is None or not all(hasattr(d, "value") for d in dims):
        raise ModelImportError(f"QLinearAveragePool {node!r}: auto_pad={auto_pad} needs static spatial dims; give "
                               "the input's shape with shape=...")
    begins, ends = [], []
    for size, k, s in zip((int(d.value) for d in dims), kernel, strides):
        total = max((-(-size // s) - 1) * s + k - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(large if auto_pad == "SAME_LOWER" else small)
        ends.append(small if auto_pad == "SAME_LOWER" else large)
    return begins + ends


def qlinear_average_pool(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                         context: ConverterContext) -> relax.Expr:
    """QLinearAveragePool (2-D): the average of the dequantized window, quantized."""
    x, sx, zx, sy, zy = _padded(inputs, 5)
    kernel = [int(k) for k in attrs.get("kernel_shape", [])]
    if x.ty.ndim != 4 or len(kernel) != 2:
        raise ModelImportError(f"QLinearAveragePool {context.node!r}: Forge converts 2-D pooling (a 4-D input); "
                               f"given rank {x.ty.ndim}, kernel_shape {kernel}")
    strides = [int(s) for s in attrs.get("strides", [1, 1])]
    layout = "NHWC" if int(attrs.get("channels_last", 0)) else "NCHW"
    pooled = bb.emit(relax.op.nn.avg_pool2d(
        _dequantized(bb, x, sx, zx), pool_size=kernel, strides=strides,
        padding=_pool_padding(attrs, x, kernel, strides, context.node), ceil_mode=bool(attrs.get("ceil_mode", 0)),
        count_include_pad=bool(attrs.get("count_include_pad", 0)), layout=layout))
    return _quantized_after_shift(bb, pooled, sy, zy, _out_dtype(zy, x))


def qlinear_global_average_pool(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                                context: ConverterContext) -> relax.Expr:
    """QLinearGlobalAveragePool: the mean of each dequantized plane, quantized (``channels_last``: NHWC)."""
    x, sx, zx, sy, zy = _padded(inputs, 5)
    if x.ty.ndim < 3:
        raise InvalidModelError(f"QLinearGlobalAveragePool {context.node!r} takes a tensor of rank 3 or more, "
                                f"given rank {x.ty.ndim}")
    axes = list(range(1, x.ty.ndim - 1)) if int(attrs.get("channels_last", 0)) else list(range(2, x.ty.ndim))
    mean = bb.emit(relax.op.mean(_dequantized(bb, x, sx, zx), axis=axes, keepdims=True))
    return _quantized(bb, mean, sy, zy, _out_dtype(zy, x))


FLOAT32_MAX = float(np.finfo(np.float32).max)


def qlinear_softmax(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                    context: ConverterContext) -> relax.Expr:
    """QLinearSoftmax, as onnxruntime's kernel computes it: ``e = float32(exp((x - max + shift) * x_scale))`` in
    float64 (``shift = max(0, log(FLT_MAX / D) - 5) / x_scale``, ``D`` the reduced length), then
    ``round(e * floor(1 / y_scale) / sum(e)) + y_zero_point`` in float32, saturated. ``opset`` below 13 reduces
    over every dim from ``axis`` on (default 1), 13 and above over ``axis`` alone (default -1)."""
    x, sx, zx, sy, zy = _padded(inputs, 5)
    opset = int(attrs.get("opset", context.opset))
    rank = x.ty.ndim
    axis = int(attrs.get("axis", 1 if opset < 13 else -1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise InvalidModelError(f"QLinearSoftmax {context.node!r}: axis {attrs.get('axis')} is outside rank {rank}")
    shape = [d.value if hasattr(d, "value") else None for d in x.ty.shape.values] if x.ty.shape is not None else None
    reduced = shape[axis:] if opset < 13 else [shape[axis]] if shape is not None else None
    if reduced is None or any(d is None for d in reduced) or (opset < 13 and any(d is None for d in shape)):
        raise ModelImportError(f"QLinearSoftmax {context.node!r}: Forge needs the reduced dims static (onnxruntime "
                               f"builds its table of exponentials for their size); given {x.ty}: give the input's "
                               "shape with shape=...")
    length = int(np.prod(reduced, dtype=np.int64))
    values = bb.emit(relax.op.astype(x, "int32"))
    if opset < 13:
        values = bb.emit(relax.op.reshape(values, [*shape[:axis], length]))
    last = len(values.ty.shape.values) - 1 if opset < 13 else axis
    top = bb.emit(relax.op.max(values, axis=[last], keepdims=True))
    scale = bb.emit(relax.op.astype(_float(bb, sx), "float64"))
    shift = bb.emit(relax.op.divide(relax.const(max(0.0, float(np.log(FLOAT32_MAX / length)) - 5.0), "float64"),
                                    scale))
    exponent = relax.op.multiply(relax.op.add(relax.op.astype(relax.op.subtract(values, top), "float64"), shift),
                                 scale)
    e = bb.emit(relax.op.astype(relax.op.exp(exponent), "float32"))
    total = bb.emit(relax.op.sum(e, axis=[last], keepdims=True))
    levels = bb.emit(relax.op.floor(relax.op.divide(_f32(1.0), _float(bb, sy))))
    result = requantized(bb, bb.emit(relax.op.divide(relax.op.multiply(e, levels), total)), zy, _out_dtype(zy, x))
    return relax.op.reshape(result, shape) if opset < 13 else result


def _centered(bb: relax.BlockBuilder, x: relax.Expr, zero_point: Any) -> relax.Expr:
    """``x - zero_point`` in int32: a zero point of one value, or one per column (the last axis) of ``x``."""
    value = bb.emit(relax.op.astype(x, "int32"))
    if zero_point is None:
        return value
    zero = bb.emit(relax.op.astype(zero_point, "int32"))
    return bb.emit(relax.op.subtract(value, relax.op.reshape(zero, []) if _single(zero_point) else zero))


def qgemm(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """QGemm: ``(A - za) (B - zb) + C`` in int32 (``transA``, ``transB``), times ``alpha * sa * sb``; quantized by
    ``y_scale`` and ``y_zero_point`` when given, else float32. ``sb`` and ``zb`` may be per column."""
    a, sa, za, b, sb, zb, c, sy, zy = _padded(inputs, 9)
    if a.ty.ndim != 2 or b.ty.ndim != 2:
        raise InvalidModelError(f"QGemm {context.node!r} takes 2-D A and B, given ranks {a.ty.ndim} and {b.ty.ndim}")
    left = _centered(bb, a, za)
    if bool(attrs.get("transA", 0)):
        left = bb.emit(relax.op.permute_dims(left, [1, 0]))
    right = bb.emit(relax.op.permute_dims(b, [1, 0])) if bool(attrs.get("transB", 0)) else b
    total = bb.emit(relax.op.matmul(left, _centered(bb, right, zb), out_dtype="int32"))
    if c is not None:
        total = bb.emit(relax.op.add(total, relax.op.astype(c, "int32")))
    alpha = float(attrs.get("alpha", 1.0))
    scale = bb.emit(relax.op.multiply(relax.op.multiply(_f32(alpha), _float(bb, sa)), _float(bb, sb)))
    if sy is None:
        return relax.op.multiply(relax.op.astype(total, "float32"), scale)
    ratio = bb.emit(relax.op.divide(scale, _float(bb, sy)))
    scaled = bb.emit(relax.op.multiply(relax.op.astype(total, "float32"), ratio))
    return requantized(bb, scaled, zy, _out_dtype(zy, a))


def _single(value: Any) -> bool:
    shape = value.ty.shape
    return value.ty.ndim == 0 or (shape is not None and [int(d) for d in shape.values] == [1])


def _float_product(bb: relax.BlockBuilder, a: relax.Expr, za: Any, b: relax.Expr, zb: Any, scale: relax.Expr,
                   bias: Any) -> relax.Expr:
    """``(a - za) @ (b - zb)`` in int32, times ``scale`` (a's scale times b's, one or per column), plus ``bias``."""
    total = bb.emit(relax.op.matmul(_centered(bb, a, za), _centered(bb, b, zb), out_dtype="int32"))
    value = bb.emit(relax.op.multiply(relax.op.astype(total, "float32"), scale))
    return relax.op.add(value, relax.op.astype(bias, "float32")) if bias is not None else value


def matmul_integer_to_float(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                            context: ConverterContext) -> relax.Expr:
    """MatMulIntegerToFloat: ``(A - za) @ (B - zb) * a_scale * b_scale + bias`` in float32."""
    a, b, sa, sb, za, zb, bias = _padded(inputs, 7)
    scale = bb.emit(relax.op.multiply(_float(bb, sa), _float(bb, sb)))
    return _float_product(bb, a, za, b, zb, scale, bias)


def dynamic_quantize_matmul(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                            context: ConverterContext) -> relax.Expr:
    """DynamicQuantizeMatMul: ``A`` quantized to uint8 as ``DynamicQuantizeLinear`` does (the range of ``A``, zero
    included), then ``(A_q - za) @ (B - zb) * a_scale * b_scale + bias`` in float32."""
    a, b, sb, zb, bias = _padded(inputs, 5)
    levels, sa = dynamically_quantized(bb, a, a)
    scale = bb.emit(relax.op.multiply(sa, _float(bb, sb)))
    return _float_product(bb, bb.emit(relax.op.astype(levels, "int32")), None, b, zb, scale, bias)


CONVERTERS = {"QLinearAdd": qlinear_add, "QLinearMul": qlinear_mul, "QLinearSigmoid": qlinear_sigmoid,
              "QLinearLeakyRelu": qlinear_leaky_relu, "QLinearConcat": qlinear_concat, "QLinearWhere": qlinear_where,
              "QLinearAveragePool": qlinear_average_pool, "QLinearGlobalAveragePool": qlinear_global_average_pool,
              "QGemm": qgemm, "QLinearSoftmax": qlinear_softmax, "MatMulIntegerToFloat": matmul_integer_to_float,
              "DynamicQuantizeMatMul": dynamic_quantize_matmul}
