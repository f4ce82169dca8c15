"""Convolution, groups=1, NCHW: ``out[n,f,y,x] = sum(pad[n,c,y*s+ry,x*s+rx] * w[f,c,ry,rx])``."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules.blocks import (extent, fewest_computed, largest_divisor, producer, sole_block, vector_unit,
                                         vectorize_by_registers)
from forge_core.schedules.epilogue import (
    attach_epilogue, inline_side_inputs, schedule_padding, split_epilogue, vectorize_write_back,
)

# Marks a weight-repacking block; relax.transform.SplitLayoutRewritePreproc moves it out so that
# FoldConstant runs it once, at compile time.
PREPACK = "meta_schedule.layout_rewrite_preproc"
# Rows at most this wide take the two-vector channel tile whatever the kernel.
NARROW_ROW = 7
# The weights a chunk of a weight-heavy tile's reduction holds (weight_chunk): a quarter of a 32 KB L1.
WEIGHT_CHUNK_BYTES = 8192
# The fewest (input channel, kernel position) steps a chunk may take.
MIN_CHUNK_STEPS = 16
# A grouped convolution with at least this many input channels a group takes Conv2dNCHW's tile on AVX2.
MIN_GROUP_CHANNELS = 8


def ungrouped_conv(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, s_tir.SBlockRV] | None:
    """A schedule of ``func`` and its convolution block, when that convolution has groups=1.

    The weight (the block's last read) is then ``[F, C, KH, KW]`` with F and C
    the extents of the output-channel and reduction-channel loops.
    """
    found = sole_block(func, "conv2d_nchw", "SSSSRRR")
    if found is None:
        return None
    sch, conv = found
    if not _weight_per_loops(sch, conv):
        return None  # grouped: GroupedConv2dNCHW's
    return sch, conv


def _weight_per_loops(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> bool:
    """Whether the convolution's weight (its last read) is ``[F, C, KH, KW]``, F and C the extents of its
    output-channel and reduction-channel loops (a group's channels, where it is grouped)."""
    weight = sch.get(conv).reads[-1].source
    _, f, _, _, rc, _, _ = sch.get_loops(conv)
    return len(weight.shape) == 4 and [int(d) for d in weight.shape[:2]] == [extent(sch, f), extent(sch, rc)]


def grouped_conv(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, s_tir.SBlockRV, int] | None:
    """A schedule of ``func``, its grouped convolution block and its group count, when the convolution has
    groups > 1 and at least :data:`MIN_GROUP_CHANNELS` input channels a group (ShuffleNet's grouped 1x1
    convolutions; not a depthwise one)."""
    found = sole_block(func, "group_conv2d_nchw", "SSSSRRR")
    if found is None:
        return None
    sch, conv = found
    data = sch.get(conv).reads[0].source
    if len(data.shape) != 4 or not _weight_per_loops(sch, conv):
        return None
    _, f, _, _, rc, _, _ = sch.get_loops(conv)
    channels_in, per_group = int(data.shape[1]), extent(sch, rc)
    if per_group < MIN_GROUP_CHANNELS or channels_in % per_group or channels_in == per_group:
        return None
    groups = channels_in // per_group
    return (sch, conv, groups) if extent(sch, f) % groups == 0 else None


class Conv2dNCHW(dlight.ScheduleRule):
    """Register tile: ``xt`` output pixels of a row x one or two vectors of output channels.

    Weights are repacked to ``[F/v, C, KH, KW, v]`` so that each (c, ry, rx)
    step loads one contiguous vector; input pixels are broadcast. The reduction
    runs over the whole tile, then the fused epilogue writes the tile back.
    Elementwise stages before the convolution that feed only the epilogue (a
    residual's dequantize) are inlined into it; the padding stage is kept.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        unit = vector_unit(target)
        found = ungrouped_conv(func)
        groups = 1
        if found is None:
            # Grouped (not depthwise) convolutions too on x86 (16-register units, and AVX-512): GroupedConv2dNCHW's
            # row tile computed ShuffleNet's grouped 1x1 convolutions at about 9 GFLOP/s (the model 0.65x the time
            # with this tile, AMD EPYC Zen 3; on an AMD EPYC Zen 5 with AVX-512, 4 groups at 7x7, 544 -> 544
            # 0.21 -> 0.06 ms, 1088 -> 272 0.33 -> 0.14 ms); not measured on NEON, which keeps it.
            grouped = grouped_conv(func) if unit.registers <= 16 or unit.bits == 512 else None
            if grouped is None:
                return None
            *found, groups = grouped
        sch, conv = found
        stmt = sch.get(conv)
        weight = stmt.reads[-1].source
        _, f, _, x, *_ = sch.get_loops(conv)
        # A grouped convolution's tile holds channels of one group: its input channels are the group's.
        channels_out, width = extent(sch, f) // groups, extent(sch, x)
        dtype = str(stmt.writes[0].source.dtype)
        vec = unit.vector_factor(channels_out, dtype)
        if groups > 1 and vec < min(4, unit.lanes(dtype) // 2):
            # A tile's channels must belong to one group (they broadcast the same input pixel); ShuffleNet's
            # 68 channels a group take 4 lanes (xmm: half an AVX2 vector, a quarter of AVX-512's), fewer lanes
            # stay GroupedConv2dNCHW's.
            return None
        most = unit.accumulators if vec < unit.lanes(dtype) else min(16, unit.accumulators)
        tile_x = largest_divisor(width, most)
        one_by_one = [int(d) for d in weight.shape[2:]] == [1, 1]
        chunk = None
        if unit.registers <= 16 and vec == unit.lanes(dtype):  # AVX2
            vec, tile_x = _tile_for_16_registers(channels_out, width, vec, unit.registers)
            if vec // unit.lanes(dtype) > tile_x:  # weight-heavy: its weights kept in L1 a chunk at a time
                kernel = int(weight.shape[2]) * int(weight.shape[3])
                chunk = weight_chunk(int(weight.shape[1]), kernel, vec, tvm.DataType(str(weight.dtype)).bits // 8)
        elif vec == unit.lanes(dtype) and channels_out % (2 * vec) == 0 and (one_by_one or width <= NARROW_ROW):
            # Two vectors of output channels per input pixel broadcast: fewer loads per
            # multiply-add. Measured on AVX-512: 1.2-1.6x on 1x1 and 7x7-map convolutions,
            # slower on 3x3 convolutions over wider rows.
            vec *= 2
            most = unit.accumulators // 2
            tile_x = largest_divisor(width, most)

        clamped = unit.bits == 512 and chunk is None and width > most and tile_x < most // 2
        if clamped:
            tile_x = clamped_row_tile(width, most)
        x_outer = tile_convolution(sch, conv, vec, tile_x, unit, chunk=chunk)
        schedule_padding(sch, unit.lanes(dtype))
        if clamped:
            from forge_core.schedules.dynamic_conv import clamp_last_tile  # it imports this module

            func = clamp_last_tile(sch.mod["main"], sch.get(x_outer), tile_x, width)
            return None if func is None else s_tir.Schedule(func)
        return sch


def clamped_row_tile(width: int, most: int) -> int:
    """The pixels of a row tile whose last tile is clamped to the row's end: from ``most // 2`` to ``most``, the
    fewest pixels computed, the widest among equals (:func:`~forge_core.schedules.blocks.fewest_computed`).

    On AVX-512 a row whose divisors are all far below the tile's accumulators (SqueezeNet's stem writes rows
    of 111 = 3 x 37 pixels) took a tile of 3 pixels x one vector: 3 accumulators cannot hide an FMA's latency.
    Clamped tiles of 16 (the last one overlapping the one before), AMD EPYC Zen 5, one process, interleaved:
    its 3 -> 64 3x3 stride-2 convolution 0.41 -> 0.26 ms; 64 -> 64 3x3 over 111x111 9.3 -> 6.0 ms.
    """
    return fewest_computed(width, range(max(1, most // 2), most + 1)) or width


def tile_convolution(sch: s_tir.Schedule, conv: s_tir.SBlockRV, vec: int, tile_x: int,
                     unit: VectorUnit, *, rows_only: bool = False, chunk: int | None = None) -> s_tir.LoopRV:
    """``conv`` as a register tile of ``tile_x`` pixels of a row x ``vec`` output channels, the weights repacked
    to ``[F/vec, C, KH, KW, vec]``, the epilogue written per tile, the rows in parallel; returns the loop over
    a row's tiles. The padding stage is the caller's.

    The parallel loop is ``(image, channel block, row)`` fused, or with ``rows_only`` the rows alone (one
    parallel loop per image and channel block). Over a dynamic batch and height the fused loop's every index
    divides by the symbolic row count: its kernels took 2-3x longer to build, for the same speed.

    With ``chunk``, the input channels run in chunks of that many outside the row's tiles: each chunk's weights
    (:func:`weight_chunk`) stay in L1 while every tile of the row uses them, the row's accumulators are kept
    between chunks, and the epilogue writes the row after the last chunk.
    """
    stmt = sch.get(conv)
    dtype = str(stmt.writes[0].source.dtype)
    n, f, y, x, rc, ry, rx = sch.get_loops(conv)
    inline_side_inputs(sch, conv, producer(sch, conv, stmt.reads[0].source))
    epilogue = split_epilogue(sch, conv)
    weight_index = len(stmt.reads) - 1
    repack = sch.cache_read(conv, weight_index, "global")
    sch.transform_layout(conv, ("read", weight_index), lambda o, i, h, w: (o // vec, i, h, w, o % vec))
    sch.annotate(repack, PREPACK, True)

    width = extent(sch, x)
    f_outer, f_inner = sch.split(f, [None, vec])
    x_outer, x_inner = sch.split(x, [None, tile_x])
    if chunk is not None:
        rc_outer, rc = sch.split(rc, [None, chunk])
        sch.reorder(n, f_outer, y, rc_outer, x_outer, rc, ry, rx, x_inner, f_inner)
    else:
        sch.reorder(n, f_outer, y, x_outer, rc, ry, rx, x_inner, f_inner)
    writer = attach_epilogue(sch, conv, epilogue)
    # The tile's accumulators with the channels innermost: one vector a pixel (the registers of the tile).
    sch.transform_layout(conv, ("write", 0), lambda a, b, c, d: (a, b // vec, c, d, b % vec))
    sch.reverse_compute_at(writer, y if chunk is not None else x_outer)
    if (tile_x if chunk is None else width) >= 4:
        vectorize_write_back(sch, writer)
    sch.parallel(y if rows_only else sch.fuse(n, f_outer, y))
    if unit.registers <= 16 and vec > 1:
        vectorize_by_registers(sch, f_inner, unit.lanes(dtype))
    elif vec > 1:
        sch.vectorize(f_inner)
    sch.unroll(x_inner)
    # Loop kinds must all be set before decompose_reduction.
    sch.decompose_reduction(conv, rc_outer if chunk is not None else rc)
    return x_outer


def weight_chunk(channels_in: int, kernel: int, vec: int, dtype_bytes: int) -> int | None:
    """Input channels a chunk of a weight-heavy tile's reduction takes (:func:`tile_convolution`), or None
    when the whole block of ``vec`` output channels' weights fits :data:`WEIGHT_CHUNK_BYTES`.

    A tile of more channel vectors than pixels (AVX2's 4 vectors x 2 pixels on 14-pixel rows, ResNet-50's
    third stage) loads 128 bytes of weights for 8 multiply-adds; a block of 256 input channels' 3x3 weights
    (295 KB) does not stay in L1 between tiles, and L2's bandwidth bounds the kernel. In chunks of 8 KB of
    weights, measured on an AMD EPYC Zen 3 (AVX2, 2 threads), both kernels in one process: 256->256 3x3 at
    14x14 0.76 of the time, 1024->256 1x1 at 14x14 0.72-0.82; a 2 x 4 tile (56- and 28-pixel rows) loads
    half the weights per multiply-add and was 2-4% slower in chunks: it keeps the whole reduction.
    """
    per_channel = vec * kernel * dtype_bytes
    if channels_in * per_channel <= WEIGHT_CHUNK_BYTES:
        return None
    chunk = largest_divisor(channels_in, max(1, WEIGHT_CHUNK_BYTES // per_channel))
    # A chunk of a few steps would load and store the tile's accumulators about as often as it multiplies
    # (a prime channel count's chunk of one): the whole reduction then.
    return chunk if chunk < channels_in and chunk * kernel >= MIN_CHUNK_STEPS else None


def _tile_for_16_registers(channels_out: int, width: int, lanes: int, registers: int,
                           most: int | None = None) -> tuple[int, int]:
    """Output channels (1, 2 or 4 vectors) x pixels of a register tile on a 16-register unit (AVX2).

    The most multiply-adds per load (``nv * px / (nv + px)``: a broadcast pixel per column, a
    weight vector per row) among tiles of at least 6 accumulators (an FMA's latency, 5 cycles on
    Zen, stays hidden) and at most ``registers - 4``; ties go to the narrower channel tile. Measured
    on a Zen 1, against the 14-pixel x one-vector tile: 96->576 1x1 at 14x14 1.06 -> 0.81 ms with
    4 vectors x 2 pixels, 64->64 3x3 at 28x28 2.06 -> 1.73 ms with 2 x 4; a 7-pixel row keeps 1 x 7.
    Each vector of the tile is its own register (the schedule splits the channel tile by lanes), so
    24 channels may take 3 vectors (DBNet's 96->24 3x3 at 160x160: 37.5 ms as 1 x 10, 37.1 as 3 x 4).
    ``most`` caps the accumulators lower (the dynamic rule's tiles).
    """
    best: tuple[float, int, int, int] | None = None
    for vectors in (1, 2, 3, 4):
        if channels_out % (vectors * lanes):
            continue
        for pixels in range(1, width + 1):
            accumulators = vectors * pixels
            if width % pixels or accumulators < 6 or accumulators > (most or registers - 4):
                continue
            score = (accumulators / (vectors + pixels), accumulators, -vectors, pixels)
            if best is None or score > best:
                best = score
    if best is None:
        return lanes, largest_divisor(width, registers - 2)
    return -best[2] * lanes, best[3]
