"""``split_tensors``: split each convolution's weight in two along its output channels.

``conv(x, W)`` becomes ``concat([conv(x, W[:h]), conv(x, W[h:])], channel)``
with ``h = ceil(O / 2)``: the same values, as two smaller weight tensors that
quantization can give separate scales. Convolutions with groups (depthwise
included) are left whole: their halves would also need halves of the input.
A weight held in ``params`` is sliced in the graph (the compiler folds it); a
constant weight is split into two constants.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from forge_core.transforms.rebind import Emit, rebind

SPLIT_OPS = {"relax.nn.conv1d": relax.op.nn.conv1d, "relax.nn.conv2d": relax.op.nn.conv2d,
             "relax.nn.conv3d": relax.op.nn.conv3d}


def _halves(weight: relax.Expr, axis: int, channels: int) -> tuple[relax.Expr, relax.Expr]:
    half = (channels + 1) // 2
    if isinstance(weight, tvm.ir.GenericConst):
        array = weight.value.numpy()
        first, second = np.split(array, [half], axis=axis)
        return (relax.const(np.ascontiguousarray(first), str(array.dtype)),
                relax.const(np.ascontiguousarray(second), str(array.dtype)))
    return (relax.op.strided_slice(weight, axes=[axis], begin=[0], end=[half]),
            relax.op.strided_slice(weight, axes=[axis], begin=[half], end=[channels]))


def _conv_kwargs(attrs: tvm.ir.Attrs) -> dict:
    out_dtype = str(attrs.out_dtype) if attrs.out_dtype is not None else ""
    return {"strides": list(attrs.strides), "padding": list(attrs.padding), "dilation": list(attrs.dilation),
            "groups": 1, "data_layout": str(attrs.data_layout), "kernel_layout": str(attrs.kernel_layout),
            "out_layout": str(attrs.out_layout), "out_dtype": out_dtype or None}


def split_tensors(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every splittable convolution of ``main`` split, and how many were split."""
    count = [0]

    def rewrite(binding: str, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
        make = SPLIT_OPS.get(getattr(call.op, "name", ""))
        if make is None or int(call.attrs.groups) != 1:
            return None
        weight_type = args[1].ty
        if not isinstance(weight_type, relax.TensorType) or not isinstance(weight_type.shape, relax.ShapeExpr):
            return None
        o_axis = str(call.attrs.kernel_layout).index("O")
        channels = weight_type.shape.values[o_axis]
        if not isinstance(channels, tvm.tirx.IntImm) or int(channels) < 2:
            return None
        first, second = _halves(args[1], o_axis, int(channels))
        kwargs = _conv_kwargs(call.attrs)
        parts = [emit(make(args[0], w, **kwargs), f"{binding}_split{i}") for i, w in enumerate((first, second))]
        count[0] += 1
        return relax.op.concat(parts, axis=str(call.attrs.out_layout).index("C"))

    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = rebind(mod, "main", rewrite_call=rewrite)
    return updated, count[0]
