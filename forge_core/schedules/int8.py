"""uint8 x int8 -> int32 convolutions and dense layers on byte dot-product instructions.

The integer operators of :mod:`forge_core.quantization.lowering` reduce over
input channels (or ``K``) in groups of 4 bytes: one ``vpdpbusd`` (x86 VNNI)
multiplies 4 uint8 activations, broadcast, by a 16 x 4 int8 weight block and
adds the 16 dot products into 16 int32 lanes, 64 multiply-adds per
instruction where fp32 FMA does 16.

* :class:`Int8Matmul`: ``C[.., i, j] += A[.., i, k] * B[k, j]`` with ``B`` a
  constant; ``B`` repacked at compile time to ``[N/16, K/4, 16, 4]``; a
  register tile of up to 8 rows x one or two 16-lane vectors; ``k`` split by
  4 and the inner ``16 x 4`` tensorized.
* :class:`Int8Conv2dNCHW`: groups=1; the weight repacked at compile time to
  ``[F/16, C/4, KH, KW, 16, 4]``, the input repacked once per call to
  ``[N, C/4, H, W, 4]`` (four channels of a pixel contiguous, the
  broadcast operand; vector interleaves, :func:`pack_channels`); a register
  tile of up to 14 output pixels x one or two vectors of 16 output channels,
  the ``16 x 4`` inner block tensorized; the fused requantizing epilogue
  writes each tile back (a row per channel, :func:`store_transposed`).

* :class:`Int8PointwiseConv2dNCHW`: 1x1, stride 1, ``16 | H*W``: pixels as
  lanes instead (``vpdpbusd`` on 16 pixels x 4 input channels and 4 weights of
  one output channel, broadcast), so the epilogue reads and writes whole
  vectors of an NCHW row; it comes first.

The channel-lane rules need 16 | output channels (or 8: the 256-bit form, 8 lanes; MobileNet's
24-channel layers) and 4 | the reduction (the lowering pads input channels
to a multiple of 4) and a target with AVX-512 VNNI, or AVX-VNNI (Alder Lake and
later cores without AVX-512: the 8-lane form only, a register tile of at most
12 accumulators of its 16 ymm registers, no pixel-lane rule). On Arm with ``+dotprod``
the same rules use ``sdot`` (int8 x int8, the lowering then keeps activations
int8): 4-lane accumulators, up to 4 side by side.

**x86 without a byte dot product** (AVX2: Haswell to Zen 3; AVX-512 without
VNNI: Skylake-SP) takes the same three rules on ``vpmaddwd``, the exact form
the issue names (``vpmovzxbw`` + ``vpmaddwd``, as onnxruntime's u8u8 AVX2
kernels): the lowering holds the int8 weights as int16 (their repack is
folded at compile time, as a plain layout copy that MetaSchedule's builder
also removes when it measures), the input repack writes the uint8
activations as int16 (a zero extension, exact) in pairs of input
channels, and each instruction multiplies 2 activations, broadcast, by 8 (AVX2)
or 16 (AVX-512) pairs of weights into int32 lanes: 16 or 32 multiply-adds
where fp32 FMA does 8 or 16, and never a saturation (``|255 x -128| x 2 <
2^31``). AVX2 keeps 12 accumulators of its 16 registers.

Otherwise (a target without AVX2, or channel counts the rules do not take)
the integer operator takes the generic convolution or matmul rule (correct,
int32 multiply-adds, slower). They never use the saturating ``pmaddubsw``
(see :mod:`forge_core.schedules.dot_intrinsics`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules import dot_intrinsics
from forge_core.schedules.blocks import (
    blocks, extent, is_static, iter_kinds, largest_divisor, name_of, producer, row_block,
)
from forge_core.schedules.conv2d import PREPACK
from forge_core.schedules.epilogue import (
    attach_epilogue, inline_side_inputs, parallel_vectorized, split_epilogue, vectorize_write_back,
)

LANES = 16
UNIT = 4


@dataclass(frozen=True)
class DotProduct:
    """A target's byte dot product: the activation dtype it multiplies and its accumulator widths."""

    data_dtype: str
    intrinsics: dict[int, str]  # int32 lanes per accumulator -> tensor intrinsic, widest first
    max_vectors: int  # accumulators side by side along the output channels
    accumulators: int = 28  # of 32 vector registers (AVX-512, NEON), the rest for operands
    widened: str | None = None  # the dtype the operands are held in (AVX2: int16; activations widened in the repack)
    pixels: tuple[int, str] | None = None  # pixels as lanes (:class:`Int8PointwiseConv2dNCHW`): lanes, intrinsic

    @property
    def unit(self) -> int:
        """Input channels an instruction adds into each lane: 4 bytes, or 2 widened (int16) values."""
        return 2 if self.widened is not None else UNIT

    @property
    def weight(self) -> str:
        """The weights' dtype in the lowered module (:func:`~forge_core.quantization.lowering.lower_to_integer`
        holds them in the widened dtype, which the weight repack, folded at compile time, keeps)."""
        return self.widened or "int8"

    def lanes_for(self, channels: int) -> int | None:
        return next((lanes for lanes in self.intrinsics if channels % lanes == 0), None)


def dot_product(target: tvm.target.Target) -> DotProduct | None:
    """x86 AVX-512 VNNI (uint8 x int8, 16 or 8 lanes), AVX-VNNI (8 lanes: Alder Lake and later cores without
    AVX-512), Arm ``+dotprod`` (int8 x int8, 4 lanes), x86 AVX-512BW or AVX2 without VNNI (operands widened to
    int16 pairs, ``vpmaddwd``), or None."""
    if target.kind.name != "llvm":
        return None
    from tvm.target import codegen

    try:
        if codegen.target_has_features("avx512vnni", target):
            return DotProduct("uint8", {16: dot_intrinsics.VNNI_16x4, 8: dot_intrinsics.VNNI_8x4}, 2,
                              pixels=(LANES, dot_intrinsics.VNNI_PIXELS_16x4))
        if codegen.target_has_features("avxvnni", target):  # AVX-VNNI without AVX-512: 16 ymm registers
            return DotProduct("uint8", {8: dot_intrinsics.VNNI_8x4}, 2, accumulators=12)
        if codegen.target_has_features("dotprod", target):
            return DotProduct("int8", {4: dot_intrinsics.SDOT_4x4}, 4)
        if codegen.target_has_features("avx512bw", target):  # AVX-512 without VNNI (Skylake-SP): vpmaddwd on zmm
            return DotProduct("uint8", {16: dot_intrinsics.PMADDWD_16x2, 8: dot_intrinsics.PMADDWD_8x2}, 2,
                              widened="int16", pixels=(16, dot_intrinsics.PMADDWD_PIXELS_16x2))
        if codegen.target_has_features("avx2", target):  # no byte dot product: int16 pairs, vpmaddwd
            return DotProduct("uint8", {8: dot_intrinsics.PMADDWD_8x2}, 2, accumulators=12, widened="int16",
                              pixels=(8, dot_intrinsics.PMADDWD_PIXELS_8x2))
    except Exception:  # noqa: BLE001 - a target LLVM does not know
        return None
    return None


def has_vnni(target: tvm.target.Target) -> bool:
    """Whether ``target`` is an x86 CPU with VNNI (AVX-512 VNNI, or AVX-VNNI)."""
    found = dot_product(target)
    return found is not None and found.data_dtype == "uint8" and found.widened is None


def _vectors(channels: int, lanes: int, most: int) -> int:
    return next(v for v in range(most, 0, -1) if channels % (v * lanes) == 0)


def _widest_tile(dot: DotProduct, channels: int, lanes: int, extent_: int, most: int) -> tuple[int, int]:
    """``(vectors, rows)`` of the widened (``vpmaddwd``) kernels: the tile of most accumulators, up to
    ``dot.max_vectors`` vectors of ``lanes`` channels dividing ``channels`` by up to ``most`` rows (or
    pixels) dividing ``extent_``; ties take more vectors (fewer broadcasts a multiply-add). Measured on
    AVX2 (12 accumulators): 7 pixels x 1 vector on 7-pixel rows, where the VNNI rules' 2 x 1 took 1.9x the
    time; 3 vectors x 4 rows leave no register for the operands (a 768-wide matmul: 1.5x 4 x 2's time)."""
    tiles = [(v, largest_divisor(extent_, min(most, dot.accumulators // v)))
             for v in range(1, dot.max_vectors + 1) if channels % (v * lanes) == 0]
    return max(tiles, key=lambda tile: (tile[0] * tile[1], tile[0]))


def _takes_int8(func: tirx.PrimFunc, weight: str = "int8") -> bool:
    """A ``weight``-typed parameter (the weight: int8, or int16 for the widened kernels): the cheap test that
    lets every float function pass by."""
    return isinstance(func, tirx.PrimFunc) and any(
        isinstance(p, tirx.Buffer) and str(p.dtype) == weight for p in func.params)


def _byte_operands(stmt: tirx.SBlock, dot: DotProduct) -> bool:
    """Reads the dot product's data dtype and an int8 weight, writes int32."""
    if len(stmt.reads) < 2:
        return False
    data, weight = stmt.reads[0].source, stmt.reads[-1].source
    return (str(data.dtype), str(weight.dtype), str(stmt.writes[0].source.dtype)) == (dot.data_dtype, dot.weight,
                                                                                      "int32")


def _candidate(func: tirx.PrimFunc, target: tvm.target.Target,
               select: Callable[[s_tir.Schedule, s_tir.SBlockRV], bool]
               ) -> tuple[DotProduct, s_tir.Schedule, s_tir.SBlockRV, tirx.SBlock] | None:
    """The checks both rules begin with: the target's dot product, a schedule of ``func`` and its one block.

    None unless ``func`` is a static PrimFunc with an int8 parameter, the
    target has a byte dot product, exactly one top-level block passes
    ``select`` and that block multiplies the dot product's operand dtypes
    into int32 (:func:`_byte_operands`). Else ``(dot, sch, block, stmt)``,
    ``stmt`` the block's statement.
    """
    dot = dot_product(target)
    if dot is None or not _takes_int8(func, dot.weight) or not is_static(func):
        return None
    sch = s_tir.Schedule(func)
    found = [b for b in blocks(sch) if select(sch, b)]
    if len(found) != 1:
        return None
    stmt = sch.get(found[0])
    if not _byte_operands(stmt, dot):
        return None
    return dot, sch, found[0], stmt


def _is_conv2d(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    return name_of(sch, block).startswith("conv2d_nchw") and iter_kinds(sch, block) == "SSSSRRR"


class Int8Matmul(dlight.ScheduleRule):
    """uint8 x int8 -> int32 dense/matmul with a constant ``[K, N]`` weight, VNNI-tensorized."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        # The function's only reduction: a matmul over its last iterator, all others spatial.
        found = _candidate(func, target, lambda sch, b: "R" in iter_kinds(sch, b))
        if found is None:
            return None
        dot, sch, mm, stmt = found
        kinds = iter_kinds(sch, mm)
        if "matmul" not in name_of(sch, mm) or not (kinds.endswith("SSR") and set(kinds[:-1]) == {"S"}):
            return None
        rhs = stmt.reads[1].source
        *batch, i, j, k = sch.get_loops(mm)
        rows, cols, depth = extent(sch, i), extent(sch, j), extent(sch, k)
        lanes = dot.lanes_for(cols)
        unit = dot.unit
        if len(rhs.shape) != 2 or [int(d) for d in rhs.shape] != [depth, cols] or lanes is None or depth % unit:
            return None
        dot_intrinsics.register()
        if dot.widened is not None:
            vectors, mt = _widest_tile(dot, cols, lanes, rows, 8)
        else:
            vectors = _vectors(cols, lanes, dot.max_vectors)
            # Measured with VNNI: 8 rows x 2 vectors beat 14 x 2 (operand loads); NEON's 4-lane tiles take 7 x 4.
            mt = largest_divisor(rows, min(14 if vectors == 1 else 8 if dot.max_vectors == 2 else dot.accumulators,
                                           dot.accumulators // vectors))

        inline_side_inputs(sch, mm, None)
        epilogue = split_epilogue(sch, mm)
        repack = sch.cache_read(mm, 1, "global")
        sch.transform_layout(mm, ("read", 1), lambda a, b: (b // lanes, a // unit, b % lanes, a % unit))
        sch.annotate(repack, PREPACK, True)
        if dot.widened is not None:  # the activations as the instruction reads them (a zero extension, exact)
            widened = sch.cache_read(mm, 0, "global")
            sch.unsafe_set_dtype(widened, 0, dot.widened)
            parallel_vectorized(sch, widened, 2 * LANES)
        i_outer, i_inner = sch.split(i, [None, mt])
        j_outer, j_vectors, j_lanes = sch.split(j, [None, vectors, lanes])
        k_outer, k_inner = sch.split(k, [None, unit])
        # Rows in blocks whose activations stay in L2 (``ROW_BLOCK_BYTES``); in a block, each weight panel
        # (``vectors`` x ``lanes`` columns) is loaded once for all of the block's rows.
        block = row_block(rows, mt, depth * (2 if dot.widened is not None else 1))
        i_block, i_outer = sch.split(i_outer, [None, block // mt])
        sch.reorder(*batch, i_block, j_outer, i_outer, k_outer, i_inner, j_vectors, j_lanes, k_inner)
        writer = attach_epilogue(sch, mm, epilogue)
        sch.reverse_compute_at(writer, i_outer)
        vectorize_tail(sch, writer)
        sch.parallel(sch.fuse(*batch, i_block, j_outer, i_outer))
        sch.unroll(i_inner)
        sch.unroll(j_vectors)
        sch.decompose_reduction(mm, k_outer)
        sch.tensorize(j_lanes, dot.intrinsics[lanes])
        return sch


def pack_channels(sch: s_tir.Schedule, packed: s_tir.SBlockRV, unit: int = UNIT) -> None:
    """Schedule the input repack (``packed`` writes ``unit`` channels of a pixel together) as vector interleaves.

    A plain copy of an NCHW input (or a widening one: int16 pairs for
    ``vpmaddwd``) is tensorized with
    :func:`~forge_core.schedules.dot_intrinsics.interleave` over the first of
    :data:`~forge_core.schedules.dot_intrinsics.INTERLEAVE_PIXELS` dividing
    its rows; anything else (a padding stage, another width) stays a parallel
    vectorized loop.
    """
    stmt = sch.get(packed)
    data = stmt.reads[0].source if len(stmt.reads) == 1 else None
    out = str(stmt.writes[0].source.dtype)
    value = stmt.body.value if isinstance(stmt.body, tirx.BufferStore) else None
    if isinstance(value, tirx.Cast) and data is not None and str(value.ty) == out != str(data.dtype):
        value = value.value  # widened as it is written (unsafe_set_dtype)
    plain = isinstance(value, tvm.ir.expr.TensorLoad)
    if data is None or not plain or len(data.shape) != 4 or int(data.shape[1]) % unit \
            or len(sch.get_loops(packed)) != 4:
        parallel_vectorized(sch, packed, UNIT * LANES)
        return
    width = int(data.shape[3])
    pixels = next((p for p in dot_intrinsics.INTERLEAVE_PIXELS if width % p == 0), None)
    if pixels is None:
        parallel_vectorized(sch, packed, UNIT * LANES)
        return
    sch.transform_block_layout(packed, lambda a, c, h, w: (a, c // unit, h, w, c % unit))
    a, c, h, w, k = sch.get_loops(packed)
    w_outer, w_inner = sch.split(w, [None, pixels])
    sch.reorder(a, c, h, w_outer, w_inner, k)
    sch.parallel(sch.fuse(a, c, h))
    sch.tensorize(w_inner, dot_intrinsics.interleave(pixels, str(data.dtype), unit, out))


def store_transposed(sch: s_tir.Schedule, writer: s_tir.SBlockRV, tile: s_tir.LoopRV, lanes: int) -> bool:
    """A byte-writing epilogue of a channel-lane tile: computed a pixel at a time, stored a row at a time.

    The epilogue ``writer``, placed under the ``tile`` loop (its loops: the
    tile's channels, then its pixels), computes into a local ``[pixels,
    channels]`` tile along the accumulators' lanes;
    :func:`~forge_core.schedules.dot_intrinsics.transpose` stores it into the
    NCHW output, one shuffle per channel row (LLVM had stored each byte with
    its own instruction: 60% of a 14x14 layer's time). False, and nothing
    changed, unless the tile has 16 lanes and the epilogue writes bytes.
    """
    out = sch.get(writer).writes[0].source
    if lanes != LANES or str(out.dtype) not in ("uint8", "int8") or len(out.shape) != 4:
        return False
    channels, pixels = (extent(sch, loop) for loop in sch.get_loops(writer)[-2:])
    if channels is None or pixels is None or channels % LANES:
        return False
    staged = sch.cache_write(writer, 0, "local")
    sch.reverse_compute_at(staged, tile)
    sch.transform_layout(writer, ("write", 0), lambda n, c, y, x: (n, y, x, c))
    c, x = sch.get_loops(writer)[-2:]
    sch.reorder(x, c)
    sch.vectorize(c)
    c, x = sch.get_loops(staged)[-2:]
    _, c_lanes = sch.split(c, [None, LANES])
    sch.tensorize(c_lanes, dot_intrinsics.transpose(pixels, LANES, str(out.dtype)))
    return True


def vectorize_tail(sch: s_tir.Schedule, writer: s_tir.SBlockRV) -> None:
    """Vectorize the epilogue's innermost loop when it is a whole vector of int32/float32 lanes."""
    loops = sch.get_loops(writer)
    if loops and (extent(sch, loops[-1]) or 0) % LANES == 0:
        _, inner = sch.split(loops[-1], [None, LANES])
        sch.vectorize(inner)


class Int8Conv2dNCHW(dlight.ScheduleRule):
    """uint8 x int8 -> int32 convolution, groups=1, NCHW, VNNI-tensorized (see the module doc)."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = _candidate(func, target, _is_conv2d)
        if found is None:
            return None
        dot, sch, conv, stmt = found
        weight = stmt.reads[-1].source
        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        channels_out, channels_in, width = extent(sch, f), extent(sch, rc), extent(sch, x)
        lanes = dot.lanes_for(channels_out)
        if len(weight.shape) != 4 or [int(d) for d in weight.shape[:2]] != [channels_out, channels_in] \
                or lanes is None or channels_in % UNIT:
            return None
        dot_intrinsics.register()
        unit = dot.unit
        if dot.widened is not None:
            vectors, tile_x = _widest_tile(dot, channels_out, lanes, width, 14)
        else:  # VNNI: two vectors of channels only on short rows (more pixels per tile on wide ones)
            vectors = _vectors(channels_out, lanes, dot.max_vectors if lanes < 16 or width <= 7 else 1)
            tile_x = largest_divisor(width, min(14, dot.accumulators // vectors))

        data = stmt.reads[0].source
        inline_side_inputs(sch, conv, producer(sch, conv, data))
        epilogue = split_epilogue(sch, conv)
        repack = sch.cache_read(conv, len(stmt.reads) - 1, "global")
        sch.transform_layout(conv, ("read", len(stmt.reads) - 1),
                             lambda o, i, h, w: (o // lanes, i // unit, h, w, o % lanes, i % unit))
        sch.annotate(repack, PREPACK, True)
        # The input, four channels of each pixel together: written so by the padding stage, or repacked.
        packed = producer(sch, conv, data)
        if packed is not None:
            sch.transform_layout(packed, ("write", 0), lambda a, c, h, w: (a, c // unit, h, w, c % unit))
        else:
            packed = sch.cache_read(conv, 0, "global")
            sch.transform_layout(packed, ("write", 0), lambda a, c, h, w: (a, c // unit, h, w, c % unit))
        if dot.widened is not None:  # the activations as the instruction reads them (a zero extension, exact)
            sch.unsafe_set_dtype(packed, 0, dot.widened)

        f_outer, f_vectors, f_lanes = sch.split(f, [None, vectors, lanes])
        x_outer, x_inner = sch.split(x, [None, tile_x])
        rc_outer, rc_inner = sch.split(rc, [None, unit])
        sch.reorder(n, f_outer, y, x_outer, rc_outer, ry, rx, x_inner, f_vectors, f_lanes, rc_inner)
        writer = attach_epilogue(sch, conv, epilogue)
        sch.transform_layout(conv, ("write", 0), lambda a, b, c, d: (a, b // lanes, c, d, b % lanes))
        sch.reverse_compute_at(writer, x_outer)
        if not store_transposed(sch, writer, x_outer, lanes) and tile_x >= 4:
            vectorize_write_back(sch, writer)
        sch.parallel(sch.fuse(n, f_outer, y))
        sch.unroll(x_inner)
        sch.unroll(f_vectors)
        sch.decompose_reduction(conv, rc_outer)
        sch.tensorize(f_lanes, dot.intrinsics[lanes])
        pack_channels(sch, packed, unit)
        return sch


class Int8PointwiseConv2dNCHW(dlight.ScheduleRule):
    """uint8 x int8 -> int32 1x1 convolution (stride 1, no padding) with 16 pixels per VNNI lane vector.

    Pixels as lanes, not output channels: ``vpdpbusd`` multiplies 16 pixels x
    4 input channels of the input (repacked per call to ``[N, C/4, H*W, 4]``)
    by 4 weights of one output channel, broadcast. Each accumulator then holds
    16 consecutive pixels of one channel: the epilogue reads and writes NCHW
    rows as whole vectors, with one scale per accumulator. A register tile of
    up to 14 output channels x two vectors of pixels; the weight is read as
    it is (``[F, C]``: 4 input channels of an output channel are contiguous).

    Needs x86 AVX-512 VNNI, ``16 | H*W`` and ``4 | C``. Feature maps of many
    pixels and few channels (MobileNet's expansions) are where it beats the
    channel-lane :class:`Int8Conv2dNCHW`, whose epilogue reads the
    accumulators across their lanes.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = _candidate(func, target, _is_conv2d)
        if found is None:
            return None
        dot, sch, conv, stmt = found
        if dot.pixels is None:
            return None
        lanes, intrinsic = dot.pixels
        unit = dot.unit
        data, weight = stmt.reads[0].source, stmt.reads[-1].source
        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        channels_out, channels_in = extent(sch, f), extent(sch, rc)
        height, width = extent(sch, y), extent(sch, x)
        pixels = height * width
        copy = producer(sch, conv, data)  # TOPI's padding stage, a plain copy when the padding is 0
        if [int(d) for d in weight.shape] != [channels_out, channels_in, 1, 1] or channels_in % UNIT \
                or pixels % lanes or [int(d) for d in data.shape[2:]] != [height, width] \
                or (copy is not None and [int(d) for d in sch.get(copy).reads[0].source.shape] != list(data.shape)):
            return None
        dot_intrinsics.register()
        vectors = 2 if pixels % (2 * lanes) == 0 else 1
        tile_f = largest_divisor(channels_out, dot.accumulators // vectors)

        inline_side_inputs(sch, conv, copy)
        epilogue = split_epilogue(sch, conv)
        # The weight's 4 input channels innermost (a transpose of its 1x1 dims, folded at compile time).
        repack = sch.cache_read(conv, len(stmt.reads) - 1, "global")
        sch.transform_layout(conv, ("read", len(stmt.reads) - 1), lambda o, i, h, w: (o, h, w, i))
        sch.annotate(repack, PREPACK, True)
        packed = copy if copy is not None else sch.cache_read(conv, 0, "global")
        sch.transform_layout(packed, ("write", 0),
                             lambda a, c, h, w: (a, c // unit, h * width + w, c % unit))
        if dot.widened is not None:
            sch.unsafe_set_dtype(packed, 0, dot.widened)
        writer = attach_epilogue(sch, conv, epilogue)
        sch.transform_layout(conv, ("write", 0), lambda a, o, h, w: (a, o, h * width + w))
        sch.transform_block_layout(conv, lambda a, o, h, w, i, kh, kw: (a, o, h * width + w, i, kh, kw))
        sch.transform_block_layout(writer, lambda a, o, h, w: (a, o, h * width + w))
        n, f, p, rc, ry, rx = sch.get_loops(conv)
        f_outer, f_inner = sch.split(f, [None, tile_f])
        p_outer, p_vectors, p_lanes = sch.split(p, [None, vectors, lanes])
        rc_outer, rc_inner = sch.split(rc, [None, unit])
        sch.reorder(n, p_outer, f_outer, rc_outer, ry, rx, f_inner, p_vectors, p_lanes, rc_inner)
        sch.reverse_compute_at(writer, f_outer)
        _, writer_lanes = sch.split(sch.get_loops(writer)[-1], [None, lanes])
        sch.vectorize(writer_lanes)
        sch.parallel(sch.fuse(n, p_outer, f_outer))
        sch.unroll(f_inner)
        sch.unroll(p_vectors)
        sch.decompose_reduction(conv, rc_outer)
        sch.tensorize(p_lanes, intrinsic)
        pack_channels(sch, packed, unit)
        return sch
