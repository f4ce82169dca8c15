"""Built-in plugin: Forge's default CPU schedules, as a pass of stage ``schedule``.

A target plugin registers its own ``schedule`` pass the same way; the
compiler runs external schedule passes before the built-in one, and each pass
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
    if context.target is None or context.target.kind.name != "llvm":
        return mod
    return apply_rules(mod, context.target, default_rules())


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    register(
        "cpu_default_schedules",
        cpu_default_schedules,
        stage="schedule",
        description="Default CPU schedules: conv2d, grouped conv2d, matmul, reductions, elementwise",
    )
