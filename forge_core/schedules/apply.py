"""Applying schedule rules to a module, and reporting which rule took which function."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight

from forge_core.ir.constant_calls import fold_constant_calls
from forge_core.passes import replace_functions
from forge_core.schedules.batch_loop import batch_var, per_batch_item
from forge_core.schedules.blocks import blocks, is_static
from forge_core.schedules.conv2d import PREPACK, Conv2dNCHW
from forge_core.schedules.conv_nd import ConvNCX, GroupedConvNCX
from forge_core.schedules.conv_transpose import ConvTransposeNCHW
from forge_core.schedules.depthwise_flat import FlatDepthwiseNCHW
from forge_core.schedules.dynamic_conv import DynamicConv2dNCHW, DynamicExcitationConv2dNCHW, DynamicGroupedConv2dNCHW
from forge_core.schedules.elementwise import Elementwise, Generic
from forge_core.schedules.grouped_conv2d import GroupedConv2dNCHW
from forge_core.schedules.int8 import Int8Conv2dNCHW, Int8Matmul, Int8PointwiseConv2dNCHW
from forge_core.schedules.matmul import DynamicMatmul, Matmul
from forge_core.schedules.plane_reduction import DynamicPlaneReduction, PlaneReduction
from forge_core.schedules.pointwise_conv2d import (DynamicPointwiseConv2dNCHW, PaddedPointwiseConv2dNCHW,
                                                   PointwiseConv2dNCHW)
from forge_core.schedules.pool import DynamicWindowPoolNCX, WindowPoolNCX
from forge_core.schedules.reduction import DynamicRowReduction, ScalarReduction, WholeTensorReduction
from forge_core.schedules.row_blocks import per_row_block, row_prefix

logger = logging.getLogger("forge.schedule")

RULE_ATTR = "forge.schedule_rule"
SCHEDULED_ATTR = "tirx.is_scheduled"
FALLBACK_RULES = ("Generic",)


def default_rules() -> list[dlight.ScheduleRule]:
    """Forge's CPU rules, most specific first."""
    return [Int8PointwiseConv2dNCHW(), Int8Conv2dNCHW(), Int8Matmul(), PointwiseConv2dNCHW(),
            PaddedPointwiseConv2dNCHW(), Conv2dNCHW(),
            DynamicExcitationConv2dNCHW(), DynamicPointwiseConv2dNCHW(), DynamicConv2dNCHW(), FlatDepthwiseNCHW(), GroupedConv2dNCHW(),
            DynamicGroupedConv2dNCHW(), ConvTransposeNCHW(), ConvNCX(), GroupedConvNCX(), WindowPoolNCX(),
            DynamicWindowPoolNCX(), Matmul(),
            DynamicMatmul(), WholeTensorReduction(), PlaneReduction(), DynamicPlaneReduction(),
            ScalarReduction(), DynamicRowReduction(), dlight.cpu.Reduction(), Elementwise(), Generic()]


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and SCHEDULED_ATTR in func.attrs


def apply_rules(mod: tvm.IRModule, target: tvm.target.Target, rules: Sequence[dlight.ScheduleRule]) -> tvm.IRModule:
    """Schedule every PrimFunc not yet scheduled with the first rule that takes it.

    A rule that raises is skipped (logged at debug level) and the next one
    tried, so a rule's bug costs speed, never a failed compile.
    """
    updated = {}
    with target:
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            scheduled = None
            if not is_static(func):
                scheduled = _per_item_or_rows(func, target, rules, gv.name_hint)
            if scheduled is None:
                scheduled = _first_rule(func, target, rules, gv.name_hint)
            if scheduled is not None:
                updated[gv] = scheduled
    return replace_functions(mod, updated)


def _per_item_or_rows(func: tirx.PrimFunc, target: tvm.target.Target, rules: Sequence[dlight.ScheduleRule],
                      name_hint: str) -> tirx.PrimFunc | None:
    """A dynamic function as a static schedule in a loop: of one batch item where the batch is the only dynamic
    dim (batch_loop.py), else of a block of rows (row_blocks.py: a transformer's ``[batch, sequence, hidden]``);
    None when it has neither form.

    A batch item is one row of a classifier's ``[n, 1280] @ [1280, 1000]``: the loop runs a matrix-vector
    product per item, which at a batch of 1 (the latency users measure) reads the weights once, where a block
    would compute 16 rows for one."""
    def schedule(item: tirx.PrimFunc) -> tirx.PrimFunc | None:
        return _first_rule(item, target, rules, name_hint)

    try:
        if batch_var(func) is not None:
            return per_batch_item(func, schedule)
        if row_prefix(func) is not None:
            return per_row_block(func, schedule)
    except Exception as exc:  # noqa: BLE001 - see apply_rules: the symbolic path takes it
        logger.debug("per-item or row-block schedule failed on %s: %s", name_hint, exc)
    return None


def first_schedule(func: tirx.PrimFunc, target: tvm.target.Target, rules: Sequence[dlight.ScheduleRule],
                   name_hint: str = "") -> tuple[str, s_tir.Schedule] | None:
    """The first rule of ``rules`` that takes ``func`` (a rule that raises is skipped), by name, with its
    schedule; None if none does. Compile and tuning both choose a function's default schedule here."""
    for rule in rules:
        name = type(rule).__name__
        try:
            sch = rule.apply(func, target, False)
        except Exception as exc:  # noqa: BLE001 - see apply_rules
            logger.debug("rule %s failed on %s: %s", name, name_hint, exc)
            continue
        if sch is None:
            continue
        return name, sch[0] if isinstance(sch, list) else sch
    return None


def _first_rule(func: tirx.PrimFunc, target: tvm.target.Target, rules: Sequence[dlight.ScheduleRule],
                name_hint: str) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule that takes it, marked with the rule's name; None if none does."""
    chosen = first_schedule(func, target, rules, name_hint)
    if chosen is None:
        return None
    name, sch = chosen
    return sch.mod["main"].with_attr(SCHEDULED_ATTR, True).with_attr(RULE_ATTR, name)


def _has_prepack(func: tirx.PrimFunc) -> bool:
    """Whether a rule marked a weight-repacking block (always a top-level block) in ``func``."""
    if func.attrs is None or RULE_ATTR not in func.attrs:
        return False
    sch = s_tir.Schedule(func)
    return any(PREPACK in sch.get(block).annotations for block in blocks(sch))


def fold_repacked_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Run the weight-repacking stages the rules marked once, at compile time.

    TVM's SplitLayoutRewritePreproc fails on some opaque PrimFuncs (sorts), so
    it sees only the functions that carry a repacking stage. The repacking calls
    are evaluated together (:func:`fold_constant_calls`), not one LLVM build each.
    """
    marked = {gv for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and _has_prepack(f)}
    if not marked:
        return mod
    others = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and gv not in marked}
    subset = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in others}, attrs=mod.attrs)
    subset = relax.transform.SplitLayoutRewritePreproc()(subset)
    for gv, func in others.items():
        subset[gv] = func
    subset = relax.transform.FoldConstant()(fold_constant_calls(subset))
    return relax.transform.DeadCodeElimination()(subset)


def schedule_report(mod: tvm.IRModule) -> dict[str, list[str]]:
    """Function names by the rule that scheduled them; ``"unscheduled"`` for those no rule took."""
    report: dict[str, list[str]] = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        rule = str(func.attrs[RULE_ATTR]) if func.attrs is not None and RULE_ATTR in func.attrs else "unscheduled"
        report.setdefault(rule, []).append(gv.name_hint)
    return report


def log_fallbacks(report: dict[str, list[str]]) -> None:
    counts = Counter({rule: len(names) for rule, names in report.items()})
    logger.info("schedules: %s", ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items())))
    for rule in (*FALLBACK_RULES, "unscheduled"):
        if report.get(rule):
            logger.info(
                "%d function(s) fell back to %s: %s", len(report[rule]),
                "the generic parallel schedule" if rule != "unscheduled" else "no schedule (dynamic shapes, or opaque kernels such as sorts)",
                ", ".join(sorted(report[rule])),
            )
