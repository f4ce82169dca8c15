"""Depthwise convolutions that write bytes, computed on the flat grid of their padded channel plane.

:class:`~forge_core.schedules.grouped_conv2d.GroupedConv2dNCHW` vectorizes
along an output row. In a quantized module the depthwise layer's epilogue
requantizes to bytes, and on a row that is not a whole number of vectors
(MobileNetV2's 7, 14, 28 and 56 pixels) LLVM computes the tail of the
vector one lane at a time: at 7 pixels a row is 4 lanes and 3 scalar
epilogues, and the epilogue cost twice the convolution (960 channels of 7x7:
0.052 ms with the requantizing epilogue, 0.022 ms with a float one).

At stride 1 every tap of the window is a shift of the padded plane. Stored
flat, with the padded width ``Wp`` as its row pitch, output ``(y, x)`` sits
at ``o = y*Wp + x`` of the grid and tap ``(ry, rx)`` reads the plane at
``o + ry*Wp + rx`` (times the dilation). So the rule computes the whole grid
in vectors: the ``Wp - Wo`` positions past each row are computed and dropped.
Per channel plane (parallel), it replaces the operator's stages with four of
its own (:mod:`forge_core.schedules.rewrite`):

1. the padded plane, ``[rows, pitch]`` (flat in memory), with rows after it
   for the dropped lanes of the last vector to read; converted once to the
   accumulator type when every tap converts it (a quantized module's uint8
   input); written as the padding's constant over the whole plane, then the
   input's rows as vectors (TVM's ``decompose_padding``: a load under a
   per-lane padding condition does not vectorize, and converting 14-pixel
   rows two pixels at a time had taken 37% of a 14x14 layer's time);
2. the convolution on a register tile of :data:`TILE_VECTORS` vectors of the
   grid: each tap is one vector load and one FMA per vector;
3. the fused epilogue on the same vectors (its own expression, read at the
   grid), into a byte tile of the plane's grid;
4. the copy of the tile's rows into the output.

Measured on AVX-512 (2 cores, fastest of 5 x 1,000 runs), MobileNetV2's
stride-1 depthwise layers with their requantizing epilogue, against the row
rule: 960 channels of 7x7 0.059 -> 0.028 ms, 384 of 14x14 0.059 -> 0.029,
192 of 28x28 0.094 -> 0.052, 144 of 56x56 0.140 -> 0.128; the whole int8
MobileNetV2 2.89 -> 2.77 ms. They stay with the row rule where it measured
faster: rows of whole vectors (112), float outputs (its epilogue is then
cheap: 7x7 0.020 ms by rows, 0.026 on the grid) and stride 2 (this grid with
rows and columns split by parity was 2-3x slower than the row rule's
de-interleaved rows).

Taken: one input channel per group (any channel multiplier), stride 1, any
kernel, padding and dilation; an epilogue writing 8-bit integers that reads
nothing else per pixel (bias, activation, requantize: not a residual add);
rows that are not a whole number of vectors; a flat plane that fits the
stack (:data:`~forge_core.compiler.tir_pipeline.STACK_LIMIT`: 56x56 in float
takes 13.8 KiB).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.sym import Analyzer
from tvm.sym.pattern import detect_linear_equation

from forge_core.compiler.tir_pipeline import STACK_LIMIT
from forge_core.schedules.blocks import blocks, sole_block, vector_unit
from forge_core.schedules.epilogue import split_epilogue
from forge_core.schedules.rewrite import (
    alloc, const, dtype_of, load, loads_of, redirect_loads, replace_stages, shape_of, stage, substitute,
    top_level_blocks)

# Vectors of the grid in one register tile (measured: 2 to 8 within 10% on MobileNetV2's layers, 4 best at 28x28).
TILE_VECTORS = 4
CONV_STAGE, EPILOGUE_STAGE = "depthwise_flat", "epilogue_flat"
BYTE_TYPES = ("uint8", "int8")


def _at_own_iterators(block: s_tir.SBlock) -> bool:
    """The block stores one element at its spatial iterators, in order (no transpose or broadcast)."""
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    return isinstance(block.body, tirx.BufferStore) and tvm_ffi.structural_equal(list(block.body.indices), spatial)


def _uses(expr: tvm.ir.expr.Expr, variables: list[tirx.Var]) -> bool:
    zero = [(v, const(0)) for v in variables]
    return not tvm_ffi.structural_equal(substitute(expr, zero), expr)


def _stride_and_dilation(index, out_var: tirx.Var, tap: tirx.Var) -> tuple[int, int] | None:
    """``(s, d)`` of an input index ``out_var*s + tap*d``; None for any other form."""
    coefficients = detect_linear_equation(index, [out_var, tap])
    if len(coefficients) != 3 or not isinstance(coefficients[2], tirx.IntImm) or int(coefficients[2]) != 0:
        return None
    return int(coefficients[0]), int(coefficients[1])


@dataclass(frozen=True)
class Grid:
    """The flat plane's ``rows`` x ``pitch``; ``tile`` vectors of the grid per register tile."""

    rows: int
    pitch: int
    tile: int


def flat_stages(func: tirx.PrimFunc, lanes: int) -> tuple[tirx.PrimFunc, Grid] | None:
    """``func`` (padding, depthwise convolution, one epilogue block) rebuilt on the grid; see the module.

    None when the rule does not apply.
    """
    stages = top_level_blocks(func)
    if len(stages) != 3:
        return None
    pad, conv, writer = stages
    padded_source, acc, out = pad.writes[0].source, conv.writes[0].source, writer.writes[0].source
    if not str(pad.name_hint).startswith("pad_temp") or not conv.reads[0].source.same_as(padded_source) \
            or len(pad.reads) != 1 or dtype_of(out) not in BYTE_TYPES:
        return None
    n, c, y, x, rc, ry, rx = (iv.var for iv in conv.iter_vars)
    kernel = [int(iv.dom.extent) for iv in conv.iter_vars[5:]]
    batch, channels, height, width = shape_of(out)
    update = conv.body.value
    if int(conv.iter_vars[4].dom.extent) != 1 or width % lanes == 0 or shape_of(acc) != shape_of(out) \
            or not all(_at_own_iterators(b) for b in (pad, conv, writer)) or not isinstance(update, tirx.Add) \
            or not tvm_ffi.structural_equal(update.a, load(acc, [n, c, y, x])):
        return None
    writer_vars = [iv.var for iv in writer.iter_vars]
    if any(not tvm_ffi.structural_equal(list(a.indices), writer_vars) for a in loads_of(writer.body.value, acc)):
        return None  # the epilogue reads the accumulator elsewhere than at its own element
    others = [r for r in writer.reads if not r.source.same_as(acc)]
    if any(_uses(bound, writer_vars[2:]) for r in others for rng in r.region for bound in (rng.min, rng.extent)):
        return None  # a residual read per pixel: not at the grid's dropped positions

    _, _, padded_height, padded_width = shape_of(padded_source)
    axes = [_stride_and_dilation(conv.reads[0].region[2 + i].min, out_var, tap)
            for i, (out_var, tap) in enumerate(((y, ry), (x, rx)))]
    if None in axes or axes[0][0] != 1 or axes[1][0] != 1:
        return None  # stride 2: see the module
    (_, dilation_y), (_, dilation_x) = axes
    pitch = padded_width
    positions = height * pitch
    tile = min(TILE_VECTORS, -(-positions // lanes))
    grid = -(-positions // (tile * lanes)) * tile * lanes
    # The plane's rows, and zeros as far as the grid's last position plus the farthest tap reaches.
    reach = (kernel[0] - 1) * dilation_y * pitch + (kernel[1] - 1) * dilation_x
    rows = max(padded_height, -(-(grid + reach) // pitch))

    def flat(b, ch, h, w):  # noqa: ANN001, ANN202 - a plane's element, on the grid
        return [b, ch, h * const(pitch) + w]

    o = tirx.Var("o", "int64")
    at_grid = [(y, tirx.floordiv(o, const(pitch))), (x, tirx.floormod(o, const(pitch))), (rc, const(0))]
    product = substitute(update.b, at_grid)
    acc_dtype = dtype_of(acc)
    # The plane is [rows, pitch], so that its padding stage is two loops (rows, columns). A tap reads it at
    # its grid position split into row and column; flattened, that is ``o`` plus a constant again.
    plane_shape = [*shape_of(padded_source)[:2], rows, pitch]
    analyzer = Analyzer()

    def on_plane(b, ch, h, w):  # noqa: ANN001, ANN202 - a padded input's element, on the plane
        position = analyzer.simplify(flat(b, ch, h, w)[-1])
        return [b, ch, tirx.floordiv(position, const(pitch)), tirx.floormod(position, const(pitch))]

    plane = alloc("pad_temp", plane_shape, acc_dtype)
    value = redirect_loads(product, padded_source, plane, on_plane, cast=acc_dtype)
    if loads_of(value, padded_source):  # read other than converted: the plane keeps its type
        plane = alloc("pad_temp", plane_shape, dtype_of(padded_source))
        value = redirect_loads(product, padded_source, plane, on_plane)
    for access in loads_of(value, plane):  # every tap a shift of the grid: o plus a constant
        coefficients = detect_linear_equation(analyzer.simplify(flat(*access.indices)[-1]), [o])
        if len(coefficients) != 2 or int(coefficients[0]) != 1:
            return None
    if rows * pitch * tvm.DataType(dtype_of(plane)).bits > 8 * STACK_LIMIT:
        return None

    pad_vars = [iv.var for iv in pad.iter_vars]

    def pad_value(b, ch, h, w):  # noqa: ANN001, ANN202
        """One ``if_then_else(inside, element, constant)``, the padding pattern ``decompose_padding`` splits.

        Below the padded input, rows for the last vector's dropped lanes to read: TOPI's padding condition
        is false there (its constant), or, with no padding stage, zeros.
        """
        element = substitute(pad.body.value, list(zip(pad_vars, [b, ch, h, w])))
        inside = h < const(padded_height)
        if isinstance(element, tvm.ir.expr.Call) and element.op.same_as(tvm.ir.Op.get("prim.if_then_else")):
            inside, element, constant = tirx.all(inside, element.args[0]), element.args[1], element.args[2]
        else:
            constant = tirx.const(0, dtype_of(padded_source))
        if dtype_of(plane) != dtype_of(padded_source):
            element, constant = element.astype(dtype_of(plane)), constant.astype(dtype_of(plane))
        return tirx.if_then_else(inside, element, constant)

    conv_out = alloc(CONV_STAGE, [batch, channels, grid], acc_dtype)
    bytes_out = alloc(EPILOGUE_STAGE, [batch, channels, grid], dtype_of(out))

    def epilogue_value(b, ch, i):  # noqa: ANN001, ANN202
        at = [b, ch, tirx.floordiv(i, const(pitch)), tirx.floormod(i, const(pitch))]
        return redirect_loads(substitute(writer.body.value, list(zip(writer_vars, at))), acc, conv_out, flat)

    def whole_plane(b, ch, *_):  # noqa: ANN001, ANN202
        one = [tvm.ir.Range.from_min_extent(v, const(1)) for v in (b, ch)]
        return [tirx.BufferRegion(bytes_out, [*one, tvm.ir.Range.from_min_extent(const(0), const(grid))])]

    stmts = [
        stage("pad_temp", plane, pad_value, [pad.reads[0].source]),
        stage(CONV_STAGE, conv_out, lambda b, ch, i, dy, dx: substitute(value, [(n, b), (c, ch), (o, i), (ry, dy),
                                                                                (rx, dx)]),
              [plane, *(r.source for r in conv.reads[1:])], reduce=kernel),
        stage(EPILOGUE_STAGE, bytes_out, epilogue_value, [conv_out, *(r.source for r in others)]),
        stage(str(writer.name_hint), out, lambda *element: load(bytes_out, flat(*element)), [bytes_out],
              reads=whole_plane),
    ]
    names = [str(s.name_hint) for s in stages]
    return replace_stages(func, names, stmts, [plane, conv_out, bytes_out]), Grid(rows, pitch, tile)


class FlatDepthwiseNCHW(dlight.ScheduleRule):
    """Stride-1 depthwise convolutions with a byte-writing epilogue, on the padded plane's flat grid; see the module."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = sole_block(func, ("group_conv2d", "depthwise"), "SSSSRRR")
        if found is None:
            return None
        sch, conv = found
        lanes = vector_unit(target).lanes(str(sch.get(conv).writes[0].source.dtype))
        split_epilogue(sch, conv)
        rebuilt = flat_stages(sch.mod["main"], lanes)
        if rebuilt is None:
            return None
        func, grid = rebuilt
        sch = s_tir.Schedule(func)
        conv, epilogue = sch.get_sblock(CONV_STAGE), sch.get_sblock(EPILOGUE_STAGE)
        copy = blocks(sch)[-1]
        n, c, _, x = sch.get_loops(copy)
        planes = sch.fuse(n, c)
        sch.parallel(planes)
        sch.vectorize(x)
        sch.compute_at(epilogue, planes)
        tiles, vectors, grid_lanes = sch.split(sch.get_loops(epilogue)[-1], [None, grid.tile, lanes])
        sch.unroll(vectors)
        sch.vectorize(grid_lanes)
        sch.compute_at(conv, tiles)
        position, ry, rx = sch.get_loops(conv)[-3:]
        vectors, grid_lanes = sch.split(position, [grid.tile, lanes])
        sch.reorder(ry, rx, vectors, grid_lanes)
        sch.set_scope(conv, 0, "local")
        sch.unroll(vectors)
        sch.vectorize(grid_lanes)
        sch.decompose_reduction(conv, ry)
        pad = sch.get_sblock("pad_temp")
        sch.compute_at(pad, planes)
        # The padding's constant over the whole plane, then the input's rows in vectors (a conditional load
        # per lane had kept TVM from vectorizing them: 37% of a 14x14 layer's time went converting them).
        rows, _ = sch.get_loops(pad)[-2:]
        fill = sch.decompose_padding(pad, rows)
        for block in (fill, pad):
            sch.vectorize(sch.get_loops(block)[-1])
        return sch
