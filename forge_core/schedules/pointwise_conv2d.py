"""Pointwise convolution (1x1, stride 1, no padding), NCHW, on large feature maps.

On NCHW data a 1x1 convolution is a matrix product ``out[f, p] = sum_c w[f, c] *
in[c, p]`` over the ``p = y * W + x`` pixels, which are contiguous in memory.
Vectorizing along the pixels loads each input vector once for ``mf`` output
channels and stores the results without a transpose; :class:`Conv2dNCHW`'s
tile (a vector of output channels) needs one broadcast per multiply-add and a
transposed write-back. The inverted-residual blocks of MobileNet-style models
spend most of their time in such convolutions: measured on AVX-512, the 56x56
and 112x112 layers of MobileNetV2 run 1.4-2x faster with this tile.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.sym import Analyzer

from forge_core.schedules.blocks import blocks, extent, fewest_computed, largest_divisor, name_of, vector_unit, \
    x_stride
from forge_core.schedules.conv2d import PREPACK, _tile_for_16_registers, grouped_conv, ungrouped_conv
from forge_core.schedules.dynamic_conv import clamp_last_tile, dynamic_ungrouped_conv
from forge_core.schedules.epilogue import attach_epilogue, parallel_vectorized, split_epilogue, vectorize_write_back
from forge_core.schedules.rewrite import alloc, dtype_of, load, replace_stages, shape_of, stage

# Output channels per register tile: the widest that divides the channel count.
CHANNEL_TILES = (8, 6, 4)
# A grouped convolution's tile: the widest that divides a group's output channels (ShuffleNet's 34 a group: 2).
GROUP_TILES = (8, 6, 4, 2)
# Below this many pixel vectors per row of the tile, Conv2dNCHW's tile is as good.
MIN_PIXEL_VECTORS = 2
# A grouped convolution over a map whose pixels are not whole vectors: at most this many vectors a tile (ShuffleNet's
# 68 channels a group at 14x14, AVX-512, one process, interleaved: 4 x 7 vectors 1.55x the time of 4 x 3).
MOST_CLAMPED_VECTORS = 4
# From this many pixel tiles, the pixel tiles alone run in parallel, each thread computing every channel tile of
# its pixels (which stay in cache); fewer are fused with the channel tiles, so that the threads have work.
# Measured one process, interleaved, on an AMD EPYC Zen 4 (2 cores), against (pixel tile, channel tile) fused:
# for AVX2 (x86-64-v3) 16->64 at 160x160 0.75 -> 0.52 ms, MobileNetV2's 24->144 at 56x56 0.163 -> 0.125 ms,
# 64->256 at 56x56 0.68 -> 0.52 ms; for AVX-512 0.43 -> 0.34, 0.140 -> 0.121, 0.54 -> 0.50 ms. A 20x20 map
# (5 tiles of 80 pixels on AVX-512) was 15% slower by pixel tiles alone: it keeps the fused loop.
PARALLEL_PIXEL_TILES = 16


class PointwiseConv2dNCHW(dlight.ScheduleRule):
    """Register tile: ``mf`` output channels x ``nv`` vectors of pixels.

    Grouped 1x1 convolutions too (at least :data:`~forge_core.schedules.conv2d.MIN_GROUP_CHANNELS` input
    channels a group): a tile's channels within one group (``mf`` divides a group's output channels), so that
    they share each input vector. ShuffleNet's 4 groups at 28x28, one process, interleaved, against the tiles
    they had: AVX-512 (GroupedConv2dNCHW's rows) 136 -> 136 0.36 -> 0.062 ms, 112 -> 112 0.123 -> 0.059 ms;
    AVX2 (x86-64-v3, Conv2dNCHW's half vectors) 0.31 -> 0.107 ms, 0.080 -> 0.049 ms, 272 -> 272 1.05 -> 0.89 ms
    (AMD EPYC Zen 5). A grouped convolution over a map whose pixels are not whole vectors (14x14, 7x7) takes
    tiles of 2 to :data:`MOST_CLAMPED_VECTORS` vectors, the last clamped to the map's end, the channel tiles in
    parallel (few pixel tiles): 272 -> 272 at 14x14 0.48x Conv2dNCHW's quarter vectors on AVX-512, 0.61-0.67x
    its half vectors on AVX2; 544 -> 544 at 7x7 0.68x its half vectors on AVX-512.

    Weights are repacked to ``[F/mf, C, 1, 1, mf]`` so that the ``mf`` scalars
    broadcast at each input channel are adjacent. The pixel axis is the fused
    ``(y, x)`` of the output, so the tile may straddle rows; the fused epilogue
    (bias, residual add, clip) is rewritten over the same axis and stores whole
    vectors.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = ungrouped_conv(func)
        groups = 1
        if found is None:
            grouped = grouped_conv(func)
            if grouped is None:
                return None
            *found, groups = grouped
        sch, conv = found
        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        channels_out, height, width = extent(sch, f) // groups, extent(sch, y), extent(sch, x)
        if not _pointwise(sch, conv, [height, width]):
            return None
        unit = vector_unit(target)
        lanes = unit.lanes(str(sch.get(conv).writes[0].source.dtype))
        pixels = height * width
        tiles = GROUP_TILES if groups > 1 else CHANNEL_TILES
        if pixels % lanes:
            if groups == 1:
                return None  # Conv2dNCHW's or PaddedPointwiseConv2dNCHW's
            mf, most = _register_tile(channels_out, unit, None, tiles)
            tile = fewest_computed(pixels, [nv * lanes for nv in range(MIN_PIXEL_VECTORS,
                                                                      min(most, MOST_CLAMPED_VECTORS) + 1)])
            if tile is None:
                return None
            nv, order = tile // lanes, "channel_tiles"
        else:
            # The widest channel tile that leaves room for MIN_PIXEL_VECTORS vectors of pixels: on AVX-512
            # (28 accumulators) 8 x 3; on AVX2 (14) 8 channels leave one vector, so 6 x 2 or 4 x 3.
            vectors = pixels // lanes
            mf, nv = _static_tile(channels_out, unit, vectors, extent(sch, n), tiles)
            if nv < MIN_PIXEL_VECTORS:
                return None
            order = "pixel_tiles" if vectors % nv else "fused"
        p_outer = _tile_pixels(sch, conv, mf, nv, lanes, width, order)
        if p_outer is None:
            return None
        if order != "fused":  # the last pixel tile clamped to the map's end
            func = clamp_last_tile(sch.mod["main"], sch.get(p_outer), nv * lanes, pixels)
            return None if func is None else s_tir.Schedule(func)
        return sch


class DynamicPointwiseConv2dNCHW(dlight.ScheduleRule):
    """:class:`PointwiseConv2dNCHW`'s tile over a dynamic height and width (and batch).

    The fused pixel axis has a symbolic length ``H * W``; its last tile starts at ``H * W - nv * lanes`` and
    overlaps the tile before (:func:`~forge_core.schedules.dynamic_conv.clamp_last_tile`), so no multiply-add
    is guarded. The pixel tiles run in parallel, the channel tiles inside. Maps of fewer pixels than a tile
    take the guarded loop. On a DBNet-style detector's 1x1 convolutions :class:`DynamicConv2dNCHW`'s tile (a
    vector of output channels, each pixel broadcast) took about twice the static pointwise kernel's time.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = dynamic_ungrouped_conv(func)
        if found is None:
            return None
        sch, conv = found
        stmt = sch.get(conv)
        channels_out = extent(sch, sch.get_loops(conv)[1])
        height, width = (iv.dom.extent for iv in stmt.iter_vars[2:4])
        if not _pointwise(sch, conv, [height, width]):
            return None
        unit = vector_unit(target)
        lanes = unit.lanes(str(stmt.writes[0].source.dtype))
        mf, nv = _register_tile(channels_out, unit, None)
        if nv < MIN_PIXEL_VECTORS:
            return None
        p_outer = _tile_pixels(sch, conv, mf, nv, lanes, width, "pixel_tiles")
        if p_outer is None:
            return None
        clamped = clamp_last_tile(sch.mod["main"], sch.get(p_outer), nv * lanes, height * width, roll_guarded=True)
        return None if clamped is None else s_tir.Schedule(clamped)


def _pointwise(sch: s_tir.Schedule, conv: s_tir.SBlockRV, size: list) -> bool:
    """Whether ``conv`` is a 1x1, stride-1 convolution whose input has the output's height and width ``size``."""
    stmt = sch.get(conv)
    weight, data = stmt.reads[-1].source, stmt.reads[0].source
    if [int(d) if isinstance(d, tirx.IntImm) else None for d in weight.shape[2:]] != [1, 1]:
        return False
    analyzer = Analyzer()
    if len(data.shape) != 4 or not all(analyzer.can_prove_equal(a, b) for a, b in zip(data.shape[2:], size)):
        return False  # strided or padded
    return x_stride(sch, conv) == 1


def _register_tile(channels_out: int, unit, vectors: int | None,
                   tiles: tuple[int, ...] = CHANNEL_TILES) -> tuple[int, int]:
    """``(mf, nv)``: the widest channel tile of ``tiles`` dividing ``channels_out`` with at least
    :data:`MIN_PIXEL_VECTORS` vectors of pixels in the accumulators left (``nv`` dividing ``vectors`` when the
    pixel count is static); ``nv`` below the minimum when none fits."""
    mf = nv = 0
    for candidate in tiles:
        if channels_out % candidate == 0:
            mf, nv = candidate, max(v for v in range(1, unit.accumulators // candidate + 1)
                                    if vectors is None or vectors % v == 0)
            if nv >= MIN_PIXEL_VECTORS:
                break
    return mf, nv


def _static_tile(channels_out: int, unit, vectors: int, images: int,
                 tiles: tuple[int, ...] = CHANNEL_TILES) -> tuple[int, int]:
    """``(mf, nv)`` over ``vectors`` pixel vectors: the register budget's tile (:func:`_register_tile` with no
    divisibility), its last pixel tile clamped to the map's end when ``nv`` does not divide ``vectors``, if that
    leaves at least :data:`PARALLEL_PIXEL_TILES` pixel tiles to run in parallel; else the widest tile whose
    ``nv`` divides ``vectors``.

    On a 28x28 map (49 vectors of 16 lanes) the divisor tile was 4 channels x 7 vectors: its 112 pixels of a
    128-channel input (57 KB) left L1 for every tile of channels. The budget's 8 x 3, the last of its 17 tiles
    overlapping the one before, measured (AVX-512, one process, interleaved) 128->512 0.55 -> 0.28 ms, 192->32
    0.063 -> 0.035 ms (onnxruntime 0.26 and 0.035); on AVX2 (x86-64-v3, 4 x 3 for 4 x 2) 0.90-0.99 of the
    time at 28x28 and 56x56; 56x56 on AVX-512 (8 x 3 for 8 x 2) 0.99-1.05.
    """
    wide = _register_tile(channels_out, unit, None, tiles)
    if wide[1] >= MIN_PIXEL_VECTORS and vectors % wide[1] and images * -(-vectors // wide[1]) >= PARALLEL_PIXEL_TILES:
        return wide
    return _register_tile(channels_out, unit, vectors, tiles)


def _tile_pixels(sch: s_tir.Schedule, conv: s_tir.SBlockRV, mf: int, nv: int, lanes: int, width,
                 order: str = "fused") -> s_tir.LoopRV | None:
    """Schedule ``conv`` (and its epilogue) as ``mf`` channels x ``nv`` vectors over the fused pixel axis; the
    pixel-tile loop, or None when the epilogue reshapes. The parallel loop, by ``order``:

    * ``"fused"``: (image, pixel tile), with the channel tile too below :data:`PARALLEL_PIXEL_TILES`;
    * ``"pixel_tiles"`` (a dynamic map, or a static one whose last tile is clamped): the pixel tiles alone, the
      images outside (the clamp rewrites that loop);
    * ``"channel_tiles"`` (a map of few pixel tiles, its last clamped): (image, channel tile), each task computing
      every pixel tile of its channels.
    """
    stmt = sch.get(conv)
    epilogue = split_epilogue(sch, conv)
    if epilogue is None:
        # The convolution writes the function's output. A tile of nv * lanes pixels may
        # straddle rows, and a write-back over (y, x) would copy its bounding box: whole
        # rows, most never computed. So the write-back is a copy block iterated over
        # the fused pixel axis like any epilogue.
        epilogue = sch.cache_write(conv, 0, "global")
    else:
        out = sch.get(epilogue).writes[0].source
        analyzer = Analyzer()
        if len(sch.get(epilogue).iter_vars) != 4 or len(out.shape) != 4 or not all(
                analyzer.can_prove_equal(a, b) for a, b in zip(out.shape, stmt.writes[0].source.shape)):
            return None  # the epilogue reshapes: Conv2dNCHW's
    for block in blocks(sch):
        if name_of(sch, block).startswith("pad_temp"):
            sch.compute_inline(block)  # no padding: a copy
    weight_index = len(stmt.reads) - 1
    repack = sch.cache_read(conv, weight_index, "global")
    sch.transform_layout(conv, ("read", weight_index), lambda o, i, h, w: (o // mf, i, h, w, o % mf))
    sch.annotate(repack, PREPACK, True)

    # One pixel axis p = y * W + x, for the convolution and its epilogue.
    sch.transform_layout(conv, ("write", 0), lambda a, b, c, d: (a, b, c * width + d))
    sch.transform_block_layout(epilogue, lambda a, b, c, d: (a, b, c * width + d))
    sch.transform_block_layout(conv, lambda a, b, c, d, e, g, h: (a, b, c * width + d, e, g, h))
    n, f, p, rc, ry, rx = sch.get_loops(conv)
    f_outer, f_inner = sch.split(f, [None, mf])
    p_outer, p_vectors, p_lanes = sch.split(p, [None, nv, lanes])
    by_channels = order == "channel_tiles"
    if by_channels:
        sch.reorder(n, f_outer, p_outer, rc, ry, rx, f_inner, p_vectors, p_lanes)
    else:
        sch.reorder(n, p_outer, f_outer, rc, ry, rx, f_inner, p_vectors, p_lanes)
    writer = attach_epilogue(sch, conv, epilogue)
    sch.reverse_compute_at(writer, p_outer if by_channels else f_outer)
    _, writer_lanes = sch.split(sch.get_loops(writer)[-1], [None, lanes])
    sch.vectorize(writer_lanes)
    if by_channels:
        sch.parallel(sch.fuse(n, f_outer))
    elif order == "pixel_tiles":
        sch.parallel(p_outer)
    elif extent(sch, n) * extent(sch, p_outer) >= PARALLEL_PIXEL_TILES:
        sch.parallel(sch.fuse(n, p_outer))
    else:
        sch.parallel(sch.fuse(n, p_outer, f_outer))
    sch.vectorize(p_lanes)
    sch.unroll(p_vectors)
    sch.unroll(f_inner)
    sch.decompose_reduction(conv, rc)
    return p_outer


# Accumulators a parallel task of PaddedPointwiseConv2dNCHW keeps (its output channels x the padded pixels): half
# of L1; the input a chunk of its reduction reads (a chunk of channels x the padded pixels), in L2 (chunks of 16 KB
# were 5-7% slower: the tile's accumulators are loaded and stored once a chunk).
PADDED_GROUP_BYTES = 16384
PADDED_CHUNK_BYTES = 65536
# Fewer input channels than this keep Conv2dNCHW's tile: the copy of the input and the write-back are paid once an
# output, the multiply-adds once an input channel (MobileNetV2's 160->960 at 7x7 took 1.07x Conv2dNCHW's time;
# 320->1280 0.83x, 960->320 0.88x, ResNet-50's 2048->512 0.78x).
PADDED_MIN_CHANNELS_IN = 256
# At least this many parallel tasks (groups of output channels), where the channels allow.
PADDED_MIN_GROUPS = 8


class PaddedPointwiseConv2dNCHW(dlight.ScheduleRule):
    """A 1x1 convolution over a map whose pixel count is not a whole number of vectors and whose rows are too
    short for Conv2dNCHW's multi-vector tile (7x7: the last stage of ResNet and MobileNet; SqueezeNet's
    13x13), with at least :data:`PADDED_MIN_CHANNELS_IN` input channels, on x86 (AVX2, AVX-512).

    :class:`PointwiseConv2dNCHW` needs whole vectors of pixels, so these fell to
    :class:`~forge_core.schedules.conv2d.Conv2dNCHW`'s tile along a row of 7 pixels, at 1.6 to 2.2x
    onnxruntime's time: a row of 7 offers one vector of channels x 7 pixels (a load per multiply-add), and
    every row of every channel block reads the block's weights again. As onnxruntime's GEMM does, the
    function is rebuilt (:mod:`~forge_core.schedules.rewrite`) to multiply a copy of the input whose pixel
    axis ``y * W + x`` is padded with zeros to whole tiles (``pixels_padded``: 49 -> 72, 169 -> 192) by
    weights repacked at compile time to ``[F/mf, C, mf]``, into a padded accumulator that the epilogue reads
    inside the real pixels only (``conv_unpad``, inlined into it). The tile is ``mf`` channels (broadcast) x
    ``nv`` vectors of pixels; the parallel tasks are groups of output channels, whose accumulators stay in
    L1; the input channels run in chunks whose pixels stay in L1 while every channel tile of the group uses
    them.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        unit = vector_unit(target)
        if unit.registers > 16 and unit.bits != 512:
            return None  # measured on x86 only (AVX2, AVX-512); NEON keeps Conv2dNCHW's two-vector tile
        found = ungrouped_conv(func)
        if found is None:
            return None
        sch, conv = found
        n, f, y, x, rc, _, _ = sch.get_loops(conv)
        images, channels_out, height, width, channels_in = (extent(sch, loop) for loop in (n, f, y, x, rc))
        if not _pointwise(sch, conv, [height, width]):
            return None
        dtype = str(sch.get(conv).writes[0].source.dtype)
        lanes = unit.lanes(dtype)
        pixels = height * width
        if pixels % lanes == 0:
            return None  # PointwiseConv2dNCHW's
        if channels_in < PADDED_MIN_CHANNELS_IN:
            return None
        if unit.vector_factor(channels_out, dtype) == lanes \
                and _tile_for_16_registers(channels_out, width, lanes, unit.registers)[0] > lanes:
            # Conv2dNCHW's tile holds several vectors of channels (4 x 2 on 14-pixel rows, its reduction in
            # chunks): 1.06-1.3x faster than this one on MobileNetV2's and ResNet-50's 14x14 layers.
            return None
        tile = _padded_tile(channels_out, pixels, lanes, unit.registers)
        if tile is None:
            return None
        mf, nv = tile
        for block in blocks(sch):
            if name_of(sch, block).startswith("pad_temp"):
                sch.compute_inline(block)  # no padding: a copy
        stmt = sch.get(conv)
        data, weight, out = stmt.reads[0].source, stmt.reads[-1].source, stmt.writes[0].source
        func = sch.mod["main"]
        if not any(p.same_as(data) for p in func.params) or len(data.shape) != 4:
            return None  # the input computed inside the function: not a plain copy
        step = nv * lanes
        padded = -(-pixels // step) * step
        rebuilt = _padded_stages(func, name_of(sch, conv), data, weight, out, mf, padded, width, pixels)
        sch = s_tir.Schedule(rebuilt)
        acc = sch.get_sblock("acc_padded")
        pack = sch.get_sblock("pixels_padded")
        writer = split_epilogue(sch, acc)
        written = sch.get(writer)
        if len(written.iter_vars) != 4 or [int(d) for d in written.writes[0].source.shape] != shape_of(out):
            return None  # the epilogue reshapes: Conv2dNCHW's
        # The write-back iterates the pixel axis of the accumulator (over (y, x), the region a task writes back
        # would be inferred from y * W + x, and wrongly).
        sch.transform_block_layout(writer, lambda a, b, c, d: (a, b, c * width + d))

        nbytes = tvm.DataType(dtype).bits // 8
        group_tiles = _group_tiles(channels_out // mf, mf * padded * nbytes)
        chunk = _chunk(channels_in, padded * tvm.DataType(dtype_of(data)).bits // 8)
        n, f, p, c = sch.get_loops(acc)
        f_group, f_tile, f_inner = sch.split(f, [None, group_tiles, mf])
        p_outer, p_vectors, p_lanes = sch.split(p, [None, nv, lanes])
        c_outer, c_inner = sch.split(c, [None, chunk])
        sch.reorder(n, f_group, c_outer, f_tile, p_outer, c_inner, f_inner, p_vectors, p_lanes)
        sch.set_scope(acc, 0, "local")
        tasks = sch.fuse(n, f_group)
        sch.reverse_compute_at(writer, tasks)
        vectorize_write_back(sch, writer)
        sch.parallel(tasks)
        sch.unroll(f_inner)
        sch.unroll(p_vectors)
        sch.vectorize(p_lanes)
        sch.decompose_reduction(acc, c_outer)
        parallel_vectorized(sch, pack, lanes)
        return sch


def _padded_tile(channels_out: int, pixels: int, lanes: int, registers: int) -> tuple[int, int] | None:
    """``(mf, nv)`` of :class:`PaddedPointwiseConv2dNCHW`: the most multiply-adds per load (``mf`` broadcasts and
    ``nv`` vector loads a step), times the share of the padded pixels that are real, among tiles of 8 to 12
    accumulators (8 to 24 on 32 registers) that leave a register for each pixel vector and one for the broadcast.

    On AVX-512 (AMD EPYC Zen 5, one process, interleaved, against Conv2dNCHW's two-vector tile): SqueezeNet's
    512 -> 1000 at 13x13 (8 x 3) 1.17 -> 0.65 ms; ResNet-50's and MobileNetV2's 7x7 and 14x14 layers 0.96-1.04.
    """
    best: tuple[float, int, int] | None = None
    for mf in CHANNEL_TILES:
        if channels_out % mf:
            continue
        for nv in (1, 2, 3):
            accumulators = mf * nv
            if not 8 <= accumulators <= (12 if registers <= 16 else 24) or accumulators + nv + 1 > registers:
                continue
            step = nv * lanes
            covered = pixels / (-(-pixels // step) * step)
            score = (covered * accumulators / (mf + nv), mf, nv)
            if best is None or score > best:
                best = score
    return None if best is None else (best[1], best[2])


def _group_tiles(tiles: int, tile_bytes: int) -> int:
    """Channel tiles a parallel task takes: the most whose accumulators fit :data:`PADDED_GROUP_BYTES`, dividing
    the tiles, leaving :data:`PADDED_MIN_GROUPS` tasks where there are that many tiles."""
    return largest_divisor(tiles, max(1, min(PADDED_GROUP_BYTES // tile_bytes, tiles // min(PADDED_MIN_GROUPS, tiles))))


def _chunk(channels_in: int, channel_bytes: int) -> int:
    """Input channels a chunk of the reduction takes: the most dividing them whose padded pixels fit
    :data:`PADDED_CHUNK_BYTES`."""
    return largest_divisor(channels_in, max(1, PADDED_CHUNK_BYTES // channel_bytes))


def _padded_stages(func: tirx.PrimFunc, conv_name: str, data, weight, out, mf: int, padded: int, width: int,
                   pixels: int) -> tirx.PrimFunc:
    """``func`` with its convolution replaced by the weights repacked to ``[F/mf, C, mf]`` (folded at compile
    time), the input's pixels copied to ``[N, C, padded]`` (zeros past the real ones), their product into
    ``acc_padded[N, F, padded]``, and a copy of the real pixels into the convolution's output."""
    images, channels_in = shape_of(data)[:2]
    channels_out = shape_of(weight)[0]
    packed = alloc("weight_packed", [channels_out // mf, channels_in, mf], dtype_of(weight))
    flat = alloc("pixels_padded", [images, channels_in, padded], dtype_of(data))
    acc = alloc("acc_padded", [images, channels_out, padded], dtype_of(out))
    last, row = tirx.IntImm("int64", pixels - 1), tirx.IntImm("int64", width)

    def pixel(n, c, p):
        real = tirx.min(p, last)
        return tirx.if_then_else(p <= last, load(data, [n, c, tirx.floordiv(real, row), tirx.floormod(real, row)]),
                                 tirx.const(0, dtype_of(data)))

    def product(n, f, p, c):
        value = load(flat, [n, c, p]).astype(dtype_of(out))
        return value * load(packed, [tirx.floordiv(f, tirx.IntImm("int64", mf)), c,
                                     tirx.floormod(f, tirx.IntImm("int64", mf))]).astype(dtype_of(out))

    zero = tirx.IntImm("int64", 0)
    constant = any(p.same_as(weight) for p in func.params)
    stmts = [
        stage("weight_packed", packed, lambda fo, c, fi: load(weight, [fo * tirx.IntImm("int64", mf) + fi, c, zero, zero]),
              [weight], annotations={PREPACK: True} if constant else None),
        stage("pixels_padded", flat, pixel, [data]),
        stage("acc_padded", acc, product, [flat, packed], reduce=[channels_in]),
        stage("conv_unpad", out, lambda n, f, y, x: load(acc, [n, f, y * row + x]), [acc]),
    ]
    return replace_stages(func, [conv_name], stmts, [packed, flat, acc])
