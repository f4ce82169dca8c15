"""What this machine's CPU can run: the one source of truth for the tests.

The flags are the runtime's own reading (:func:`forge_core.runtime.cpu_features.host_features`:
``/proc/cpuinfo`` on x86, the kernel's HWCAP words on Arm), so the tests and the runtime's
refusal of a library this CPU cannot run agree on what the CPU has.

A test that *executes* code for an instruction set runs only where the CPU has it
(:func:`requires_isa`); a test that only compiles for one and reads the assembly runs
everywhere, so every class's code path stays covered on every machine.
"""

from __future__ import annotations

import pytest
import tvm

from forge_core.runtime.cpu_features import host_cpu_model, host_features
from forge_core.targets.isa import required_cpu_features
from forge_core.targets.parsing import resolve_target

FLAGS: frozenset[str] = host_features() or frozenset()
"""This CPU's flags as Linux names them (``avx2``, ``fma``, ``avx512f``, ``avx512bw``, ``avx512_vnni``,
``avx_vnni``, ``amx_tile``...)."""

MODEL = host_cpu_model()


def cpu_has(*flags: str) -> bool:
    """Whether this CPU has every one of ``flags``."""
    return all(flag in FLAGS for flag in flags)


def can_run(target: tvm.target.Target) -> bool:
    """Whether this CPU has every extension code compiled for ``target`` may use (as the runtime checks)."""
    required = required_cpu_features(target)
    return required is not None and cpu_has(*required["flags"])


def requires_isa(*flags: str, why: str = "") -> pytest.MarkDecorator:
    """Skip unless this CPU has ``flags``; the reason names the CPU and what it lacks."""
    missing = [flag for flag in flags if flag not in FLAGS]
    reason = f"this CPU ({MODEL}) has no {', '.join(missing)}" + (f" {why}" if why else "")
    return pytest.mark.skipif(bool(missing), reason=reason)


def cpu_has_vnni() -> bool:
    return cpu_has("avx512_vnni")


# The kernels run here: this CPU when it has AVX-512 VNNI (another CPU's name may let LLVM use instructions this one
# lacks: for znver4, AMD's SSE4A insertq in byte shuffles, an illegal instruction on Intel), else Zen 4 to build for.
VNNI = resolve_target({"kind": "llvm", "num-cores": 2}) if cpu_has_vnni() else \
    tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "znver4"})


needs_vnni = requires_isa("avx512_vnni", "avx512bw", why="to run the AVX-512 VNNI kernels on")
