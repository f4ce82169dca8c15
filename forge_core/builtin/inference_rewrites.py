"""Built-in plugin: graph rewrites that hold only in inference.

* ``remove_dropout``: ``nn.dropout(x)[0]`` is ``x`` at inference (ONNX
  Dropout without ``training_mode``, Keras and Caffe exports keep the node).
  Left in place it is fused into the preceding matmul or convolution, whose
  function then matches no schedule rule: AlexNet's and VGG's classifier
  layers ran 10 to 20 times slower. A dropout whose mask is used is kept.

* ``transposed_convolutions_as_convolutions``: a 2-D transposed convolution
  whose kernel is its stride (the windows do not overlap: U-Net's and
  DBNet's upsampling heads), over a dynamic height or width, as a 1x1
  convolution to ``F * s * s`` channels and a depth-to-space
  (``out[n, f, i*s + a, j*s + b] = sum_c x[n, c, i, j] * w[c, f, a, b]``, the
  same products summed in the same order). TOPI lowers the transposed form
  to a convolution over the input dilated by zeros, which no schedule rule
  tiles at a dynamic size (DBNet's heads: most of its generic code's time);
  the 1x1 convolution takes the dynamic convolution rule. At a static size
  the transposed convolution rule (``schedules/conv_transpose.py``) is faster
  and the rewrite does not apply.

``compile()`` runs them from ``opt_level`` 3 on, with the other inference
simplifications.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax import dpl

from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext, rewrite_functions


def remove_dropout(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    data = dpl.wildcard()
    pattern = dpl.is_tuple_get_item(dpl.is_op("relax.nn.dropout")(data), 0)
    updated = rewrite_functions(mod, pattern, lambda expr, matches: matches[data])
    return relax.transform.DeadCodeElimination()(updated)


def _ints(values: object) -> list[int]:
    return [int(v) for v in values]  # type: ignore[attr-defined]


def _as_pointwise(call: relax.Call) -> relax.Expr | None:
    """The 1x1 convolution and depth-to-space computing ``call``, a transposed convolution; None when it is not
    one whose kernel is its stride, over a dynamic height or width (see the module)."""
    attrs = call.attrs
    data, weight = call.args
    data_ty, weight_ty = data.ty, weight.ty
    if not isinstance(data_ty, relax.TensorType) or not isinstance(weight_ty, relax.TensorType) \
            or data_ty.shape is None or weight_ty.shape is None or len(data_ty.shape) != 4:
        return None
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "IOHW" \
            or str(attrs.out_layout) not in ("NCHW", "") or int(attrs.groups) != 1:
        return None
    shape = list(weight_ty.shape)
    stride, kernel = _ints(attrs.strides), shape[2:]
    if any(v != 0 for v in _ints(attrs.padding) + _ints(attrs.output_padding)) or any(d != 1 for d in _ints(attrs.dilation)) \
            or not all(isinstance(d, tirx.IntImm) for d in shape) or _ints(kernel) != stride:
        return None
    batch, _, height, width = list(data_ty.shape)
    if isinstance(height, tirx.IntImm) and isinstance(width, tirx.IntImm):
        return None  # static: the transposed convolution rule
    channels_in, channels_out = _ints(shape[:2])
    out_dtype = str(attrs.out_dtype) if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", "void") \
        else str(data_ty.dtype)
    phases = stride[0] * stride[1]
    # w[c, f, a, b] -> pointwise[(f, a, b), c, 1, 1]
    if isinstance(weight, tvm.ir.GenericConst):
        values = weight.value.numpy()
        pointwise: relax.Expr = relax.const(
            np.ascontiguousarray(values.transpose(1, 2, 3, 0).reshape(channels_out * phases, channels_in, 1, 1)))
    else:
        pointwise = relax.op.reshape(relax.op.permute_dims(weight, [1, 2, 3, 0]),
                                     [channels_out * phases, channels_in, 1, 1])
    y = relax.op.nn.conv2d(data, pointwise, out_dtype=out_dtype)
    y = relax.op.reshape(y, [batch, channels_out, stride[0], stride[1], height, width])
    y = relax.op.permute_dims(y, [0, 1, 4, 2, 5, 3])
    return relax.op.reshape(y, [batch, channels_out, height * stride[0], width * stride[1]])


def transposed_convolutions_as_convolutions(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    data, weight = dpl.wildcard(), dpl.wildcard()
    pattern = dpl.is_op("relax.nn.conv2d_transpose")(data, weight)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        rewritten = _as_pointwise(expr) if isinstance(expr, relax.Call) else None
        return expr if rewritten is None else rewritten

    return rewrite_functions(mod, pattern, rewrite)


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    register("remove_dropout", remove_dropout, stage="optimize",
             description="Dropout is the identity at inference: drop it (its mask unused)")
    register("transposed_convolutions_as_convolutions", transposed_convolutions_as_convolutions, stage="optimize",
             description="A transposed convolution whose kernel is its stride, over a dynamic size: a 1x1 "
                         "convolution and a depth-to-space")
