"""Reductions to a single value: feeding a spatial stage (softmax or layer norm over one row), or alone.

* :class:`WholeTensorReduction`: the reductions feed spatial stages over the row.
* :class:`ScalarReduction`: a tensor's min, max or sum to one value (ONNX's
  ``DynamicQuantizeLinear``, which onnxruntime's ``quantize_dynamic`` puts
  before every quantized matmul, takes a min and a max of each activation).
  The elements are split into vector-wide partial results (``rfactor``), one
  vector instruction each, then the lanes are reduced.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules.blocks import blocks, extent, is_static, iter_kinds, vector_unit
from forge_core.schedules.epilogue import parallel_vectorized


def _spatial_size(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> int:
    size = 1
    for iv in sch.get(block).iter_vars:
        if iv.iter_type == tirx.IterVar.DataPar:
            size *= int(iv.dom.extent)
    return size


class WholeTensorReduction(dlight.ScheduleRule):
    """Each stage in turn at the root: reductions serial, spatial stages vectorized.

    A classifier's softmax over ``[1, 1000]`` has one row. TVM's
    ``dlight.cpu.Reduction`` parallelizes such a function over the output
    elements and recomputes the row's max and sum inside that loop: quadratic
    work (0.87 ms for ResNet-50's final softmax, against about 5 us here).
    Functions with more than one row stay with ``dlight.cpu.Reduction``.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc) or not is_static(func):
            return None
        sch = s_tir.Schedule(func)
        all_blocks = blocks(sch)
        reductions = [b for b in all_blocks if "R" in iter_kinds(sch, b)]
        if not reductions or any(_spatial_size(sch, b) != 1 for b in reductions):
            return None
        spatial = [b for b in all_blocks if set(iter_kinds(sch, b)) == {"S"}]
        if not spatial or max(_spatial_size(sch, b) for b in spatial) == 1:
            return None  # a plain reduction to one value: dlight's
        lanes = vector_unit(target).lanes(str(sch.get(all_blocks[-1]).writes[0].source.dtype))
        for block in spatial:
            parallel_vectorized(sch, block, lanes)
        return sch


class ScalarReduction(dlight.ScheduleRule):
    """One reduction of a whole tensor to a single value, in vector-wide partial results.

    It comes after :class:`~forge_core.schedules.plane_reduction.PlaneReduction`
    (which takes a reduction that keeps its dims, ``[1, 1, 4096] -> [1, 1, 1]``).
    ``dlight.cpu.Reduction`` declines a reduction with no spatial axis, which
    then ran as one scalar loop on one core (measured: 0.07 ms for the max of a
    BERT-6 activation, 49,152 floats; onnxruntime's ``quantize_dynamic`` model
    takes a min and a max before each of its 36 quantized matmuls). Here the
    elements are flattened and split by ``lanes`` x 4; ``rfactor`` gives that
    many partial results, updated by whole vectors, and the last stage reduces
    them; scalar stages fused after it (a scale, a cast) stay as they are.
    Needs the element count divisible by the vector's lanes; a float sum then
    adds in another order (within rounding), a min or max is exact.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc) or not is_static(func):
            return None
        sch = s_tir.Schedule(func)
        block, *epilogue = blocks(sch)
        # One reduction of every axis; what follows (a fused scale, a cast) works on that one value.
        kinds = iter_kinds(sch, block)
        if "R" not in kinds or _spatial_size(sch, block) != 1 or any(
                "R" in iter_kinds(sch, b) or _spatial_size(sch, b) != 1 for b in epilogue):
            return None
        stmt = sch.get(block)
        all_loops = sch.get_loops(block)
        if len(stmt.writes) != 1 or len(stmt.reads) != 1 or len(all_loops) != len(kinds) \
                or kinds != "S" * kinds.count("S") + "R" * kinds.count("R"):
            return None
        loops = all_loops[kinds.count("S"):]  # the reduction's (the kept dims' unit loops stay outside)
        total = 1
        for loop in loops:
            total *= extent(sch, loop)
        lanes = vector_unit(target).lanes(str(stmt.reads[0].source.dtype))
        width = next((lanes * k for k in (4, 2, 1) if total % (lanes * k) == 0 and total >= 4 * lanes * k), None)
        if width is None:
            return None
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        _, partial = sch.split(fused, [None, width])
        factored = sch.rfactor(partial, 0)  # partial results along the split's inner loop
        sch.vectorize(sch.get_loops(factored)[-1])  # the partial results, one lane each
        return sch


class DynamicRowReduction(dlight.ScheduleRule):
    """Stages over rows of a dynamic length (a softmax over a dynamic sequence), computed row by row.

    The rows (every loop but the last of the last stage) are fused and run in
    parallel; each earlier stage (the row's max, its exponentials, their sum) is
    computed under that loop for its row, and every stage's loop along the row
    stays whole, for LLVM to vectorize at any length. ``dlight.cpu.Reduction``
    split the row into blocks of 16 guarded by the length, which left the
    guarded loops scalar: BERT-6's softmax at sequence 128 took 10.1 ms, against
    2.6 ms in the static model.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc) or is_static(func):
            return None
        sch = s_tir.Schedule(func)
        all_blocks = blocks(sch)
        reductions = [b for b in all_blocks[:-1] if "R" in iter_kinds(sch, b)]
        if len(all_blocks) < 2 or not reductions:
            return None
        for block in reductions:  # each along the dynamic row (a transposed convolution's channels: not this)
            reduced = [iv for iv in sch.get(block).iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
            if len(reduced) != 1 or isinstance(reduced[0].dom.extent, tirx.IntImm):
                return None
        last = all_blocks[-1]
        kinds = iter_kinds(sch, last)
        loops = sch.get_loops(last)
        if set(kinds) != {"S"} or len(loops) != len(kinds) or len(loops) < 2 or extent(sch, loops[-1]) is not None:
            return None
        row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        for block in reversed(all_blocks[:-1]):
            sch.compute_at(block, row, preserve_unit_loops=False)
        sch.parallel(row)
        return sch
