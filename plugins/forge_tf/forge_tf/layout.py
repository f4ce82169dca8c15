"""Data layouts: Keras's channels-last data fed channels-first, and convolutions converted to NCHW.

``from_keras(..., layout="NCHW")`` (the default, as in the docs): the user
feeds NCHW and gets NCHW back. Keras models compute channels-last, so Forge
wraps the imported model:

* every input of rank 4 is taken as NCHW and transposed to NHWC
  (``permute_dims(x, (0, 2, 3, 1))``) before the model's first op;
* every output of rank 4 is transposed from NHWC back to NCHW
  (``permute_dims(y, (0, 3, 1, 2))``);
* inputs and outputs of any other rank pass unchanged (a ``(batch, features)``
  vector or a ``(batch, tokens, hidden)`` sequence has no channel axis to move);
* ``shape`` gives rank-4 inputs' shapes in NCHW.

Transposes are exact: the numbers are Keras's, only arranged differently.
``layout="NHWC"`` passes data as Keras has it.

``from_tensorflow(..., layout="NCHW")`` keeps the graph's own input layout and
converts its 2-D convolutions to compute in NCHW (TVM's ``ConvertLayout``,
which inserts the transposes around them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import tvm
from tvm import relax

from forge_core.errors import OptionError, OptionTypeError
from forge_tf.interface import rewrite_main
from forge_tf.signature import Dim, InputSpec

KERAS_LAYOUTS = ("NCHW", "NHWC")
TENSORFLOW_LAYOUTS = (None, "NCHW", "NHWC")

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def check_layout(layout: object, allowed: Sequence[str | None], loader: str) -> None:
    if layout is not None and not isinstance(layout, str):
        raise OptionTypeError(f"{loader}: layout must be a string, one of {_show(allowed)}, "
                              f"not {type(layout).__name__}")
    if layout not in allowed:
        raise OptionError(f"{loader}: layout {layout!r} is not supported; use one of {_show(allowed)}")


def _show(allowed: Sequence[str | None]) -> str:
    return ", ".join(repr(a) for a in allowed)


def nchw_shape_to_nhwc(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    return tuple(shape[axis] for axis in NCHW_TO_NHWC)


def nhwc_spec_to_nchw(spec: InputSpec) -> InputSpec:
    """The spec as a user feeding NCHW sees it (rank-4 specs only change)."""
    if spec.shape is None or len(spec.shape) != 4:
        return spec
    return replace(spec, shape=tuple(spec.shape[axis] for axis in NHWC_TO_NCHW))


def nchw_spec_to_nhwc(spec: InputSpec) -> InputSpec:
    if spec.shape is None or len(spec.shape) != 4:
        return spec
    return replace(spec, shape=nchw_shape_to_nhwc(spec.shape))


def _rank(ty: object) -> int | None:
    ndim = getattr(ty, "ndim", -1)
    return None if ndim is None or ndim < 0 else int(ndim)


def channels_first(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` taking rank-4 inputs as NCHW and returning rank-4 outputs as NCHW (it computes in NHWC)."""
    main = mod["main"]
    input_axes = {i: NCHW_TO_NHWC for i, var in enumerate(main.params) if _rank(var.ty) == 4}
    ret = main.ret_ty
    outputs = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    output_axes = {i: NHWC_TO_NCHW for i, ty in enumerate(outputs) if _rank(ty) == 4}
    return rewrite_main(mod, input_axes=input_axes, output_axes=output_axes)


def convolutions_to_nchw(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its 2-D convolutions computing in NCHW; its inputs and outputs keep their layout."""
    desired = {"relax.nn.conv2d": ["NCHW", "OIHW"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}
    return relax.transform.ConvertLayout(desired)(mod)
