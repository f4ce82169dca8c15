"""Convolutions over a dynamic height and width (a detector taking images of any size).

:class:`~forge_core.schedules.conv2d.Conv2dNCHW` tiles a static row: ``xt``
output pixels x one to four vectors of output channels, the weights repacked.
Here the row's width is dynamic. Split by the tile, its last tile would be
guarded by the width in every multiply-add, which keeps the registers from
being a tile: the 64->64 3x3 convolution at 160x160 ran 10x slower than the
static one. Instead the tile's start is clamped, ``min(x0 * xt, width - xt)``
(:func:`clamp_last_tile`): the last tile of a row ends at the row's end and
overlaps the tile before (its pixels are computed twice, with the same values;
nothing reads the output), and no multiply-add is guarded. A row narrower than
a tile takes the guarded form of the same loop. The clamped loop has its own
accumulators: shared with the guarded loop, they were allocated above both,
sized by the dynamic row, and stayed in memory (a store after every
multiply-add: DBNet's 96->24 3x3 convolution took 40 ms in the model, the
static kernel 20).

* :class:`~forge_core.schedules.pointwise_conv2d.DynamicPointwiseConv2dNCHW`: 1x1, stride 1: the static
  pointwise rule's tile (output channels x vectors of pixels) over the fused pixel axis of ``H * W`` pixels,
  its last tile clamped to the map's end.
* :class:`DynamicConv2dNCHW`: groups=1, the static rule's tile; the rows alone
  in parallel (the static rule's ``(image, channel block, row)`` fused loop
  divides every index by the symbolic row count: 2-3x the build time, for the
  same speed).
* :class:`DynamicGroupedConv2dNCHW`: depthwise and grouped, one vector of a
  row's outputs a tile, (image, channel) planes in parallel.
* :class:`DynamicExcitationConv2dNCHW`: a squeeze-and-excite 1x1 convolution
  on a 1x1 map whose epilogue scales a map of a dynamic size.
* Transposed convolutions: :mod:`~forge_core.schedules.conv_transpose`'s
  gather, the same clamped tile; max and average pooling:
  :class:`~forge_core.schedules.pool.DynamicWindowPoolNCX`.

Measured on an AMD EPYC (Zen 1, AVX2, 2 cores), through ``forge.Runtime``: the
DBNet-style detector of ``benchmarks/models.py`` at 1x3x640x640 went from 1443
ms (its transposed convolutions on TOPI's zero-inserted input, 900 ms; its
depthwise layers on TVM's reduction rule, 430 ms) to 108 ms; the static
artifact takes 85 ms.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules.blocks import blocks, extent, iter_kinds, largest_divisor, name_of, producer, x_stride, \
    sole_block, vector_unit
from forge_core.schedules.conv2d import PREPACK, _tile_for_16_registers, tile_convolution
from forge_core.schedules.epilogue import (
    attach_epilogue, parallel_vectorized, schedule_padding, split_epilogue, vectorize_write_back,
)
from forge_core.schedules.plane_padding import read_padding, pad_by_planes
from forge_core.schedules.rewrite import substitute

ROW_PIXELS = 12
"""The tiles a dynamic row is scheduled for divide it: 1, 2, 3, 4, 6 or 12 pixels."""


class DynamicConv2dNCHW(dlight.ScheduleRule):
    """Conv2dNCHW's register tile along a dynamic row, the last tile of a row clamped to its end."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = dynamic_ungrouped_conv(func)
        if found is None:
            return None
        sch, conv = found
        stmt = sch.get(conv)
        channels_out = extent(sch, sch.get_loops(conv)[1])
        width = stmt.iter_vars[3].dom.extent
        unit = vector_unit(target)
        dtype = str(stmt.writes[0].source.dtype)
        vec = unit.vector_factor(channels_out, dtype)
        if unit.registers <= 16 and vec == unit.lanes(dtype):
            # One accumulator fewer than the static rule's tiles: over symbolic strides the tile's addresses
            # take registers of their own, and DBNet's 96->24 3x3 convolution at 160x160 as 3 vectors x 4
            # pixels (12 accumulators) ran 1.4-1.7x the static kernel's time for AVX2 (AMD EPYC Zen 4, 2
            # cores); as 3 x 3 (at most 11), 1.05-1.1x; 16->32 at 160x160 1.7-1.9 -> 1.3-1.6 ms.
            vec, tile_x = _tile_for_16_registers(channels_out, ROW_PIXELS, vec, unit.registers,
                                                 most=unit.registers - 5)
        else:
            tile_x = largest_divisor(ROW_PIXELS, max(1, unit.accumulators // max(1, vec // unit.lanes(dtype))))
        pad = producer(sch, conv, stmt.reads[0].source)
        x_outer = tile_convolution(sch, conv, vec, tile_x, unit, rows_only=True)
        if pad is not None:
            parallel_vectorized(sch, pad, unit.lanes(dtype))
        clamped = clamp_last_tile(sch.mod["main"], sch.get(x_outer), tile_x, width)
        if clamped is None:
            return None
        return s_tir.Schedule(clamped)


class DynamicExcitationConv2dNCHW(dlight.ScheduleRule):
    """A squeeze-and-excite block's 1x1 convolution on a 1x1 map, fused with the product that scales a map of a
    dynamic size (MobileNetV3's ``x * hard_sigmoid(conv(mean(x)))`` in a detector over any image size).

    The convolution is static but for the batch and the map it scales is not, so neither the per-batch-item
    loop nor a convolution rule took it: TVM's ``dlight.cpu.Reduction`` computed it, 0.065 ms for a 64->240
    convolution scaling 240 x 40 x 40 (AVX2, AMD EPYC Zen 4, 2 cores). Here the weights are repacked input
    channel-major at compile time, the convolution runs vectors of output channels over the input channels, its
    elementwise epilogue (bias, activation) stays per channel, and the scaled map runs its (image, channel)
    planes in parallel: 0.024 ms (the static kernel: 0.026 ms).
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = sole_block(func, "conv2d_nchw", "SSSSRRR", dynamic=True)
        if found is None:
            return None
        sch, conv = found
        stmt = sch.get(conv)
        loops = sch.get_loops(conv)
        n, f, y, x, rc, ry, rx = loops
        if any(extent(sch, loop) is None for loop in loops[1:]) \
                or any(extent(sch, loop) != 1 for loop in (y, x, ry, rx)):
            return None
        weight = stmt.reads[-1].source
        if not all(isinstance(d, tirx.IntImm) for d in weight.shape):
            return None
        all_blocks = blocks(sch)
        tail = all_blocks[-1]
        if sch.get(tail).same_as(stmt) \
                or any(set(iter_kinds(sch, b)) != {"S"} for b in all_blocks if not sch.get(b).same_as(stmt)) \
                or len(sch.get_loops(tail)) < 3 or all(extent(sch, loop) is not None for loop in sch.get_loops(tail)):
            return None  # no map of a dynamic size scaled: another rule's (a dynamic batch: the per-item loop's)
        pad = producer(sch, conv, stmt.reads[0].source)
        if pad is not None:
            sch.compute_inline(pad)
        weight_index = len(sch.get(conv).reads) - 1
        repack = sch.cache_read(conv, weight_index, "global")
        sch.transform_layout(conv, ("read", weight_index), lambda o, i, h, w: (i, h, w, o))
        sch.annotate(repack, PREPACK, True)
        lanes = vector_unit(target).lanes(str(stmt.writes[0].source.dtype))
        sch.reorder(n, y, x, rc, ry, rx, f)
        if extent(sch, f) % lanes == 0:
            sch.vectorize(sch.split(f, [None, lanes])[1])
        sch.decompose_reduction(conv, rc)
        tail_loops = sch.get_loops(tail)
        sch.parallel(sch.fuse(*tail_loops[:2]))
        return sch


def dynamic_ungrouped_conv(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, s_tir.SBlockRV] | None:
    """A schedule of ``func`` and its convolution block, when ``func`` has a symbolic extent and the convolution
    has groups=1, a constant weight and static channels and kernel, the other blocks spatial (padding,
    epilogue): the dynamic counterpart of :func:`~forge_core.schedules.conv2d.ungrouped_conv`."""
    found = sole_block(func, "conv2d_nchw", "SSSSRRR", dynamic=True)
    if found is None:
        return None
    sch, conv = found
    stmt = sch.get(conv)
    weight = stmt.reads[-1].source
    n, f, y, x, rc, ry, rx = sch.get_loops(conv)
    if any(extent(sch, loop) is None for loop in (f, rc, ry, rx)):
        return None
    if len(weight.shape) != 4 or not all(isinstance(d, tirx.IntImm) for d in weight.shape) \
            or [int(d) for d in weight.shape[:2]] != [extent(sch, f), extent(sch, rc)]:
        return None  # grouped, or a weight computed at run time
    if any(set(iter_kinds(sch, b)) != {"S"} for b in blocks(sch) if not sch.get(b).same_as(stmt)):
        return None
    return sch, conv


class DynamicGroupedConv2dNCHW(dlight.ScheduleRule):
    """GroupedConv2dNCHW's schedule over a dynamic height or width: parallel over (image, channel) planes, a
    tile of one vector of a row's outputs, its last tile of a row clamped to the row's end.

    One output row a tile (the static rule's tiles of 2 to 7 rows divide the height) and no de-interleaved
    stride-2 rows (they need an even width); the padded input is its own parallel stage.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        found = sole_block(func, ("group_conv2d", "depthwise"), "SSSSRRR", dynamic=True)
        if found is None:
            return None
        sch, conv = found
        stmt = sch.get(conv)
        n, c, y, x, rc, ry, rx = sch.get_loops(conv)
        if any(extent(sch, loop) is None for loop in (c, rc, ry, rx)):
            return None
        if any(set(iter_kinds(sch, b)) != {"S"} for b in blocks(sch) if not sch.get(b).same_as(stmt)):
            return None
        lanes = vector_unit(target).lanes(str(stmt.writes[0].source.dtype))
        return tile_planes_clamped(sch, conv, n, c, [y], x, [rc, ry, rx], lanes)


def tile_planes_clamped(sch: s_tir.Schedule, block: s_tir.SBlockRV, n: s_tir.LoopRV, c: s_tir.LoopRV,
                        rows: list[s_tir.LoopRV], x: s_tir.LoopRV, window: list[s_tir.LoopRV],
                        lanes: int) -> s_tir.Schedule | None:
    """A per-plane block (depthwise convolution, pooling) over a dynamic row: (image, channel) planes in
    parallel, a tile of one vector of a row's outputs with its epilogue, the last tile of a row clamped to the
    row's end. A 2D block reading one input plane a plane gets its padded input a plane at a time in the plane
    loop (:func:`~forge_core.schedules.plane_padding.pad_by_planes`, de-interleaved at stride 2); otherwise the
    padded input is its own parallel stage. None when the tile cannot be clamped."""
    width = sch.get(block).iter_vars[2 + len(rows)].dom.extent
    stride = x_stride(sch, block)
    pads = [b for b in blocks(sch) if name_of(sch, b).startswith("pad_temp")]
    # The window loops over input channels (a depthwise convolution's one) come before the spatial ones.
    by_planes = len(rows) == 1 and len(pads) == 1 and read_padding(sch.get(pads[0])) is not None \
        and all(extent(sch, loop) == 1 for loop in window[:len(window) - 2])
    epilogue = split_epilogue(sch, block)
    x_outer, x_inner = sch.split(x, [None, lanes])
    sch.reorder(n, c, *rows, x_outer, *window, x_inner)
    writer = attach_epilogue(sch, block, epilogue)
    sch.reverse_compute_at(writer, x_outer)
    vectorize_write_back(sch, writer)
    planes = sch.fuse(n, c)
    sch.parallel(planes)
    sch.vectorize(x_inner)
    sch.decompose_reduction(block, window[0])
    tile_loop = sch.get(x_outer)
    if by_planes:
        sch.compute_at(pads[0], planes)
        func = pad_by_planes(sch.mod["main"], stride)
        if func is None:
            return None
        tile_loop = next(loop for loop in _loops(func) if loop.loop_var.same_as(tile_loop.loop_var))
    else:
        schedule_padding(sch, lanes)
        func = sch.mod["main"]
    clamped = clamp_last_tile(func, tile_loop, lanes, width)
    return None if clamped is None else s_tir.Schedule(clamped)


def clamp_last_tile(func: tirx.PrimFunc, loop: tirx.For, tile: int, width: tirx.PrimExpr, *,
                    roll_guarded: bool = False) -> tirx.PrimFunc | None:
    """``func`` with the tile loop ``loop`` (``x0``) as ``if width >= tile`` a copy whose tiles start at
    ``min(x0 * tile, width - tile)`` with no guard, else ``loop`` as it is (with ``roll_guarded``, its unrolled
    loops serial); None when a block under ``loop`` has a guard that is not the row's."""
    x0 = loop.loop_var
    index_type = str(x0.ty)
    step = tirx.IntImm(index_type, tile)
    ok = True

    def realize(node: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        nonlocal ok
        predicate = node.predicate
        if not (isinstance(predicate, tirx.IntImm) and int(predicate) == 1) and not _holds(predicate, tirx.Var, x0):
            ok = False  # a guard of another split: keep it, and the schedule
        return node

    tvm_ffi.structural_map(loop.body, [(s_tir.SBlockRealize, realize)])
    if not ok:
        return None
    start = tirx.Var("x_start", index_type)
    # A copy of the loop with fresh definitions (its blocks' variables and buffers), on the function's own
    # parameters and root buffers: the k-th loop of a renewed copy of the function.
    copy_func = s_tir.renew_defs(func)
    own_loops, copied_loops = _loops(func), _loops(copy_func)
    copy_loop = copied_loops[next(i for i, own in enumerate(own_loops) if own.same_as(loop))]
    pairs = list(zip(copy_func.params, func.params))
    # Buffers only the tile loop uses (the tile's accumulators) get their own copy in the clamped loop. Shared
    # by both loops, their allocation would sit above the branch, sized by the dynamic row, and the
    # accumulators stay in memory: a store after every multiply-add (DBNet's 96->24 3x3 convolution took 2x
    # the static kernel's time).
    outside = tvm_ffi.structural_map(func.body.block.body, [(tirx.For, lambda node: tirx.Evaluate(0)
                                                             if node.same_as(loop) else node)])
    own_copies = []
    for copied, own in zip(copy_func.body.block.alloc_buffers, func.body.block.alloc_buffers):
        if _holds(loop.body, tvm.ir.expr.Var, own) and not _holds(outside, tvm.ir.expr.Var, own):
            fresh_buffer = tirx.decl_buffer(list(own.ty.shape), str(own.ty.dtype), str(own.name),
                                            scope=str(own.ty.storage_scope))
            own_copies.append(fresh_buffer)
            pairs.append((copied, fresh_buffer))
        else:
            pairs.append((copied, own))
    for own, copied in zip(own_loops, copied_loops):  # the loops around the tile loop (the parallel rows)
        if not own.same_as(loop) and _holds(own.body, tirx.For, loop):
            pairs.append((copied.loop_var, own.loop_var))
    for copied, own in zip(copy_func.params, func.params):  # the dims, if renewed with their buffers
        for a, b in zip(getattr(copied.ty, "shape", None) or (), getattr(own.ty, "shape", None) or ()):
            if isinstance(a, tirx.Var) and isinstance(b, tirx.Var) and not a.same_as(b):
                pairs.append((a, b))
    copy_body = substitute(copy_loop.body, pairs)
    copy_x0 = copy_loop.loop_var
    fresh = tirx.Var(str(x0.name), index_type)

    def tile_start(mul: tirx.Mul) -> object:
        # x0 * tile, or x0 * (tile * m) where a stride m folded into it: start * m
        if isinstance(mul.a, tirx.Var) and mul.a.same_as(copy_x0) and isinstance(mul.b, tirx.IntImm) \
                and int(mul.b) % tile == 0:
            m = int(mul.b) // tile
            return start if m == 1 else start * tirx.IntImm(index_type, m)
        return mul

    def unguarded(node: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        return s_tir.SBlockRealize(list(node.iter_values), tirx.const(True, "bool"), node.block)

    body = tvm_ffi.structural_map(copy_body, [(tirx.Mul, tile_start)])
    # The guards go (each is the tile's: checked above); a guard may name the tile variable alone (a write-back
    # past the loop's last tile: ``x0 < ceil(width / tile)``), which the loop's extent already ensures.
    body = tvm_ffi.structural_map(body, [(s_tir.SBlockRealize, unguarded)])
    if _holds(body, tirx.Var, copy_x0):
        return None  # the tile variable used otherwise than as the tile's start
    clamped_start = tirx.Min(fresh * step, width - step)
    clamped = tirx.For(fresh, loop.min, loop.extent, loop.kind,
                       tirx.SeqStmt([tirx.LetStmt(start, clamped_start), body]), annotations=loop.annotations)
    choice = tirx.IfThenElse(width >= step, clamped, _rolled(loop) if roll_guarded else loop)

    def swap(node: tirx.For) -> tirx.Stmt:
        return choice if node.same_as(loop) else node

    swapped = tvm_ffi.structural_map(func, [(tirx.For, swap)])
    if not own_copies:
        return swapped
    root = swapped.body.block
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body, root.init,
                        alloc_buffers=[*root.alloc_buffers, *own_copies], annotations=root.annotations)
    return swapped.with_body(s_tir.SBlockRealize([], True, root))


def _rolled(loop: tirx.For) -> tirx.For:
    """``loop`` with its unrolled loops serial: a guarded form that runs only on tiny maps.

    Unrolled, every multiply-add of the tile carries its guard: LLVM took 3-4x as long to build a pointwise
    kernel (its clamped form and this one) for a loop that runs on maps of fewer pixels than a tile. Where the
    guarded loop runs on real sizes (a convolution's rows narrower than its tile), it stays unrolled."""
    def serial(node: tirx.For) -> tirx.For:
        if node.kind != tirx.ForKind.UNROLLED:
            return node
        return tirx.For(node.loop_var, node.min, node.extent, tirx.ForKind.SERIAL, node.body,
                        annotations=node.annotations)

    return tvm_ffi.structural_map(loop, [(tirx.For, serial)])


def _holds(tree: object, kind: type, node: object) -> bool:
    """Whether ``tree`` holds ``node``, a node of type ``kind`` (a variable, a loop); the walk stops at it."""
    def stop(found: object) -> tvm_ffi.VisitInterrupt | None:
        return tvm_ffi.VisitInterrupt(found) if found.same_as(node) else None

    return tvm_ffi.structural_walk(tree, (kind, stop), order="pre") is not None


def _loops(func: tirx.PrimFunc) -> list[tirx.For]:
    """The function's loops, in the order ``structural_map`` visits them."""
    found: list[tirx.For] = []

    def visit(node: tirx.For) -> tirx.For:
        found.append(node)
        return node

    tvm_ffi.structural_map(func.body, [(tirx.For, visit)])
    return found
