"""Resize's opset-18 attributes ``axes`` and ``keep_aspect_ratio_policy``, which TVM's converter lacks;
and the nodes TVM would resize with other coordinates than ONNX, refused with the reason.

Forge rewrites the node's scales, sizes and roi to cover every axis (as the
specification defines), then lets TVM's converter do the resizing. A
``keep_aspect_ratio_policy`` whose common scale does not give whole sizes is
refused: TVM maps coordinates with each axis' own ratio.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import ModelImportError
from forge_core.runtime.signature import RUN_TIME_CHECK
from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import static_or_symbolic_dims, static_shape


def _values(expr: Any) -> np.ndarray | None:
    if expr is None or not hasattr(expr, "value"):
        return None
    array = np.asarray(expr.value.numpy())
    return array if array.size else None


def _is_empty_constant(expr: Any) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and int(np.prod(expr.value.shape)) == 0


def _attr(attrs: dict[str, Any], name: str, default: str) -> str:
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def _same_nearest_pixels(size: int, scale: float, mode: str, nearest_mode: str) -> bool:
    """Whether nearest-pixel resizing picks the same pixels with ONNX's scale and with TVM's size ratio."""
    out = int(np.floor(size * scale))
    x = np.arange(out, dtype=np.float64)

    def pick(s: float) -> np.ndarray:
        if mode == "asymmetric":
            coord = x / s
        elif mode == "tf_half_pixel_for_nn":
            coord = (x + 0.5) / s
        elif mode == "pytorch_half_pixel" and out == 1:
            coord = np.zeros_like(x)
        else:  # half_pixel, pytorch_half_pixel
            coord = (x + 0.5) / s - 0.5
        rounded = {"floor": np.floor(coord), "ceil": np.ceil(coord),
                   "round_prefer_ceil": np.floor(coord + 0.5)}.get(nearest_mode, np.ceil(coord - 0.5))
        return np.clip(rounded, 0, size - 1)

    return out > 0 and bool(np.array_equal(pick(scale), pick(out / size)))


def _refuse_what_tvm_maps_differently(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                                      context: ConverterContext) -> None:
    """Refuse the Resize nodes whose coordinates TVM would map otherwise than ONNX: wrong numbers, no error.

    * ``align_corners`` to an output axis of size 1: TVM maps ``x * (in - 1) / (out - 1)`` and divides by zero.
    * ``scales`` whose output size is not whole (15 x 0.5 = 7.5 gives 7): ONNX maps coordinates
      with the given scale, TVM with the ratio of the sizes, 7/15 here. On a dynamic axis the model is
      checked when it runs (:func:`_check_whole_sizes`).
    """
    mode = _attr(attrs, "coordinate_transformation_mode", "half_pixel")
    all_dims = static_or_symbolic_dims(inputs[0]) if len(inputs) and inputs[0] is not None else None
    if all_dims is None:
        return
    in_dims = [int(d.value) if isinstance(d, tvm.tirx.IntImm) else None for d in all_dims]
    padded = list(inputs) + [None] * (4 - len(inputs))
    scales, sizes = _values(padded[2]), _values(padded[3])
    if sizes is None and scales is not None and len(scales) == len(in_dims):
        dynamic = [axis for axis, (d, scale) in enumerate(zip(in_dims, scales))
                   if d is None and float(scale) != round(float(scale))]
        if dynamic and mode not in ("align_corners", "tf_crop_and_resize"):
            _check_whole_sizes(bb, [all_dims[a] for a in dynamic], [float(scales[a]) for a in dynamic], context)
        for axis, (d, scale) in enumerate(zip(in_dims, scales)):
            if d is None:
                continue
            exact = d * float(scale)
            if mode not in ("align_corners", "tf_crop_and_resize") and abs(exact - round(exact)) > 1e-6 and not (
                    _attr(attrs, "mode", "nearest") == "nearest"
                    and _same_nearest_pixels(d, float(scale), mode, _attr(attrs, "nearest_mode", "round_prefer_floor"))):
                raise ModelImportError(
                    f"Resize by scale {float(scale):g} of axis {axis} (size {d}) gives {exact:g}, not a whole size: "
                    f"ONNX maps coordinates with the scale and TVM with the ratio of the sizes, so the numbers "
                    f"would differ; give the output size (`sizes`) instead"
                )
        if any(d is None for d in in_dims):
            return
        sizes = [int(np.floor(d * s)) for d, s in zip(in_dims, scales)]
    if mode != "align_corners" or sizes is None or len(sizes) != len(in_dims):
        return
    for axis in range(2, len(in_dims)):
        if int(sizes[axis]) == 1:
            raise ModelImportError(
                f"Resize with coordinate_transformation_mode=align_corners to size 1 along axis {axis} "
                f"(input size {in_dims[axis]}) is not supported: TVM's resize divides by (output size - 1)"
            )


def _check_whole_sizes(bb: relax.BlockBuilder, dims: list[Any], scales: list[float],
                       context: ConverterContext) -> None:
    """A check, when the model runs, that each dynamic extent times its scale is whole (an even height for 0.5):
    at other sizes TVM's coordinates differ from ONNX's (see :func:`_refuse_what_tvm_maps_differently`).

    Nearest-pixel resizing may pick the same pixels at some of those sizes; they are refused too.
    """
    extents = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr(dims)))
    scaled = relax.op.multiply(relax.op.astype(extents, "float64"), relax.const(np.array(scales, "float64"), "float64"))
    fractional = relax.op.sum(relax.op.astype(relax.op.not_equal(relax.op.floor(scaled), scaled), "int64"))
    fine = relax.op.equal(fractional, relax.const(0, "int64"))
    branch = context.branch_taken()
    if branch is not None:
        fine = relax.op.logical_or(relax.op.logical_not(branch), fine)
    listed = ", ".join(f"{s:g}" for s in scales)
    bb.emit(relax.op.assert_op(bb.emit(fine), [extents], (
        f"{RUN_TIME_CHECK}Resize {context.node!r} scales dynamic extents {{}} by {listed}, which gives a size that "
        f"is not whole: ONNX maps coordinates with the scale and TVM with the ratio of the sizes, so the numbers "
        f"would differ. Give sizes whose scaled extents are whole (e.g. an even height for 0.5)")))


def _integer_upsampling(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any]) -> relax.Expr | None:
    """Nearest-pixel upsampling by whole scales as ``repeat`` along each spatial axis, or None for any other Resize.

    PyTorch exports ``interpolate(scale_factor=2, mode="nearest")`` (an FPN's upsampling) as Resize with scales
    ``[1, 1, 2, 2]``, ``asymmetric`` coordinates and ``floor``: output pixel ``i`` reads input pixel
    ``floor(i / s) = i // s``, which is ``repeat``. TVM's resize computes the same pixel in floating point from
    the ratio of the sizes, per element: over a dynamic size, a division, a floor and a clamp on every element
    of a loop it could not vectorize (DBNet's 96 x 80 x 80 upsampling for AVX2: 1.07 ms, 0.64 ms static;
    AMD EPYC Zen 4, 2 cores). ``round_prefer_floor`` (ONNX's default) picks the same pixels at scale 2.
    """
    padded = list(inputs) + [None] * (4 - len(inputs))
    scales, sizes = _values(padded[2]), _values(padded[3])
    if attrs.get("axes") or sizes is not None or scales is None or not 3 <= len(scales) <= 5:
        return None
    if _attr(attrs, "mode", "nearest") != "nearest" or _attr(attrs, "coordinate_transformation_mode",
                                                               "half_pixel") != "asymmetric":
        return None
    dims = static_or_symbolic_dims(inputs[0])
    whole = [float(v) == round(float(v)) and float(v) >= 1 for v in scales]
    if dims is None or len(dims) != len(scales) or not all(whole) or float(scales[0]) != 1 or float(scales[1]) != 1:
        return None
    repeats = [int(round(float(v))) for v in scales[2:]]
    nearest_mode = _attr(attrs, "nearest_mode", "round_prefer_floor")
    if not (nearest_mode == "floor" or (nearest_mode == "round_prefer_floor" and max(repeats) <= 2)):
        return None
    out = inputs[0]
    for axis, repeat in enumerate(repeats, start=2):
        if repeat > 1:
            out = bb.normalize(relax.op.repeat(out, repeat, axis))
    return out


def resize(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Resize with ``axes`` and ``keep_aspect_ratio_policy`` expanded to full-rank sizes; nearest-pixel
    upsampling by whole scales as ``repeat`` (:func:`_integer_upsampling`). An empty constant roi or scales
    is absent, as onnxruntime reads it (Paddle2ONNX writes sizes beside an empty scales)."""
    inputs = [None if index in (1, 2) and _is_empty_constant(value) else value for index, value in enumerate(inputs)]
    upsampled = _integer_upsampling(bb, inputs, attrs)
    if upsampled is not None:
        return upsampled
    if not attrs.get("axes"):
        _refuse_what_tvm_maps_differently(bb, inputs, attrs, context)
    policy = attrs.get("keep_aspect_ratio_policy", b"stretch")
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    axes = attrs.get("axes")
    if axes is None and policy == "stretch":
        return context.tvm_convert("Resize", inputs)
    x = inputs[0]
    dims = static_shape(x)
    if dims is None:
        raise ModelImportError("Resize with axes or keep_aspect_ratio_policy needs a static input shape")
    rank = len(dims)
    axes = [int(a) % rank for a in (axes if axes is not None else range(rank))]
    padded = list(inputs) + [None] * (4 - len(inputs))
    roi, scales, sizes = _values(padded[1]), _values(padded[2]), _values(padded[3])
    new_inputs = [x, padded[1], None, None]
    if roi is not None and len(roi) == 2 * len(axes):
        full = [0.0] * rank + [1.0] * rank
        for i, axis in enumerate(axes):
            full[axis], full[rank + axis] = float(roi[i]), float(roi[len(axes) + i])
        new_inputs[1] = relax.const(np.array(full, dtype=roi.dtype), str(roi.dtype))
    if sizes is not None:
        full_sizes = list(dims)
        for i, axis in enumerate(axes):
            full_sizes[axis] = int(sizes[i])
        if policy in ("not_larger", "not_smaller"):
            ratios = [full_sizes[a] / dims[a] for a in axes]
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            for axis in axes:
                full_sizes[axis] = int(scale * dims[axis] + 0.5)
                if abs(full_sizes[axis] / dims[axis] - scale) > 1e-6:
                    # TVM maps coordinates with each axis' own out/in ratio; ONNX with the common scale.
                    raise ModelImportError(
                        f"Resize with keep_aspect_ratio_policy={policy}: size {full_sizes[axis]} of axis {axis} is "
                        f"not exactly {scale:g} x {dims[axis]}, which TVM's resize cannot express"
                    )
        new_inputs[3] = relax.const(np.array(full_sizes, dtype=np.int64), "int64")
    elif scales is not None:
        full_scales = [1.0] * rank
        for i, axis in enumerate(axes):
            full_scales[axis] = float(scales[i])
        new_inputs[2] = relax.const(np.array(full_scales, dtype=np.float32), "float32")
    plain = {k: v for k, v in attrs.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    return context.tvm_convert("Resize", new_inputs, plain)


CONVERTERS = {"Resize": resize}
