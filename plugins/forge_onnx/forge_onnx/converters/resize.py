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

from forge_core.errors import InvalidModelError, ModelImportError, UnsupportedFeatureError
from forge_core.runtime.signature import RUN_TIME_CHECK
from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import run_time_shape, static_or_symbolic_dims, static_shape


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


# ONNX's coordinate transformations for nearest-pixel resizing, in onnxruntime's float32 order of operations
# (x: output coordinates, s: the scale, n_in / n_out: the axis' lengths). Those not listed stay TVM's.
_NEAREST_COORDINATES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "tf_half_pixel_for_nn", "align_corners")


def _source_coordinates(x: np.ndarray, scale: np.float32, n_in: int, n_out: int, mode: str) -> np.ndarray:
    half = np.float32(0.5)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if mode == "align_corners":
        return np.zeros_like(x) if n_out == 1 else x * np.float32(n_in - 1) / np.float32(n_out - 1)
    if mode == "pytorch_half_pixel" and n_out <= 1:
        return np.zeros_like(x)
    return (x + half) / scale - half  # half_pixel, pytorch_half_pixel


def _nearest_pixels(source: np.ndarray, nearest_mode: str) -> np.ndarray:
    """The input pixel each source coordinate picks: C's ``round`` (halves away from zero), ``floor``, ``ceil``,
    or ``round_prefer_floor`` (halves down)."""
    whole = np.trunc(source)
    away = whole + np.sign(source) * (np.abs(source - whole) >= np.float32(0.5))
    if nearest_mode == "floor":
        return np.floor(source)
    if nearest_mode == "ceil":
        return np.ceil(source)
    if nearest_mode == "round_prefer_ceil":
        return away
    return np.where(source == whole + np.float32(0.5), np.floor(source), away)


def _nearest_by_tables(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any]) -> relax.Expr | None:
    """A nearest-pixel Resize of static shape as one gather per resized axis, its index tables computed here as
    onnxruntime computes them (float32, dividing by the scale); None for any other Resize.

    TVM computes each index in the kernel from ``(i + 0.5) * (n_in / n_out) - 0.5``: compiled for a CPU with
    FMA, the multiply and subtract fuse and a coordinate that lies exactly halfway (4 -> 7 rows at half_pixel:
    row 3 maps to 1.5) rounded to the other pixel. Measured: a 4x4 -> 7x9 resize differed from onnxruntime by
    1.9 at every opt_level but 4 (whole pixels swapped), while the unscheduled reference matched.
    """
    padded = list(inputs) + [None] * (4 - len(inputs))
    x = padded[0]
    dims = static_shape(x)
    scales, sizes = _values(padded[2]), _values(padded[3])
    mode = _attr(attrs, "mode", "nearest")
    coordinates = _attr(attrs, "coordinate_transformation_mode", "half_pixel")
    if mode != "nearest" or coordinates not in _NEAREST_COORDINATES or dims is None or attrs.get("axes") \
            or (scales is None) == (sizes is None):
        return None
    rank = len(dims)
    if sizes is not None:
        if len(sizes) != rank:
            return None
        out = [int(v) for v in sizes]
        axis_scales = [np.float32(o) / np.float32(i) if i else np.float32(1) for o, i in zip(out, dims)]
    else:
        if len(scales) != rank:
            return None
        axis_scales = [np.float32(v) for v in scales]
        out = [int(np.float32(s) * np.float32(d)) for s, d in zip(axis_scales, dims)]
    nearest_mode = _attr(attrs, "nearest_mode", "round_prefer_floor")
    result = x
    for axis, (n_in, n_out, scale) in enumerate(zip(dims, out, axis_scales)):
        if n_in == n_out and scale == 1:
            continue
        if n_in == 0 or n_out <= 0:
            return None
        source = _source_coordinates(np.arange(n_out, dtype=np.float32), scale, n_in, n_out, coordinates)
        pixels = np.clip(_nearest_pixels(source, nearest_mode), 0, n_in - 1).astype(np.int64)
        result = bb.normalize(relax.op.take(result, relax.const(pixels, "int64"), axis=axis))
    return result


def _nearest_at_run_time(bb: relax.BlockBuilder, x: relax.Expr, dims: list[Any], coordinates: str,
                         nearest_mode: str) -> relax.Expr:
    """:func:`_nearest_by_tables` with the tables computed when the model runs (the sizes are known then only),
    by the same float32 operations: a division by the scale, no multiply for the compiler to fuse."""
    f32 = "float32"
    half = relax.const(0.5, f32)
    result = x
    for axis in (2, 3):
        n_in, n_out = x.ty.shape.values[axis], dims[axis]
        as_float = [bb.emit(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([n])), f32)) for n in (n_in, n_out)]
        scale = bb.emit(relax.op.divide(as_float[1], as_float[0]))
        # The output coordinates 0, 1, ...: a running sum of ones (TVM's arange over a symbolic length failed
        # to build, "VarRemapGet(source) == nullptr"); exact in float32 below 2**24.
        ones = relax.op.ones(relax.ShapeExpr([n_out]), f32)
        out = bb.emit(relax.op.subtract(relax.op.cumsum(ones, axis=0), relax.const(1.0, f32)))
        if coordinates == "asymmetric":
            source = relax.op.divide(out, scale)
        elif coordinates == "tf_half_pixel_for_nn":
            source = relax.op.divide(relax.op.add(out, half), scale)
        else:  # half_pixel; pytorch_half_pixel (a one-pixel output reads pixel 0, as the clamp below gives)
            source = relax.op.subtract(relax.op.divide(relax.op.add(out, half), scale), half)
        source = bb.emit(source)
        whole = bb.emit(relax.op.trunc(source))
        away = bb.emit(relax.op.add(whole, relax.op.multiply(relax.op.sign(source), relax.op.astype(
            relax.op.greater_equal(relax.op.abs(relax.op.subtract(source, whole)), half), f32))))
        pixels = {"floor": relax.op.floor(source), "ceil": relax.op.ceil(source), "round_prefer_ceil": away}.get(
            nearest_mode, relax.op.where(relax.op.equal(source, relax.op.add(whole, half)), relax.op.floor(source),
                                         away))
        if coordinates == "pytorch_half_pixel":
            pixels = relax.op.where(relax.op.greater(as_float[1], relax.const(1.0, f32)), pixels,
                                    relax.op.zeros_like(source))
        last = bb.emit(relax.op.subtract(as_float[0], relax.const(1.0, f32)))
        clamped = relax.op.minimum(relax.op.maximum(pixels, relax.const(0.0, f32)), last)
        result = bb.emit(relax.op.take(result, bb.emit(relax.op.astype(clamped, "int64")), axis=axis))
    return result


def resize(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Resize with ``axes`` and ``keep_aspect_ratio_policy`` expanded to full-rank sizes; nearest-pixel
    upsampling by whole scales as ``repeat`` (:func:`_integer_upsampling`). An empty constant roi or scales
    is absent, as onnxruntime reads it (Paddle2ONNX writes sizes beside an empty scales)."""
    inputs = [None if index in (1, 2) and _is_empty_constant(value) else value for index, value in enumerate(inputs)]
    upsampled = _integer_upsampling(bb, inputs, attrs)
    if upsampled is not None:
        return upsampled
    gathered = _nearest_by_tables(bb, inputs, attrs)
    if gathered is not None:
        return gathered
    if not attrs.get("axes"):
        _refuse_what_tvm_maps_differently(bb, inputs, attrs, context)
    policy = attrs.get("keep_aspect_ratio_policy", b"stretch")
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    axes = attrs.get("axes")
    if axes is None and policy == "stretch":
        computed = _to_computed_sizes(bb, inputs, attrs, context)
        return computed if computed is not None else context.tvm_convert("Resize", inputs)
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


_RELAX_METHODS = {"nearest": "nearest_neighbor", "linear": "linear", "cubic": "cubic"}
# The coordinate modes TVM's resize builds with symbolic sizes, each checked against onnxruntime.
_COMPUTED_SIZE_COORDINATES = {
    "nearest": ("asymmetric", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn"),
    "linear": ("half_pixel", "pytorch_half_pixel"),
    "cubic": ("half_pixel", "pytorch_half_pixel"),
}


def _to_computed_sizes(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                       context: ConverterContext) -> relax.Expr | None:
    """A 2-D Resize to sizes computed at run time (Paddle2ONNX's and tf2onnx's exports with dynamic dims: the
    size of a feature map taken from another's ``Shape``); None for any other Resize. TVM's converter takes
    sizes known at import only ("Type DataflowVar for size is currently unsupported"). With sizes given, ONNX
    maps coordinates by each axis' output/input ratio, as TVM's resize does."""
    padded = list(inputs) + [None] * (4 - len(inputs))
    x, roi, sizes = padded[0], padded[1], padded[3]
    if sizes is None or isinstance(sizes, tvm.ir.GenericConst) or padded[2] is not None:
        return None
    if isinstance(sizes, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm) for v in sizes.values):
        return None
    if getattr(x.ty, "ndim", None) != 4:
        raise UnsupportedFeatureError("Resize to sizes computed at run time is supported for 4-D (NCHW) inputs; "
                                      f"this input is {x.ty}")
    roi_values = _values(roi)
    if roi is not None and not isinstance(roi, tvm.ir.GenericConst):
        raise UnsupportedFeatureError("Resize with sizes and an roi both computed at run time is not supported")
    # A shape value (sizes taken from another tensor's Shape) keeps its dims; a tensor's values get named ones.
    dims = list(sizes.values) if isinstance(sizes, relax.ShapeExpr) else \
        list(run_time_shape(bb, sizes, context.node, "Resize").values)
    if len(dims) != 4:
        raise InvalidModelError(f"Resize's sizes must hold 4 values for a 4-D input; they hold {len(dims)}")
    # The batch and channel sizes must be the input's (Forge resizes the spatial axes only): checked when the
    # model runs unless they are known equal at import.
    analyzer = tvm.sym.Analyzer()
    if not all(analyzer.can_prove_equal(dims[axis], x.ty.shape.values[axis]) for axis in (0, 1)):
        asked = relax.op.shape_to_tensor(relax.ShapeExpr(dims[:2]))
        given = relax.op.strided_slice(relax.op.shape_to_tensor(relax.op.shape_of(x)), [0], [0], [2])
        same = relax.op.equal(relax.op.max(relax.op.abs(relax.op.subtract(asked, given))), relax.const(0, "int64"))
        bb.emit(relax.op.assert_op(same, [asked, given],
                                   f"{RUN_TIME_CHECK}Resize {context.node!r}: its sizes ask for batch and channels "
                                   "{}, the input has {}; Forge resizes the spatial axes only"))
    mode = _attr(attrs, "mode", "nearest")
    coordinates = _attr(attrs, "coordinate_transformation_mode", "half_pixel")
    if coordinates not in _COMPUTED_SIZE_COORDINATES.get(mode, ()):
        # TVM's resize builds a float ratio of symbolic sizes as an integer in the others (align_corners,
        # asymmetric linear...), and fails to build.
        raise UnsupportedFeatureError(
            f"Resize (mode {mode}) with coordinate_transformation_mode={coordinates} to sizes computed at run time "
            "is not supported; give the input shapes at import (shape=...) so that the sizes are known")
    if mode == "nearest":
        return _nearest_at_run_time(bb, x, dims, coordinates, _attr(attrs, "nearest_mode", "round_prefer_floor"))
    roi_static = [0.0] * 4
    if roi_values is not None and len(roi_values) == 8:
        roi_static = [float(v) for v in (*roi_values[2:4], *roi_values[6:8])]
    return relax.op.image.resize2d(
        x, size=relax.ShapeExpr(dims[2:]), roi=roi_static, layout="NCHW", method=_RELAX_METHODS.get(mode, mode),
        coordinate_transformation_mode=coordinates,
        rounding_method=_attr(attrs, "nearest_mode", "round_prefer_floor"),
        cubic_alpha=float(attrs.get("cubic_coeff_a", -0.75)), cubic_exclude=int(attrs.get("exclude_outside", 0)),
        extrapolation_value=float(attrs.get("extrapolation_value", 0.0)))


CONVERTERS = {"Resize": resize}
