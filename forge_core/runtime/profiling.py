"""Per-function timing of a compiled model: where inference time goes.

TVM 0.27's Relax VM has no profiler; Forge times every call instruction of
``main`` through the VM's instrumentation hook. Each call pays a few
microseconds of Python overhead, so use the shares, not the absolute sums,
for small functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tvm import relax

_NO_OP = 0  # relax.VMInstrumentReturnKind.NO_OP


@dataclass(frozen=True)
class FunctionTime:
    """Time spent in one function of the compiled model, over the profiled runs."""

    name: str
    calls: int
    total_ms: float
    share: float

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.calls if self.calls else 0.0


def profile_calls(vm: relax.VirtualMachine, run: Callable[[], Any], repeat: int) -> list[FunctionTime]:
    """Run ``run`` ``repeat`` times with every VM call timed; slowest functions first."""
    totals: dict[str, list[float]] = {}
    started: list[float] = []

    def instrument(func: Any, symbol: str, before_run: bool, ret_value: Any, *args: Any) -> int:
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
    rows = [FunctionTime(name, int(calls) // max(repeat, 1), seconds * 1000 / max(repeat, 1), seconds / grand)
            for name, (calls, seconds) in totals.items()]
    return sorted(rows, key=lambda row: -row.total_ms)


def format_profile(rows: Sequence[FunctionTime], limit: int = 25) -> str:
    """A text table of the slowest functions (per run)."""
    width = max((len(r.name) for r in rows[:limit]), default=8)
    lines = [f"{'function':<{width}}  calls  ms/run   share"]
    lines += [f"{r.name:<{width}}  {r.calls:>5}  {r.total_ms:>6.3f}  {100 * r.share:>5.1f}%" for r in rows[:limit]]
    return "\n".join(lines)
