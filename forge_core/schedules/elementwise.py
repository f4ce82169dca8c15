"""Injective chains, and the generic rule for whatever no other rule takes."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight

from forge_core.schedules.blocks import blocks, extent, iter_kinds, vector_unit
from forge_core.schedules.epilogue import parallel_leading, parallel_vectorized


def _lanes(sch: s_tir.Schedule, target) -> int:
    last = blocks(sch)[-1]
    return vector_unit(target).lanes(str(sch.get(last).writes[0].source.dtype))


def _selects(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """Whether the block chooses between sources (concatenate, pad: ``if_then_else``).

    TVM 0.27's compute_inline of such a block into an index-remapping consumer
    (a reshape after a concatenate) was seen to produce wrong values, so these
    blocks stay stages of their own: they are copies, cheap to materialize.
    """
    return "if_then_else" in sch.get(block).body.script()


class Elementwise(dlight.ScheduleRule):
    """Every block spatial: inline all but the last, then parallel and vectorized."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = s_tir.Schedule(func)
        all_blocks = blocks(sch)
        if not all_blocks or any(set(iter_kinds(sch, b)) - {"S"} for b in all_blocks):
            return None
        for block in all_blocks[:-1]:
            if _selects(sch, block):
                continue  # see _selects
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 - a block that cannot be inlined stays a stage of its own
                pass
        lanes = _lanes(sch, target)
        for block in blocks(sch):
            parallel_vectorized(sch, block, lanes)
        return sch


class Generic(dlight.ScheduleRule):
    """The fallback: parallel over each block's leading spatial loops (up to three)."""

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:  # type: ignore[override]
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = s_tir.Schedule(func)
        if not blocks(sch):
            return None
        lanes = _lanes(sch, target)
        for block in blocks(sch):
            kinds = iter_kinds(sch, block)
            loops = sch.get_loops(block)
            leading = len(kinds) - len(kinds.lstrip("S"))
            if leading == 0 or len(loops) < leading:
                continue
            if leading == len(kinds):
                parallel_vectorized(sch, block, lanes)
                continue
            parallel_leading(sch, loops[:leading])
        return sch
