"""Convolutions in 1 and 3 dimensions, NC* layouts (legalized blocks ``conv1d_ncw``, ``conv3d_ncdhw`` and grouped).

TOPI's generic ``conv`` computes, with ``x`` the last spatial axis (a row)::

    out[n, f, .., x] = sum_{c, .., k} pad[n, g(f) * C/G + c, .., x*s + k*d] * w[f, c, .., k]

:class:`ConvNCX` (groups=1) takes
:class:`~forge_core.schedules.conv2d.Conv2dNCHW`'s tile: ``xt`` outputs of a
row x one or two vectors of output channels, weights repacked to
``[F/v, C, .., K, v]`` at compile time, the fused epilogue written back per
tile. Audio models run conv1d over short rows in batches of frames (a
voice-activity detector: rows of 4, 2 and 1 outputs, 8 frames), so when the
rows are short the tile also spans ``nt`` images: ``nt * xt`` outputs share
each weight vector. When no vector of at least a quarter of the register
divides the output channels (a learned STFT's ``2 * 129``), the weights and
the accumulators are padded with zero channels to a multiple of the vector:
the convolution is then rebuilt (:mod:`forge_core.schedules.rewrite`) to
write a padded buffer, which the write-back reads only inside the real
channels (a vector of 2 lanes would do 8 times the instructions).

Measured on AVX-512 (2 cores, fastest of 200 runs), the voice-activity
detector's layers (8 frames): the STFT (1->258 channels, kernel 256, stride
128) 1.75 ms under the generic schedule -> 0.045 ms (onnxruntime 0.17 ms);
129->128 channels, kernel 3, over rows of 4: 3.6 ms under TVM's reduction
rule -> 0.023 ms (onnxruntime 0.14 ms).

:class:`GroupedConvNCX` takes grouped and depthwise convolutions in 1 and 3
dimensions: parallel over (image, channel, outer rows), a row tile of up to
32 outputs in registers, vectorized along the row.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.sym.pattern import detect_linear_equation

from forge_core.schedules.blocks import blocks, extent, largest_divisor, name_of, plane_loops, sole_block, vector_unit
from forge_core.schedules.conv2d import NARROW_ROW, PREPACK
from forge_core.schedules.epilogue import attach_epilogue, schedule_padding, split_epilogue, vectorize_write_back
from forge_core.schedules.rewrite import alloc, dtype_of, load, replace_stages, shape_of, stage

# Legalized block names by spatial rank, and their iterator kinds.
CONV_BLOCKS = {1: "conv1d_ncw", 3: "conv3d_ncdhw"}
MAX_ROW_TILE = 32
PADDED = "conv_padded_channels"


def _kinds(rank: int) -> str:
    return "S" * (2 + rank) + "R" * (1 + rank)


def _find(func: tirx.PrimFunc, grouped: bool) -> tuple[s_tir.Schedule, s_tir.SBlockRV, int] | None:
    for rank, name in CONV_BLOCKS.items():
        found = sole_block(func, ("group_" + name) if grouped else name, _kinds(rank))
        if found is not None:
            return (*found, rank)
    return None


def _strides(sch: s_tir.Schedule, conv: s_tir.SBlockRV, rank: int) -> list[tuple[int, int]] | None:
    """``(stride, dilation)`` per spatial axis: the input's index there is ``x * stride + k * dilation``."""
    stmt = sch.get(conv)
    iters = [iv.var for iv in stmt.iter_vars]
    spatial, kernel = iters[2:2 + rank], iters[3 + rank:]
    found = []
    for axis in range(rank):
        index = stmt.reads[0].region[2 + axis].min
        try:
            coefficients = [int(c) for c in detect_linear_equation(index, [spatial[axis], kernel[axis]])]
        except Exception:  # noqa: BLE001 - not linear
            return None
        if len(coefficients) != 3 or coefficients[2] != 0:
            return None
        found.append((coefficients[0], coefficients[1]))
    return found


class ConvNCX(dlight.ScheduleRule):
    """conv1d and conv3d, groups=1: register tile of ``nt`` images x ``xt`` outputs x vectors of channels."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = _find(func, grouped=False)
        if found is None:
            return None
        sch, conv, rank = found
        stmt = sch.get(conv)
        weight = stmt.reads[-1].source
        loops = sch.get_loops(conv)
        channels_out, channels_in = extent(sch, loops[1]), extent(sch, loops[2 + rank])
        if shape_of(weight)[:2] != [channels_out, channels_in]:
            return None
        unit = vector_unit(target)
        dtype = str(stmt.writes[0].source.dtype)
        lanes = unit.lanes(dtype)
        vec = unit.vector_factor(channels_out, dtype)
        padded = channels_out
        if vec < max(2, lanes // 4) and channels_out > lanes:
            padded, vec = -(-channels_out // lanes) * lanes, lanes
        width = extent(sch, sch.get_loops(conv)[1 + rank])
        # A pair of channel vectors keeps its two weight vectors and the broadcast input in registers too.
        pair_pixels = (unit.registers - 3) // 2
        if vec == lanes and padded % (2 * vec) == 0 and width <= NARROW_ROW \
                and 2 * largest_divisor(width, pair_pixels) >= largest_divisor(width, unit.accumulators):
            # Short rows: two vectors per input broadcast (Conv2dNCHW measured 1.2-1.6x on rows
            # of <= 7). Not on long rows whose length has no divisor above 7 (wav2vec2's 3199
            # outputs, tiles of 7): 15% slower there. Not on AVX2 where the pair's tile would hold
            # fewer outputs than one vector's (7 outputs x 2 vectors spill on 16 registers).
            vec *= 2
        tile_n, tile_x = _pixel_tile(sch, conv, rank, pair_pixels if vec > lanes else unit.accumulators)
        if padded != channels_out:
            sch, conv = _with_padded_channels(sch, conv, rank, padded, vec)
            if sch is None:
                return None
        else:
            weight_index = len(stmt.reads) - 1
            repack = sch.cache_read(conv, weight_index, "global")
            if rank == 1:
                sch.transform_layout(conv, ("read", weight_index), lambda o, i, k: (o // vec, i, k, o % vec))
            else:
                sch.transform_layout(conv, ("read", weight_index),
                                     lambda o, i, a, b, c: (o // vec, i, a, b, c, o % vec))
            sch.annotate(repack, PREPACK, True)
        _tile_by_channels(sch, conv, rank, vec, tile_n, tile_x)
        schedule_padding(sch, lanes)
        return sch


def _with_padded_channels(sch: s_tir.Schedule, conv: s_tir.SBlockRV, rank: int, padded: int,
                          vec: int) -> tuple[s_tir.Schedule | None, s_tir.SBlockRV | None]:
    """The function rebuilt to convolve into ``padded`` output channels (zero weights past the real ones).

    Stages: the weights ``[padded/vec, C, *K, vec]`` (folded at compile
    time), the convolution into ``acc[N, padded, *O]``, and a copy of the real
    channels into the buffer the epilogue reads.
    """
    strides = _strides(sch, conv, rank)
    if strides is None:
        return None, None
    stmt = sch.get(conv)
    data, weight, out = stmt.reads[0].source, stmt.reads[-1].source, stmt.writes[0].source
    channels_out, channels_in, *kernel = shape_of(weight)
    func = sch.mod["main"]
    packed = alloc("weight_padded", [padded // vec, channels_in, *kernel, vec], dtype_of(weight))
    acc = alloc("acc_padded", [shape_of(out)[0], padded, *shape_of(out)[2:]], dtype_of(out))

    def weight_value(fo, c, *rest):
        oc = fo * vec + rest[-1]
        real = tirx.min(oc, tirx.IntImm("int64", channels_out - 1))
        return tirx.if_then_else(oc < channels_out, load(weight, [real, c, *rest[:-1]]),
                                 tirx.const(0, dtype_of(weight)))

    def conv_value(n, f, *rest):
        positions, c, taps = rest[:rank], rest[rank], rest[rank + 1:]
        x = load(data, [n, c, *[p * s + k * d for p, k, (s, d) in zip(positions, taps, strides)]])
        w = load(packed, [f // vec, c, *taps, f % vec])
        return x.astype(dtype_of(out)) * w.astype(dtype_of(out))

    constant = any(p.same_as(weight) for p in func.params)
    stmts = [
        stage("weight_padded", packed, weight_value, [weight], annotations={PREPACK: True} if constant else None),
        stage(PADDED, acc, conv_value, [data, packed], reduce=[channels_in, *kernel]),
        stage("conv_unpad", out, lambda *i: load(acc, list(i)), [acc]),
    ]
    rebuilt = s_tir.Schedule(replace_stages(func, [name_of(sch, conv)], stmts, [packed, acc]))
    return rebuilt, next(b for b in blocks(rebuilt) if name_of(rebuilt, b) == PADDED)


def _pixel_tile(sch: s_tir.Schedule, conv: s_tir.SBlockRV, rank: int, pixels: int) -> tuple[int, int]:
    """``(nt, xt)``: up to ``pixels`` outputs (16 of a row at most), images too when there is one row per image."""
    loops = sch.get_loops(conv)
    images, width = extent(sch, loops[0]), extent(sch, loops[1 + rank])
    tile_x = largest_divisor(width, min(16, pixels))
    rows = 1
    for loop in loops[2:1 + rank]:
        rows *= extent(sch, loop)
    return (largest_divisor(images, pixels // tile_x) if rows == 1 else 1), tile_x


def _tile_by_channels(sch: s_tir.Schedule, conv: s_tir.SBlockRV, rank: int, vec: int, tile_n: int,
                      tile_x: int) -> None:
    """``nt`` images x ``xt`` outputs of a row x ``vec`` channels (one or two registers)."""
    loops = sch.get_loops(conv)
    n, f, *spatial = loops[:2 + rank]
    reduction = loops[2 + rank:]
    outer, x = spatial[:-1], spatial[-1]

    epilogue = split_epilogue(sch, conv)
    n_outer, n_inner = sch.split(n, [None, tile_n])
    f_outer, f_inner = sch.split(f, [None, vec])
    x_outer, x_inner = sch.split(x, [None, tile_x])
    sch.reorder(n_outer, f_outer, *outer, x_outer, *reduction, n_inner, x_inner, f_inner)
    writer = attach_epilogue(sch, conv, epilogue)
    if rank == 1:
        sch.transform_layout(conv, ("write", 0), lambda a, b, c: (a, b // vec, c, b % vec))
    else:
        sch.transform_layout(conv, ("write", 0), lambda a, b, c, d, e: (a, b // vec, c, d, e, b % vec))
    sch.reverse_compute_at(writer, x_outer)
    if tile_x >= 4:
        vectorize_write_back(sch, writer)
    sch.parallel(sch.fuse(n_outer, f_outer, *outer, x_outer))
    if vec > 1:
        sch.vectorize(f_inner)
    sch.unroll(x_inner)
    sch.unroll(n_inner)
    sch.decompose_reduction(conv, reduction[0])


class GroupedConvNCX(dlight.ScheduleRule):
    """Grouped and depthwise conv1d/conv3d: parallel over channel planes, rows vectorized in registers."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = _find(func, grouped=True)
        if found is None:
            return None
        sch, conv, rank = found
        dtype = str(sch.get(conv).writes[0].source.dtype)
        lanes = vector_unit(target).lanes(dtype)
        p = plane_loops(sch, conv, rank, MAX_ROW_TILE)
        n, c, outer, x, reduction, tile_x = p.n, p.c, p.outer, p.x, p.window, p.tile_x

        epilogue = split_epilogue(sch, conv)
        x_outer, x_inner = sch.split(x, [None, tile_x])
        sch.reorder(n, c, *outer, x_outer, *reduction, x_inner)
        writer = attach_epilogue(sch, conv, epilogue)
        sch.reverse_compute_at(writer, x_outer)
        if tile_x >= 4:
            vectorize_write_back(sch, writer)
            sch.vectorize(x_inner)
        sch.parallel(sch.fuse(n, c, *outer, x_outer))
        sch.decompose_reduction(conv, reduction[0])
        schedule_padding(sch, lanes)
        return sch
