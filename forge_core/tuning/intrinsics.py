"""The tensor intrinsics MetaSchedule's CPU search and its records use, loaded quickly and made correct."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from typing import Any

from forge_core.schedules import dot_intrinsics

_INTRINSICS = "tvm.s_tir.tensor_intrin"


def _may_be_arm(target: Any) -> bool:
    """Whether ``target`` (None: not known) may be an Arm CPU, whose search and records use TVM's Arm intrinsics."""
    if target is None:
        return True
    triple = str(target.attrs.get("mtriple", "") or "")
    return target.kind.name != "llvm" or triple.startswith(("aarch64", "arm"))


@contextlib.contextmanager
def cpu_tensor_intrinsics(target: Any = None) -> Any:
    """TVM's CPU tensor intrinsics (x86, and Arm's for an Arm ``target`` or an unknown one) for the search,
    without the rest of ``tensor_intrin``.

    MetaSchedule's ``TuneContext`` imports the whole package, whose CUDA and
    ROCm halves parse some 250 TVMScript functions; each parse walks the call
    stack and every loaded module (``inspect.stack``), so in a process that
    has loaded torch and TensorFlow the import took most of a short session
    (measured: 59 s of a 73 s profile of 8 trials). Within this block the
    package is a stub that holds only the CPU submodules; afterwards a real
    import of the package (GPU work) runs as it would have, those two reused.
    The Arm half alone parses for 5 to 7 s; an x86 session does not load it.
    """
    if _INTRINSICS in sys.modules:
        importlib.import_module(f"{_INTRINSICS}.x86")
        dot_intrinsics.override_tvm_x86()
        yield
        return
    spec = importlib.util.find_spec(_INTRINSICS)
    stub = types.ModuleType(_INTRINSICS)
    stub.__path__ = list(spec.submodule_search_locations or [])
    stub.__spec__ = spec
    stub.__package__ = _INTRINSICS
    sys.modules[_INTRINSICS] = stub
    try:
        importlib.import_module(f"{_INTRINSICS}.x86")
        if _may_be_arm(target):
            importlib.import_module(f"{_INTRINSICS}.arm_cpu")
        dot_intrinsics.override_tvm_x86()  # exact, and LLVM 22 verifies them
        yield
    finally:
        if sys.modules.get(_INTRINSICS) is stub:
            del sys.modules[_INTRINSICS]
