"""MediaPipe's ``Convolution2DTransposeBias``, a custom TFLite operator, as a Forge plugin.

MediaPipe's segmentation models (selfie segmentation, hair segmentation)
upsample with this operator, a transposed convolution with its bias, written
before TFLite's builtin ``TRANSPOSE_CONV`` took a bias. The TFLite
interpreter runs it only with MediaPipe's op resolver; Forge runs it with
this plugin installed (``pip install examples/forge_mediapipe``).

The operator, as MediaPipe's kernel (``transpose_conv_bias.cc``) defines it:

* inputs: the data (NHWC, float32), the weights (``[out_channels, kh, kw,
  in_channels]``, a constant) and the bias (``[out_channels]``);
* ``custom_options``: the C struct ``TfLiteTransposeConvParams``, three
  little-endian int32: padding (1 SAME, 2 VALID), stride width, stride height;
* the output: ``in * stride`` per spatial axis with SAME padding,
  ``(in - 1) * stride + k`` with VALID, as TFLite's ``TRANSPOSE_CONV``; the
  padding is what that leaves over, split with the smaller half first.

The converter checks the size it computes against the output shape the
flatbuffer declares, and refuses a model where they differ.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from tvm import relax

from forge_core.hookspecs import hookimpl

SAME, VALID = 1, 2
NHWC_TO_NCHW, NCHW_TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def _output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return size * stride if padding == SAME else (size - 1) * stride + kernel


def convert_transpose_conv_bias(bb: relax.BlockBuilder, inputs: list[Any], options: bytes, context: Any) -> Any:
    """``Convolution2DTransposeBias`` as Relax's ``conv2d_transpose`` plus the bias (the ``"tflite"`` converter
    contract of ``forge_tf.custom_ops``)."""
    if len(inputs) != 3 or any(x is None for x in inputs):
        raise ValueError(f"Convolution2DTransposeBias takes 3 inputs (data, weights, bias), got {len(inputs)}")
    if len(options) < 12:
        raise ValueError(f"its custom_options hold {len(options)} bytes; TfLiteTransposeConvParams takes 12")
    padding, stride_w, stride_h = struct.unpack("<iii", options[:12])
    if padding not in (SAME, VALID) or stride_w < 1 or stride_h < 1:
        raise ValueError(f"padding {padding} (1 SAME, 2 VALID) and strides {stride_h}x{stride_w} are not valid")
    weights = context.constants[1]
    if weights is None:
        raise ValueError("the weights are computed at run time; this converter takes constant weights")
    data, _, bias = inputs
    shape = bb.normalize(data).ty.shape
    if shape is None or len(shape) != 4:
        raise ValueError("the data must be a 4-D NHWC tensor")
    out_channels, kh, kw, in_channels = weights.shape
    height, width = (int(d) for d in shape.values[1:3])
    declared = context.output_shapes[0]
    out_h, out_w = _output_size(height, kh, stride_h, padding), _output_size(width, kw, stride_w, padding)
    if len(declared) == 4 and tuple(declared[1:]) != (out_h, out_w, out_channels):
        raise ValueError(f"the model declares the output {tuple(declared)}; this operator computes "
                         f"(n, {out_h}, {out_w}, {out_channels}) from its input {tuple(int(d) for d in shape.values)}")
    pads, output_padding = [], []
    for size, kernel, stride, out in ((height, kh, stride_h, out_h), (width, kw, stride_w, out_w)):
        full = (size - 1) * stride + kernel
        total = max(0, full - out)
        pads.append((total // 2, total - total // 2))
        output_padding.append(max(0, out - full))  # SAME with a kernel smaller than the stride: bias-only rows
    kernel = relax.const(np.ascontiguousarray(weights.transpose(3, 0, 1, 2)).astype("float32"))  # -> IOHW
    y = relax.op.nn.conv2d_transpose(
        relax.op.permute_dims(data, NHWC_TO_NCHW), kernel, strides=(stride_h, stride_w),
        padding=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]), output_padding=tuple(output_padding),
        data_layout="NCHW", kernel_layout="IOHW")
    y = relax.op.permute_dims(bb.normalize(y), NCHW_TO_NHWC)
    return relax.op.add(y, bias)


@hookimpl
def register_converters(register: Any) -> None:
    register("tflite", "Convolution2DTransposeBias", convert_transpose_conv_bias,
             description="MediaPipe's transposed convolution with bias (custom TFLite op)")
