"""Transposed convolution (ConvTranspose 1D and 2D, NCHW), as a gather over the input: no zero-inserted input.

TOPI lowers ``conv2d_transpose`` with stride ``s`` to a convolution over the
input dilated by zeros: ``s**2`` times the multiply-adds of the operator (4x at
stride 2), most of them by zeros, and a dilated copy as large as the output.
In output coordinates the operator is a gather (per spatial axis, with
``P`` the begin padding and ``K`` the kernel size)::

    out[o] = sum_{i, k : i*s + k = o + P} x[i] * w[k]
           = sum_{j < J} x[q - j] * w[r + s*j],   q = (o + P) // s,  r = (o + P) % s,  J = ceil(K / s)

(``w`` is zero past ``K``, ``x`` past its edges). The rule replaces TOPI's
stages (``data_dilate``, ``data_pad``, the kernel flip, ``compute``) with
three of its own (:mod:`forge_core.schedules.rewrite`): a padded input (only
when some ``q - j`` leaves the input), the weights repacked at compile time
by phase, ``wp[f, c, r, j] = w[c, f, r + s*j]``, and the gather, which writes
the buffer the fused epilogue reads. Then it tiles the gather one of two ways:

* **By pixels** (few output channels, or a number of them no vector divides:
  DBNet's heads have 24 and 1): a register tile of ``mf`` channels x ``s``
  phases x ``nv`` vectors of ``q``. Within a phase consecutive ``q`` read
  consecutive inputs, so the loads are whole vectors and each weight is a
  broadcast scalar. The accumulators are kept phase-major, and the write-back
  (with the epilogue) runs vectorized over ``q`` per phase, storing every
  ``s``-th output.
* **By channels** (a multiple of the vector width of output channels):
  :class:`~forge_core.schedules.conv2d.Conv2dNCHW`'s tile, ``xt`` outputs of
  a row x one vector of channels, weights ``[F/v, C, s, J, v]``.

Measured on AVX-512 (2 cores, fastest of 200 runs), DBNet's two heads (kernel 2,
stride 2): 24->24 channels at 160x160->320x320 with batch norm and ReLU, 1 s
under TVM's reduction rule (TOPI's stages) -> 1.2 ms (onnxruntime 2.2 ms); 24->1
at 320x320->640x640 with a sigmoid, 155 ms -> 0.58 ms (onnxruntime 0.56 ms).
Declined: dilation (a kernel with holes), 3D.

**A dynamic batch, height or width** (the channels and the kernel static):
the same gather, its sizes expressions of the dims (the stride read off
``data_dilate``'s ``x[.., v // s]``), tiled by channels with the last tile of
a row clamped to the row's end (:func:`~forge_core.schedules.dynamic_conv.clamp_last_tile`).
DBNet's heads over a dynamic size, same CPU (Zen 1, AVX2, 2 cores): 24->24 at
160x160 3.2 ms (static 2.6 ms), 24->1 at 320x320 1.8 ms (static 0.8 ms); on
TOPI's stages they had taken 770 and 131 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.sym import Analyzer

from forge_core.schedules.blocks import blocks, extent, largest_divisor, linear_terms, name_of, vector_unit
from forge_core.schedules.conv2d import PREPACK
from forge_core.schedules.dynamic_conv import clamp_last_tile
from forge_core.schedules.epilogue import attach_epilogue, schedule_padding, split_epilogue, vectorize_write_back
from forge_core.schedules.rewrite import (
    alloc, const, dims_of, dtype_of, load, replace_stages, shape_of, stage, top_level_blocks)

# TOPI's stage names, in order (the kernel flip is "kernel_transform" in 2D, "kernel" in 1D).
STAGES = ("data_dilate", "data_pad", "kernel", "compute")
# Pixel tile: output channels per tile, the widest that divides the channel count.
CHANNEL_TILES = (8, 6, 4, 3, 2, 1)
GATHER = "conv_transpose_gather"
# Vectors of q in a pixel tile over a dynamic row: wider tiles leave narrower images to the guarded loop.
DYNAMIC_VECTORS = 4


@dataclass(frozen=True)
class Transpose:
    """A transposed convolution read off TOPI's stages; tuples have one entry per spatial axis."""

    data: object  # the input buffer [N, C, *I]
    weight: object  # the weight buffer [C, F/groups, *K]
    out: object  # the buffer the gather writes [N, F, *O]
    replaced: tuple[str, ...]
    groups: int
    stride: tuple[int, ...]
    pad: tuple[int, ...]  # begin padding P

    @property
    def rank(self) -> int:
        return len(self.stride)

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(shape_of(self.weight)[2:])

    @property
    def taps(self) -> tuple[int, ...]:
        """J per axis: the kernel positions of one output phase."""
        return tuple(-(-k // s) for k, s in zip(self.kernel, self.stride))


def read_transpose(func: tirx.PrimFunc) -> Transpose | None:
    """The transposed convolution TOPI's stages compute, or None when ``func`` is not one."""
    stages = top_level_blocks(func)
    names = [str(b.name_hint) for b in stages]
    # TOPI's four stages first (a dilated kernel adds a "kernel_dilate" stage: declined), then the epilogue.
    if len(names) < 4 or any(not n.startswith(p) for n, p in zip(names, STAGES)) or "kernel_dilate" in names[2]:
        return None
    dilate, pad, flip, conv = stages[:4]
    rank = len(conv.iter_vars) // 2 - 1
    if rank not in (1, 2) or "".join("S" if iv.iter_type == tirx.IterVar.DataPar else "R"
                                     for iv in conv.iter_vars) != "S" * (rank + 2) + "R" * (rank + 1):
        return None
    data, weight, out = dilate.reads[0].source, flip.reads[0].source, conv.writes[0].source
    n, c, *sizes = dims_of(data)
    _, f, *outs = dims_of(out)
    kernel = dims_of(weight)[2:]
    dilated = dims_of(dilate.writes[0].source)[2:]
    if not all(isinstance(d, int) for d in (c, f, *dims_of(weight))):
        return None  # only the batch and the spatial sizes may be dynamic
    if len(sizes) != rank or len(kernel) != rank or shape_of(weight)[0] != c or f % shape_of(weight)[1]:
        return None
    groups = f // shape_of(weight)[1]
    if c % groups:
        return None
    analyzer = Analyzer()
    stride, begin = [], []
    for axis in range(rank):
        size, length = sizes[axis], dilated[axis]
        if not isinstance(size, int) or not isinstance(length, int):
            # A dynamic size: the stride is the divisor of data_dilate's read, x[.., v // s].
            s = _dilation_stride(dilate, axis)
            if s is None or not analyzer.can_prove_equal(length, (size - 1) * s + 1):
                return None
        elif size > 1:
            if (length - 1) % (size - 1):
                return None
            s = (length - 1) // (size - 1)
        else:
            s = 1  # one input row: every stride gives the same output
        # data_pad reads data_dilate[.., v - (K - 1 - P)]
        var = pad.iter_vars[2 + axis].var
        offset = linear_terms(pad.reads[0].region[2 + axis].min, var)
        if offset is None or offset[0] != 1:
            return None
        p = kernel[axis] - 1 + offset[1]
        padded = dims_of(pad.writes[0].source)[2 + axis]
        if p < 0 or not analyzer.can_prove_equal(padded - kernel[axis] + 1, outs[axis]):
            return None
        stride.append(s)
        begin.append(p)
    return Transpose(data, weight, out, tuple(names[:4]), groups, tuple(stride), tuple(begin))


def _dilation_stride(dilate: s_tir.SBlock, axis: int) -> int | None:
    """The stride TOPI's ``data_dilate`` spreads spatial axis ``axis`` by: it reads ``x[.., v // s]`` (``x[.., v]``
    at stride 1)."""
    index = dilate.reads[0].region[2 + axis].min
    var = dilate.iter_vars[2 + axis].var
    if isinstance(index, tirx.Var) and index.same_as(var):
        return 1
    if isinstance(index, tirx.FloorDiv) and isinstance(index.a, tirx.Var) and index.a.same_as(var) \
            and isinstance(index.b, tirx.IntImm) and int(index.b) > 0:
        return int(index.b)
    return None


def _larger(analyzer: Analyzer, a, b):
    """``max(a, b)`` of two extents, symbolic ones included (the larger where it can be proven)."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if analyzer.can_prove(a >= b):
        return a
    if analyzer.can_prove(b >= a):
        return b
    return tirx.max(a, b)


def _cast(value, dtype: str):
    return value if str(value.ty) == dtype else value.astype(dtype)


def gather_stages(t: Transpose, vec: int, params) -> tuple[list[tirx.Stmt], list]:
    """The padded input (when needed), the weights by phase ``[F/vec, C/g, *s, *J, vec]``, and the gather.

    The weight repacking is marked for compile-time folding when the weight is
    a parameter of the function (``params``).
    """
    n, c, *sizes = dims_of(t.data)
    _, f, *outs = dims_of(t.out)
    per_group_in, per_group_out = c // t.groups, f // t.groups
    taps, kernel = t.taps, t.kernel
    out_dtype = dtype_of(t.out)
    stmts, allocs = [], []

    analyzer = Analyzer()
    last_q = [(o - 1 + p) // s for o, p, s in zip(outs, t.pad, t.stride)]
    padded = [_larger(analyzer, size, q + 1) + j - 1 for size, q, j in zip(sizes, last_q, taps)]
    source = t.data
    if not all(analyzer.can_prove_equal(a, b) for a, b in zip(padded, sizes)):
        source = alloc("pad_temp", [n, c, *padded], dtype_of(t.data))
        allocs.append(source)

        def pad_value(b, ch, *pos):
            inside = tirx.all(*[tirx.all(p >= j - 1, p < j - 1 + size) for p, j, size in zip(pos, taps, sizes)])
            return tirx.if_then_else(inside, load(t.data, [b, ch, *[p - (j - 1) for p, j in zip(pos, taps)]]),
                                     tirx.const(0, dtype_of(t.data)))

        stmts.append(stage("pad_temp", source, pad_value, [t.data]))

    packed = alloc("weight_by_phase", [f // vec, per_group_in, *t.stride, *taps, vec], dtype_of(t.weight))
    allocs.append(packed)

    def weight_value(fo, ch, *rest):
        phases, js, fi = rest[:t.rank], rest[t.rank:2 * t.rank], rest[-1]
        oc = fo * vec + fi
        group_in = (oc // per_group_out) * per_group_in if t.groups > 1 else const(0)
        positions = [r + s * j for r, s, j in zip(phases, t.stride, js)]
        inside = tirx.all(*[pos < k for pos, k in zip(positions, kernel)])
        clamped = [tirx.min(pos, const(k - 1)) for pos, k in zip(positions, kernel)]
        return tirx.if_then_else(inside, load(t.weight, [group_in + ch, oc % per_group_out, *clamped]),
                                 tirx.const(0, dtype_of(t.weight)))

    constant = any(p.same_as(t.weight) for p in params)
    stmts.append(stage("weight_by_phase", packed, weight_value, [t.weight],
                       annotations={PREPACK: True} if constant else None))

    def gather_value(b, oc, *rest):
        pos, ch, js = rest[:t.rank], rest[t.rank], rest[t.rank + 1:]
        shifted = [o + p for o, p in zip(pos, t.pad)]
        in_channel = (oc // per_group_out) * per_group_in + ch if t.groups > 1 else ch
        x = load(source, [b, in_channel, *[tirx.floordiv(v, s) - j + (tap - 1)
                                           for v, s, j, tap in zip(shifted, t.stride, js, taps)]])
        w = load(packed, [oc // vec, ch, *[tirx.floormod(v, s) for v, s in zip(shifted, t.stride)], *js, oc % vec])
        return _cast(x, out_dtype) * _cast(w, out_dtype)

    stmts.append(stage(GATHER, t.out, gather_value, [source, packed], reduce=[per_group_in, *taps]))
    return stmts, allocs


class ConvTransposeNCHW(dlight.ScheduleRule):
    """Transposed convolutions (1D and 2D, any groups, no dilation) as a phase-split gather; see the module."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc):
            return None
        t = read_transpose(func)
        if t is None:
            return None
        unit = vector_unit(target)
        dtype = dtype_of(t.out)
        lanes = unit.lanes(dtype)
        _, f, *outs = dims_of(t.out)
        if not all(isinstance(d, int) for d in outs):
            return _dynamic(func, t, unit)
        width, s = outs[-1], t.stride[-1]
        phases = width // s if width % s == 0 else 0
        q_vec = unit.vector_factor(phases, dtype) if phases else 1
        # A vector of channels stays within a group: its lanes read one input channel.
        channel_vec = unit.vector_factor(f // t.groups, dtype)
        by_pixels = q_vec >= 4 and (channel_vec < lanes or t.groups > 1)
        stmts, allocs = gather_stages(t, 1 if by_pixels else channel_vec, func.params)
        sch = s_tir.Schedule(replace_stages(func, t.replaced, stmts, allocs))
        conv = next(b for b in blocks(sch) if name_of(sch, b) == GATHER)
        if by_pixels:
            _tile_by_pixels(sch, conv, unit, t, q_vec)
        else:
            _tile_by_channels(sch, conv, unit, t, channel_vec)
        schedule_padding(sch, lanes)
        return sch


def _split_rows(sch: s_tir.Schedule, t: Transpose, rows: list) -> tuple[list, list]:
    """Rows split into periods of the row stride: ``(outer rows, [row phase])`` (no phase at stride 1).

    The phase of row ``y`` is then ``(y_phase + P) % s``, a constant of the
    unrolled or serial phase loop, and the parallel loop carries whole
    periods. With the row itself in the parallel loop, TVM 0.27's
    FlattenBuffer rewrote the phase-split weight index
    ``(fused % 132 // 44) * 4096 + ((fused % 44 + 1) % 4) * 32`` into
    ``((fused + 1) % 132 // 44) * 4096 + ...``: the last row of every channel
    block read the next block's weights (stride 4, padding 1, 44 rows).
    """
    if t.rank < 2 or t.stride[0] == 1:
        return rows, []
    outer, phase = sch.split(rows[0], [None, t.stride[0]])
    return [outer], [phase]


def _tile_by_pixels(sch: s_tir.Schedule, conv: s_tir.SBlockRV, unit, t: Transpose, q_vec: int, *,
                    dynamic: bool = False) -> tuple[s_tir.LoopRV, int]:
    """``mf`` channels x ``sy`` row phases x ``sx`` column phases x ``nv`` vectors of ``q``; see the module.
    Returns the loop over a row's tiles and the pixels of a tile.

    The rows of one period (``sy`` of them, when they divide the height) share
    a tile: with ``K <= s`` they read the same input row, which is then loaded
    once for all of them (half the loads of DBNet's stride-2 heads).

    Over a dynamic width (``dynamic``; its output a whole number of periods) the
    tile's ``nv`` fills the registers, the last tile of a row is left for the
    caller to clamp, and the rows alone are parallel.
    """
    loops = sch.get_loops(conv)
    n, f, *spatial = loops[:2 + t.rank]
    reduction = loops[2 + t.rank:]
    rows, x = spatial[:-1], spatial[-1]
    channels, s = extent(sch, f), t.stride[-1]
    analyzer = Analyzer()
    row_phases = t.stride[0] if t.rank == 2 and analyzer.can_prove_equal(
        tirx.floormod(sch.get(rows[0]).extent, t.stride[0]), 0) else 1
    budget = unit.accumulators
    vectors = None if dynamic else extent(sch, x) // s // q_vec
    # The most accumulators, then the fewest loads per multiply-add.
    best = None
    for mf in CHANNEL_TILES:
        per_vector = mf * s * row_phases
        if channels % mf or per_vector > budget:
            continue
        nv = min(budget // per_vector, DYNAMIC_VECTORS) if vectors is None \
            else largest_divisor(vectors, budget // per_vector)
        score = (per_vector * nv, -(per_vector + nv) / (per_vector * nv))
        if best is None or score > best[0]:
            best = (score, mf, nv)
    if best is None:  # the row phases alone overflow the registers
        row_phases, mf = 1, 1
        nv = min(max(1, budget // s), DYNAMIC_VECTORS) if vectors is None \
            else largest_divisor(vectors, max(1, budget // s))
    else:
        _, mf, nv = best

    epilogue = split_epilogue(sch, conv)
    f_outer, f_inner = sch.split(f, [None, mf])
    rows, row_phase = _split_rows(sch, t, rows) if row_phases > 1 or not dynamic else (rows, [])
    # The row phases inside the register tile when they all fit (whole periods), else one row at a time.
    in_tile, serial = (row_phase, []) if row_phases > 1 else ([], row_phase)
    x_outer, x_q, x_phase = sch.split(x, [None, nv * q_vec, s])
    q_vectors, q_lanes = sch.split(x_q, [None, q_vec])
    sch.reorder(n, f_outer, *rows, *serial, x_outer, *reduction, f_inner, *in_tile, x_phase, q_vectors, q_lanes)
    writer = attach_epilogue(sch, conv, epilogue)
    # Phase-major accumulators: a vector of consecutive q is contiguous.
    if t.rank == 1:
        sch.transform_layout(conv, ("write", 0), lambda b, c, x: (b, c, x % s, x // s))
    else:
        sch.transform_layout(conv, ("write", 0), lambda b, c, y, x: (b, c, y, x % s, x // s))
    sch.reverse_compute_at(writer, x_outer)
    w_x = sch.get_loops(writer)[-1]
    w_q, w_phase = sch.split(w_x, [None, s])
    w_vectors, w_lanes = sch.split(w_q, [None, q_vec])
    sch.reorder(w_phase, w_vectors, w_lanes)
    sch.vectorize(w_lanes)
    if dynamic:
        sch.parallel(rows[-1] if rows else f_outer)
    else:
        sch.parallel(sch.fuse(n, f_outer, *rows))
    sch.vectorize(q_lanes)
    for loop in (q_vectors, x_phase, *in_tile, f_inner):
        sch.unroll(loop)
    sch.decompose_reduction(conv, reduction[0])
    return x_outer, nv * q_vec * s


def _tile_by_channels(sch: s_tir.Schedule, conv: s_tir.SBlockRV, unit, t: Transpose, vec: int, *,
                      dynamic: bool = False) -> s_tir.LoopRV:
    """Conv2dNCHW's tile: ``xt`` outputs of a row x one vector of output channels; returns the loop over a row's
    tiles. Over a dynamic size (``dynamic``) the tile is whole phase periods of any row, the row phase is not
    split out, and the rows alone are parallel (an index divided by a symbolic row count builds slowly; a 1D
    one: the channels)."""
    loops = sch.get_loops(conv)
    n, f, *spatial = loops[:2 + t.rank]
    reduction = loops[2 + t.rank:]
    rows, x = spatial[:-1], spatial[-1]
    s = t.stride[-1]
    if dynamic:
        tile_x = _dynamic_row_tile(unit, s)
    else:
        width, cap = extent(sch, x), min(16, unit.accumulators)
        # A tile of whole phase periods keeps each output's phase a constant of the unrolled tile.
        periods = [d for d in range(cap, 0, -1) if width % d == 0 and d % s == 0]
        tile_x = periods[0] if periods else largest_divisor(width, cap)

    epilogue = split_epilogue(sch, conv)
    f_outer, f_inner = sch.split(f, [None, vec])
    rows, row_phase = (rows, []) if dynamic else _split_rows(sch, t, rows)
    x_outer, x_inner = sch.split(x, [None, tile_x])
    sch.reorder(n, f_outer, *rows, *row_phase, x_outer, *reduction, x_inner, f_inner)
    writer = attach_epilogue(sch, conv, epilogue)
    if t.rank == 1:
        sch.transform_layout(conv, ("write", 0), lambda a, b, x: (a, b // vec, x, b % vec))
    else:
        sch.transform_layout(conv, ("write", 0), lambda a, b, y, x: (a, b // vec, y, x, b % vec))
    sch.reverse_compute_at(writer, x_outer)
    if tile_x >= 4:
        vectorize_write_back(sch, writer)
    if dynamic:
        sch.parallel(rows[-1] if rows else f_outer)
    else:
        sch.parallel(sch.fuse(n, f_outer, *rows))
    if vec > 1:
        sch.vectorize(f_inner)
    sch.unroll(x_inner)
    sch.decompose_reduction(conv, reduction[0])
    return x_outer


def _dynamic(func: tirx.PrimFunc, t: Transpose, unit) -> s_tir.Schedule | None:
    """The gather over a dynamic height or width, its last tile of a row clamped to the row's end
    (:func:`~forge_core.schedules.dynamic_conv.clamp_last_tile`), the rows in parallel. The tile:

    * by pixels (``_tile_by_pixels``), where the static rule would tile so (fewer output channels than a
      vector: DBNet's 24->1 head) and the output row is provably whole periods of the stride (``2 * width``
      at kernel 2, stride 2), so that a clamped tile still starts on a period and each output's phase is a
      constant of the unrolled tile. DBNet's 24->1 head at 320x320 for AVX2 (AMD EPYC Zen 4, 2 cores): 1.5 ms
      by one channel, 0.85-1.2 ms by pixels (static 0.65-0.75 ms);
    * else one vector of channels (or fewer) by whole phase periods of a row (``_tile_by_channels``); the
      output phase of a pixel is computed from its position, as the clamped tile may start anywhere in the row.
    """
    dtype = dtype_of(t.out)
    lanes = unit.lanes(dtype)
    _, f, *outs = dims_of(t.out)
    # A vector of channels stays within a group: its lanes read one input channel.
    vec = unit.vector_factor(f // t.groups, dtype)
    # By pixels as the static rule would (few channels), when a row is whole periods of the stride (DBNet's
    # heads: kernel 2, stride 2, twice the input's width): every tile then starts on a period.
    by_pixels = lanes >= 4 and (vec < lanes or t.groups > 1) and Analyzer().can_prove_equal(
        tirx.floormod(outs[-1], t.stride[-1]), 0)
    stmts, allocs = gather_stages(t, 1 if by_pixels else vec, func.params)
    sch = s_tir.Schedule(replace_stages(func, t.replaced, stmts, allocs))
    conv = next(b for b in blocks(sch) if name_of(sch, b) == GATHER)
    if by_pixels:
        x_outer, tile = _tile_by_pixels(sch, conv, unit, t, lanes, dynamic=True)
    else:
        x_outer = _tile_by_channels(sch, conv, unit, t, vec, dynamic=True)
        tile = _dynamic_row_tile(unit, t.stride[-1])
    schedule_padding(sch, lanes)
    clamped = clamp_last_tile(sch.mod["main"], sch.get(x_outer), tile, outs[-1])
    return None if clamped is None else s_tir.Schedule(clamped)


def _dynamic_row_tile(unit, stride: int) -> int:
    """Pixels of a row in a tile over a dynamic width: the most whole phase periods the registers hold."""
    return max(d for d in range(1, min(16, unit.accumulators) + 1) if d % stride == 0 or d == 1)
