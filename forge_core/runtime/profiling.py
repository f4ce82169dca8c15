"""Per-function timing of a compiled model: where inference time goes.

TVM 0.27's Relax VM has no profiler; Forge times every call instruction of
``main`` through the VM's instrumentation hook. Each call pays a few
microseconds of Python overhead, so use the shares, not the absolute sums,
for small functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forge_core.runtime.vm import VirtualMachine

_NO_OP = 0  # relax.VMInstrumentReturnKind.NO_OP


@dataclass(frozen=True)
class FunctionTime:
    """Time spent in one function of the compiled model, over the profiled runs."""

    name: str
    calls: int
    total_ms: float
    share: float
    rule: str | None = None
    """The schedule rule that scheduled the kernel, from the artifact's metadata (None: not recorded, or not a
    kernel, such as a VM builtin)."""
    fallback: bool = False
    """Whether the kernel fell back to the generic schedule or to none."""

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.calls if self.calls else 0.0


def profile_calls(vm: VirtualMachine, run: Callable[[], Any], repeat: int,
                  schedules: Mapping[str, Any] | None = None,
                  sync: Callable[[], Any] | None = None) -> list[FunctionTime]:
    """Run ``run`` ``repeat`` times with every VM call timed; slowest functions first.

    ``schedules`` is the artifact metadata's ``schedules`` entry: each row then names its kernel's rule.
    ``sync`` waits for the device (a GPU runs kernels after their launch returns): called before and after
    every call, so that each call's row holds its kernel's time, not its launch's.
    """
    rules = dict((schedules or {}).get("rules", {}))
    fallbacks = set((schedules or {}).get("fallbacks", ()))
    totals: dict[str, list[float]] = {}
    started: list[float] = []

    def instrument(func: Any, symbol: str, before_run: bool, ret_value: Any, *args: Any) -> int:
        if sync is not None:
            sync()
        if before_run:
            started.append(time.perf_counter())
        elif started:
            entry = totals.setdefault(str(symbol), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started.pop()
        return _NO_OP

    vm.set_instrument(instrument)
    try:
        for _ in range(repeat):
            run()
    finally:
        vm.set_instrument(lambda *args: _NO_OP)
    grand = sum(seconds for _, seconds in totals.values()) or 1.0
    rows = [FunctionTime(name, int(calls) // max(repeat, 1), seconds * 1000 / max(repeat, 1), seconds / grand,
                         rules.get(name), name in fallbacks)
            for name, (calls, seconds) in totals.items()]
    return sorted(rows, key=lambda row: -row.total_ms)


def fallback_share(rows: Sequence[FunctionTime]) -> float:
    """The share of the profiled time spent in kernels that fell back to the generic schedule or to none."""
    return sum(row.share for row in rows if row.fallback)


def format_profile(rows: Sequence[FunctionTime], limit: int = 25) -> str:
    """A text table of the slowest functions (per run), with each kernel's schedule rule and the fallback share."""
    width = max((len(r.name) for r in rows[:limit]), default=8)
    lines = [f"{'function':<{width}}  calls  ms/run   share  schedule"]
    lines += [f"{r.name:<{width}}  {r.calls:>5}  {r.total_ms:>6.3f}  {100 * r.share:>5.1f}%  "
              f"{(r.rule or '-') + (' (fallback)' if r.fallback else '')}" for r in rows[:limit]]
    if any(r.rule is not None for r in rows):
        lines.append(f"time in fallback kernels: {100 * fallback_share(rows):.1f}%")
    return "\n".join(lines)
