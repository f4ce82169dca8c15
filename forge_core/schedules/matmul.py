"""Dense, matmul and batch matmul: ``C[b.., i, j] += A[b.., i, k] * B[b.., k, j]``."""

from __future__ import annotations

from tvm import DataType, s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules.blocks import (blocks, extent, is_static, iter_kinds, largest_divisor, name_of,
                                         row_block, vector_unit, vectorize_by_registers)
from forge_core.schedules.conv2d import PREPACK
from forge_core.schedules.epilogue import attach_epilogue, split_epilogue, vectorize_write_back

MAX_ROWS = 8


def matmul_block(sch: s_tir.Schedule) -> s_tir.SBlockRV | None:
    """The function's one reduction when it is a matmul or dense block (``S...SSR``, two operands), else None."""
    reductions = [b for b in blocks(sch) if "R" in iter_kinds(sch, b)]
    if len(reductions) != 1:
        return None
    mm = reductions[0]
    kinds = iter_kinds(sch, mm)
    if not (kinds.endswith("SSR") and kinds.count("R") == 1 and set(kinds[:-1]) == {"S"}):
        return None
    if len(sch.get(mm).reads) != 2 or not any(word in name_of(sch, mm) for word in ("matmul", "dense")):
        return None
    return mm


class Matmul(dlight.ScheduleRule):
    """Register tile of ``mt`` rows x ``nt`` columns (whole vectors), k outside the tile.

    Few rows (a GEMV) get a wider column tile: one accumulator chain is bound
    by FMA latency. A two-dimensional right-hand side (a weight) is repacked to
    ``[N/nt, K, nt]`` at compile time.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc) or not is_static(func):
            return None
        sch = s_tir.Schedule(func)
        mm = matmul_block(sch)
        if mm is None:
            return None
        stmt = sch.get(mm)
        *batch, i, j, k = sch.get_loops(mm)
        rows, cols = extent(sch, i), extent(sch, j)
        unit = vector_unit(target)
        dtype = str(stmt.writes[0].source.dtype)
        vec = unit.vector_factor(cols, dtype)
        mt = largest_divisor(rows, MAX_ROWS)
        # Measured on AVX-512: 8x2 vectors for tall tiles; up to 5 vectors when there are few rows.
        vectors = 2 if mt >= 4 else min(5, unit.accumulators // mt)
        narrow = mt >= 4 and unit.accumulators < 16 and vec > 1
        if narrow:
            mt, vectors = _narrow_tile(rows, cols, vec, unit.registers)
        if vec > 1:
            fitting = [t for t in range(vec, vec * vectors + 1, vec) if cols % t == 0]
            nt = max(fitting) if fitting else vec
        else:
            nt = 1

        epilogue = split_epilogue(sch, mm)
        rhs = stmt.reads[1].source
        if len(rhs.shape) == 2 and nt > 1 and int(rhs.shape[1]) == cols:
            repack = sch.cache_read(mm, 1, "global")
            sch.transform_layout(mm, ("read", 1), lambda a, b: (b // nt, a, b % nt))
            sch.annotate(repack, PREPACK, True)
        i_outer, i_inner = sch.split(i, [None, mt])
        j_outer, j_inner = sch.split(j, [None, nt])
        # Row blocks, then weight panels, then the block's tiles (see row_block).
        block = row_block(rows, mt, extent(sch, k) * DataType(dtype).bits // 8)
        i_block, i_outer = sch.split(i_outer, [None, block // mt])
        sch.reorder(*batch, i_block, j_outer, i_outer, k, i_inner, j_inner)
        writer = attach_epilogue(sch, mm, epilogue)
        sch.reverse_compute_at(writer, i_outer)
        if vec > 1:
            vectorize_write_back(sch, writer)
        sch.parallel(sch.fuse(*batch, i_block, j_outer, i_outer))
        if unit.registers <= 16 and vec > 1:
            # A classifier's GEMV, 1x1280 by 1280x1000, a row of 5 vectors: 1.00 -> 0.75 ms.
            vectorize_by_registers(sch, j_inner, vec)
        elif vec > 1:
            sch.vectorize(j_inner)
        sch.unroll(i_inner)
        sch.decompose_reduction(mm, k)
        return sch


def _narrow_tile(rows: int, cols: int, vec: int, registers: int) -> tuple[int, int]:
    """Rows x vectors of a tall tile on a unit of 16 registers (AVX2): the most accumulators that leave
    a register for each vector of B and one for the broadcast A (4 x 3 or 6 x 2 vectors: 12 of 16; the
    AVX-512 tile of 8 x 2 would spill), fewest loads per multiply-add among equals."""
    tiles = [(m, v) for m in (8, 6, 4) if rows % m == 0 for v in (1, 2, 3)
             if v * (m + 1) + 1 <= registers and cols % (v * vec) == 0]
    if not tiles:
        return largest_divisor(rows, MAX_ROWS), 1
    return max(tiles, key=lambda t: (t[0] * t[1], -(t[0] + t[1])))


class DynamicMatmul(dlight.ScheduleRule):
    """A matmul over dynamic extents that no static block takes (attention over a dynamic sequence: ``Q @ K^T``,
    whose columns are the sequence, and ``P @ V``, whose reduction is): one output row a task, the reduction
    outside the row, the row's columns innermost (whole vectors where the columns are static; LLVM vectorizes a
    dynamic row; a static reduction is unrolled by 8, 4 or 2 inside each pass over a dynamic row), the epilogue
    computed after each row. The generic reduction rule computed one element at a
    time: BERT-6's attention at sequence 128 took 59 ms of the 109 ms.
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc) or is_static(func):
            return None
        sch = s_tir.Schedule(func)
        mm = matmul_block(sch)
        if mm is None:
            return None
        stmt = sch.get(mm)
        if any(set(iter_kinds(sch, b)) != {"S"} for b in blocks(sch) if not sch.get(b).same_as(stmt)):
            return None
        *batch, i, j, k = sch.get_loops(mm)
        epilogue = split_epilogue(sch, mm)
        cols, depth = extent(sch, j), extent(sch, k)
        unroll = next((u for u in (8, 4, 2) if depth and depth % u == 0), None) if not cols else None
        if unroll is not None:
            # Q @ K^T (a static reduction, dynamic columns): each pass over the row adds `unroll` products into
            # it, not one (the row is loaded and stored once per pass). BERT-6's at sequence 128: 0.77 -> 0.41 ms.
            k, k_inner = sch.split(k, [None, unroll])
            sch.reorder(*batch, i, k, j, k_inner)
            sch.unroll(k_inner)
        else:
            sch.reorder(*batch, i, k, j)
        row = sch.fuse(*batch, i) if batch else i
        vec = vector_unit(target).vector_factor(cols, str(stmt.writes[0].source.dtype)) if cols else 1
        if vec > 1:
            _, lanes = sch.split(j, [None, vec])
            sch.vectorize(lanes)
        if epilogue is not None:
            sch.reverse_compute_at(epilogue, row)
            inner = sch.get_loops(epilogue)[-1]
            if cols and vec > 1:
                _, lanes = sch.split(inner, [None, vec])
                sch.vectorize(lanes)
        sch.parallel(row)
        sch.decompose_reduction(mm, k)
        return sch
