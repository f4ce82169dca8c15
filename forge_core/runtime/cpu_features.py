"""The instruction-set extensions this CPU has, and those a library needs that it lacks.

A library compiled for ``-mcpu=znver5`` holds AVX-512 and VNNI instructions;
run on a CPU without them, the first kernel that executes one kills the
process with SIGILL, with no message. ``compile()`` therefore records in the
metadata (``cpu_features``) the extensions its target enables, in the names
Linux gives them, and :class:`~forge_core.runtime.engine.Runtime` compares them
with this CPU's before it loads anything.

The names are those of ``/proc/cpuinfo``: its ``flags`` line on x86, and on
Arm the ``Features`` line, read here from the auxiliary vector (``AT_HWCAP``,
``AT_HWCAP2``) the kernel gives every process, which ``qemu-aarch64`` also
fills for the CPU it emulates. Only extensions that a compiler may use on its
own are recorded and checked (vector widths, FMA, dot products, bit
manipulation, GFNI's byte shifts), not those reached only through explicit
intrinsics (AES, carry-less multiplication, ADX).

This module is part of the runtime side: it imports nothing of TVM.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Iterable

# LLVM's x86 feature names -> the flags Linux reports in /proc/cpuinfo.
X86_FLAGS = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a",
    "popcnt": "popcnt", "lzcnt": "abm", "bmi": "bmi1", "bmi2": "bmi2", "movbe": "movbe",
    "f16c": "f16c", "fma": "fma", "fma4": "fma4", "xop": "xop", "avx": "avx", "avx2": "avx2",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512cd": "avx512cd", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "avx512vp2intersect": "avx512_vp2intersect", "avxvnni": "avx_vnni", "gfni": "gfni",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}

# LLVM's AArch64 feature names -> the Features Linux reports, with their bit in AT_HWCAP (16) or AT_HWCAP2 (26).
AARCH64_FLAGS = {
    "fp-armv8": "fp", "neon": "asimd", "crc": "crc32", "lse": "atomics", "fullfp16": "asimdhp",
    "rdm": "asimdrdm", "dotprod": "asimddp", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm", "bf16": "bf16",
}
_HWCAP = {"fp": (16, 0), "asimd": (16, 1), "crc32": (16, 7), "atomics": (16, 8), "asimdhp": (16, 10),
          "asimdrdm": (16, 12), "asimddp": (16, 20), "sve": (16, 22), "sve2": (26, 1), "i8mm": (26, 13),
          "bf16": (26, 14)}

FLAGS_BY_ARCH = {"x86_64": X86_FLAGS, "aarch64": AARCH64_FLAGS}
"""For each architecture, the LLVM features that are recorded and checked, and their Linux names."""


_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "armv7l": "arm", "i686": "x86"}


def host_machine() -> str:
    """This machine's architecture as ELF names it: ``x86_64``, ``aarch64``, ``arm``, ``x86``..."""
    machine = platform.machine().lower()
    return _MACHINE_ALIASES.get(machine, machine)


def _cpuinfo_flags() -> frozenset[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def _hwcap_flags() -> frozenset[str] | None:
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    words = {16: getauxval(16), 26: getauxval(26)}
    return frozenset(name for name, (word, bit) in _HWCAP.items() if words[word] >> bit & 1)


@functools.lru_cache(maxsize=None)
def host_features() -> frozenset[str] | None:
    """This CPU's extensions in Linux's names (``avx2``, ``avx512_vnni``, ``asimddp``), or None if unknown.

    x86: ``/proc/cpuinfo``'s ``flags``. AArch64: the kernel's ``AT_HWCAP`` and
    ``AT_HWCAP2`` words. None on another architecture or operating system.
    """
    machine = host_machine()
    if machine == "x86_64":
        return _cpuinfo_flags()
    if machine == "aarch64":
        return _hwcap_flags()
    return None


def host_cpu_model() -> str:
    """This CPU's model name as ``/proc/cpuinfo`` gives it, else the machine's architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.machine()


def missing_features(required: Iterable[str]) -> list[str] | None:
    """The extensions of ``required`` this CPU lacks, in the order given; None when this CPU's are unknown."""
    have = host_features()
    if have is None:
        return None
    return [flag for flag in required if flag not in have]


# The extensions that decide which kernels a CPU gets, shown with every benchmark figure.
_DECISIVE = {"x86_64": ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile"),
             "aarch64": ("asimd", "asimddp", "i8mm", "sve", "sve2")}


def describe_host() -> str:
    """One line naming this CPU and which decisive extensions it has and lacks, for benchmark output.

    ``"CPU: AMD EPYC (x86_64): avx2 fma; without avx512f avx512bw avx512_vnni avx_vnni amx_tile"``
    """
    machine = host_machine()
    have = host_features() or frozenset()
    decisive = _DECISIVE.get(machine, ())
    present = " ".join(flag for flag in decisive if flag in have) or "none"
    absent = " ".join(flag for flag in decisive if flag not in have)
    return f"CPU: {host_cpu_model()} ({machine}): {present}" + (f"; without {absent}" if absent else "")
