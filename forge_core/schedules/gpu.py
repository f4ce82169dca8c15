"""GPU schedules: TVM's dlight rules, each kernel taken by the first rule that schedules it without failing.

TVM's CUDA pipeline applies ``dlight.gpu`` rules in order (Matmul, GEMV,
Reduction, GeneralReduction, Fallback), and a rule that raises stops the whole
build. Some raise on kernels with symbolic extents (a convolution over a
dynamic height and width: "There are some consumers of the cache-write stage
that are not properly inlined") rather than declining them. Here a rule that
raises declines: the kernel goes to the next rule, at worst to ``Fallback``,
which binds every kernel to threads. The compile log says which rule failed on
which kernel.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import dlight

logger = logging.getLogger("forge.schedules")


class Declining(dlight.ScheduleRule):
    """``rule``, declining (None) where it raises."""

    def __init__(self, rule: dlight.ScheduleRule) -> None:
        self.rule = rule

    def apply(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> Any:
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as exc:  # noqa: BLE001 - dlight's rules fail with anything from ValueError to TVMError
            name = func.attrs["global_symbol"] if func.attrs is not None and "global_symbol" in func.attrs else "?"
            logger.info("GPU rule %s declined kernel %s, which it failed on: %s", type(self.rule).__name__, name,
                        str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
            return None


def gpu_rules() -> list[dlight.ScheduleRule]:
    """TVM's dlight GPU rules in TVM's order, each declining where it fails."""
    rules = [dlight.gpu.Matmul(), dlight.gpu.GEMV(), dlight.gpu.Reduction(), dlight.gpu.GeneralReduction(),
             dlight.gpu.Fallback()]
    return [Declining(rule) for rule in rules]


def gpu_legalize_passes() -> list[tvm.transform.Pass]:
    """TVM's GPU legalization and fusion, then its dlight rules, each declining where it fails."""
    return [
        tvm.relax.transform.LegalizeOps(),
        tvm.relax.transform.AnnotateTIROpPattern(),
        tvm.relax.transform.FoldConstant(),
        tvm.relax.transform.FuseOps(),
        tvm.relax.transform.FuseTIR(),
        dlight.ApplyDefaultSchedule(*gpu_rules()),
    ]
