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

from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.sym import Analyzer

from forge_core.schedules.blocks import blocks, extent, name_of, vector_unit, x_stride
from forge_core.schedules.conv2d import PREPACK, ungrouped_conv
from forge_core.schedules.dynamic_conv import clamp_last_tile, dynamic_ungrouped_conv
from forge_core.schedules.epilogue import attach_epilogue, split_epilogue

# Output channels per register tile: the widest that divides the channel count.
CHANNEL_TILES = (8, 6, 4)
# Below this many pixel vectors per row of the tile, Conv2dNCHW's tile is as good.
MIN_PIXEL_VECTORS = 2
# From this many pixel tiles, the pixel tiles alone run in parallel, each thread computing every channel tile of
# its pixels (which stay in cache); fewer are fused with the channel tiles, so that the threads have work.
# Measured one process, interleaved, on an AMD EPYC Zen 4 (2 cores), against (pixel tile, channel tile) fused:
# for AVX2 (x86-64-v3) 16->64 at 160x160 0.75 -> 0.52 ms, MobileNetV2's 24->144 at 56x56 0.163 -> 0.125 ms,
# 64->256 at 56x56 0.68 -> 0.52 ms; for AVX-512 0.43 -> 0.34, 0.140 -> 0.121, 0.54 -> 0.50 ms. A 20x20 map
# (5 tiles of 80 pixels on AVX-512) was 15% slower by pixel tiles alone: it keeps the fused loop.
PARALLEL_PIXEL_TILES = 16


class PointwiseConv2dNCHW(dlight.ScheduleRule):
    """Register tile: ``mf`` output channels x ``nv`` vectors of pixels.

    Weights are repacked to ``[F/mf, C, 1, 1, mf]`` so that the ``mf`` scalars
    broadcast at each input channel are adjacent. The pixel axis is the fused
    ``(y, x)`` of the output, so the tile may straddle rows; the fused epilogue
    (bias, residual add, clip) is rewritten over the same axis and stores whole
    vectors.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = ungrouped_conv(func)
        if found is None:
            return None
        sch, conv = found
        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        channels_out, height, width = extent(sch, f), extent(sch, y), extent(sch, x)
        if not _pointwise(sch, conv, [height, width]):
            return None
        unit = vector_unit(target)
        lanes = unit.lanes(str(sch.get(conv).writes[0].source.dtype))
        pixels = height * width
        if pixels % lanes:
            return None
        # The widest channel tile that leaves room for MIN_PIXEL_VECTORS vectors of pixels: on AVX-512
        # (28 accumulators) 8 x 3; on AVX2 (14) 8 channels leave one vector, so 6 x 2 or 4 x 3.
        mf, nv = _register_tile(channels_out, unit, pixels // lanes)
        if nv < MIN_PIXEL_VECTORS:
            return None
        if _tile_pixels(sch, conv, mf, nv, lanes, width) is None:
            return None
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
        p_outer = _tile_pixels(sch, conv, mf, nv, lanes, width, dynamic=True)
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


def _register_tile(channels_out: int, unit, vectors: int | None) -> tuple[int, int]:
    """``(mf, nv)``: the widest channel tile of :data:`CHANNEL_TILES` dividing ``channels_out`` with at least
    :data:`MIN_PIXEL_VECTORS` vectors of pixels in the accumulators left (``nv`` dividing ``vectors`` when the
    pixel count is static); ``nv`` below the minimum when none fits."""
    mf = nv = 0
    for candidate in CHANNEL_TILES:
        if channels_out % candidate == 0:
            mf, nv = candidate, max(v for v in range(1, unit.accumulators // candidate + 1)
                                    if vectors is None or vectors % v == 0)
            if nv >= MIN_PIXEL_VECTORS:
                break
    return mf, nv


def _tile_pixels(sch: s_tir.Schedule, conv: s_tir.SBlockRV, mf: int, nv: int, lanes: int, width,
                 dynamic: bool = False) -> s_tir.LoopRV | None:
    """Schedule ``conv`` (and its epilogue) as ``mf`` channels x ``nv`` vectors over the fused pixel axis; the
    pixel-tile loop, or None when the epilogue reshapes. Static: (image, pixel tile) fused and parallel, with the
    channel tile too below :data:`PARALLEL_PIXEL_TILES`; ``dynamic``: the pixel tiles alone in parallel (the
    clamp rewrites that loop)."""
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
    sch.reorder(n, p_outer, f_outer, rc, ry, rx, f_inner, p_vectors, p_lanes)
    writer = attach_epilogue(sch, conv, epilogue)
    sch.reverse_compute_at(writer, f_outer)
    _, writer_lanes = sch.split(sch.get_loops(writer)[-1], [None, lanes])
    sch.vectorize(writer_lanes)
    if dynamic or extent(sch, n) * extent(sch, p_outer) >= PARALLEL_PIXEL_TILES:
        sch.parallel(p_outer if dynamic else sch.fuse(n, p_outer))
    else:
        sch.parallel(sch.fuse(n, p_outer, f_outer))
    sch.vectorize(p_lanes)
    sch.unroll(p_vectors)
    sch.unroll(f_inner)
    sch.decompose_reduction(conv, rc)
    return p_outer
