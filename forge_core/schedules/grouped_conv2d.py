"""Depthwise and grouped convolution, NCHW (legalized block ``group_conv2d_nchw``)."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules.blocks import blocks, extent, largest_divisor, name_of, sole_block, vector_unit, x_stride
from forge_core.schedules.epilogue import attach_epilogue, schedule_padding, split_epilogue, vectorize_write_back

MAX_ROW_TILE = 32


class GroupedConv2dNCHW(dlight.ScheduleRule):
    """Parallel over (n, c); a tile of rows of outputs in registers, vectorized along the width.

    Depthwise convolutions pad one channel plane at a time, inside the parallel
    loop. At stride 2 the padded row is de-interleaved (even columns, then odd)
    so that the vector loads stay contiguous.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = sole_block(func, ("group_conv2d", "depthwise"), "SSSSRRR")
        if found is None:
            return None
        sch, conv = found
        dtype = str(sch.get(conv).writes[0].source.dtype)
        lanes = vector_unit(target).lanes(dtype)
        stride = x_stride(sch, conv)
        n, c, y, x, rc, ry, rx = sch.get_loops(conv)
        width = extent(sch, x)
        tile_x = row_tile(width, lanes)

        epilogue = split_epilogue(sch, conv)
        x_outer, x_inner = sch.split(x, [None, tile_x])
        ty = rows_per_tile(extent(sch, y) or 1, tile_x, lanes)
        if ty > 1:
            y, y_inner = sch.split(y, [None, ty])
            sch.reorder(n, c, y, x_outer, rc, ry, rx, y_inner, x_inner)
            sch.unroll(y_inner)
        else:
            sch.reorder(n, c, y, x_outer, rc, ry, rx, x_inner)
        writer = attach_epilogue(sch, conv, epilogue)
        sch.reverse_compute_at(writer, x_outer)
        vectorize_write_back(sch, writer)
        planes = sch.fuse(n, c)
        sch.parallel(planes)
        pads = [b for b in blocks(sch) if name_of(sch, b).startswith("pad_temp")]
        deinterleaved = [stride == 2 and deinterleave(sch, pad) for pad in pads]
        if len(pads) == 1 and extent(sch, rc) == 1:
            sch.compute_at(pads[0], planes)
            if deinterleaved[0]:
                sch.unroll(sch.get_loops(pads[0])[-2])  # the parity: constant in each copy loop
        sch.vectorize(x_inner)
        sch.decompose_reduction(conv, rc)
        schedule_padding(sch, lanes)
        return sch


def row_tile(width: int, lanes: int) -> int:
    """The outputs of a row kept in registers: whole vectors when they divide the row.

    A tile of one vector (112-pixel rows: 16 fp32 lanes) or half of one (56)
    beat the whole row or a divisor up to 32 (28), whose odd vector tails
    cost most in a requantizing epilogue's byte stores: MobileNetV2's 112x112
    depthwise layer with a quantize went from 0.27 to 0.12 ms, fp32 from 0.092
    to 0.077 ms (measured on AVX-512).
    """
    for tile in (lanes, lanes // 2):
        if tile >= 4 and width % tile == 0 and width > MAX_ROW_TILE:
            return tile
    return width if width <= MAX_ROW_TILE else largest_divisor(width, MAX_ROW_TILE)


def rows_per_tile(height: int, tile_x: int, lanes: int, most_vectors: int = 12) -> int:
    """Output rows computed together (7, 4 or 2 dividing ``height``), their vectors at most ``most_vectors``.

    Neighbouring output rows read the same input rows (a 3x3 window: each
    input row feeds three), so a tile of rows loads and converts each input
    vector once for several of them. Vectors count as LLVM splits a row tile
    (28 lanes of 16: 16 + 8 + 4). Measured on AVX-512 against one row:
    MobileNetV2's 56x56 depthwise layer with a requantizing epilogue 0.216 ->
    0.134 ms, 28x28 0.106 -> 0.078 ms; fp32 28x28 0.069 -> 0.035 ms.
    """
    pieces = tile_x // lanes + bin(tile_x % lanes).count("1")
    for rows in (7, 4, 2):
        if height % rows == 0 and rows * pieces <= most_vectors:
            return rows
    return 1


def deinterleave(sch: s_tir.Schedule, pad: s_tir.SBlockRV) -> bool:
    """Store the padded rows as (even columns, odd columns), iterating in that order.

    A stride-2 row of outputs then reads contiguous vectors. Iterating the copy
    over the new layout (not only storing to it) keeps the parity out of the
    index arithmetic: 2-2.5x faster on MobileNetV2's stride-2 layers. Rows of
    odd width keep their layout (the split would need padding).
    """
    loops = sch.get_loops(pad)
    width = extent(sch, loops[-1]) if len(loops) == 4 else None
    if width is None or width % 2:
        return False
    sch.transform_layout(pad, ("write", 0), lambda a, ch, h, w: (a, ch, h, w % 2, w // 2))
    sch.transform_block_layout(pad, lambda a, ch, h, w: (a, ch, h, w % 2, w // 2))
    return True
