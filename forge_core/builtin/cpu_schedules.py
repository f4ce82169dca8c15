"""Built-in plugin: Forge's default CPU schedules, as a pass of stage ``schedule``.

A target plugin registers its own ``schedule`` pass the same way; the
compiler runs the schedule passes by their ``order`` (this one's is 100, a
plugin's default 0: a plugin's pass sees the kernels first), and each pass
schedules only the functions no earlier pass took. Weight-repacking stages a
rule marks stay inside its function: the compiler folds them once all
schedule passes (and verification) have run.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm

from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext
from forge_core.schedules.apply import apply_rules, default_rules


def cpu_default_schedules(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Forge's CPU schedule rules on every PrimFunc they recognise (``llvm`` targets)."""
    if context.target is None or context.target.kind.name != "llvm":
        return mod
    return apply_rules(mod, context.target, default_rules())


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    register(
        "cpu_default_schedules",
        cpu_default_schedules,
        stage="schedule",
        order=100,
        targets=("llvm",),
        description="Default CPU schedules: conv2d, grouped conv2d, matmul, reductions, elementwise",
    )
