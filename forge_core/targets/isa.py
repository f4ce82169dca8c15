"""Which instruction-set extensions an LLVM target enables, in the names the runtime checks.

LLVM derives a target's features from its ``-mtriple``, ``-mcpu`` and
``-mattr``: ``-mcpu=znver5`` enables AVX-512 and VNNI, ``-mattr=-avx512f``
takes AVX-512 away again with everything that depends on it. This module
asks LLVM for that set and keeps the extensions that
:mod:`forge_core.runtime.cpu_features` records and checks, so an artifact
says which CPUs can run it, and ``"llvm"`` alone compiles for the extensions
this CPU really has (a virtual machine may hide some of those its model
name implies).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.target import Target

from forge_core.runtime.cpu_features import FLAGS_BY_ARCH, host_machine


def target_arch(target: Target) -> str | None:
    """``"x86_64"`` or ``"aarch64"`` for an LLVM target of either, else None (another kind or architecture)."""
    if target.kind.name != "llvm":
        return None
    triple = str(target.attrs.get("mtriple") or "")
    arch = triple.split("-", 1)[0] if triple else host_machine()
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)
    return arch if arch in FLAGS_BY_ARCH else None


def llvm_features(target: Target) -> set[str]:
    """Every LLVM feature ``target`` enables (its CPU's, with ``-mattr`` applied)."""
    from tvm.target import codegen

    return {str(name) for name in codegen.llvm_get_cpu_features(target)}


def required_cpu_features(target: Target) -> dict[str, Any] | None:
    """The ``cpu_features`` metadata entry of a library built for ``target``: ``{"arch", "flags"}``.

    ``flags`` are the extensions, in Linux's ``/proc/cpuinfo`` names, that the
    code may use and a CPU must have to run it. None for a target that is not
    an x86-64 or AArch64 LLVM target.
    """
    arch = target_arch(target)
    if arch is None:
        return None
    enabled = llvm_features(target)
    names = FLAGS_BY_ARCH[arch]
    return {"arch": arch, "flags": sorted({names[feature] for feature in enabled if feature in names})}


def _host_cpu_features() -> dict[str, bool]:
    """LLVM's reading of this CPU's features (CPUID on x86), each name to whether the CPU has it."""
    return {str(k): bool(v) for k, v in tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")().items()}


def host_mattr(mcpu: str, mattr: list[str]) -> list[str]:
    """``mattr`` completed so that ``-mcpu=mcpu`` matches this CPU's real extensions.

    LLVM names the host CPU by its model; a hypervisor may hide extensions
    that model has (AVX-512 on a cloud instance), and a CPU newer than LLVM
    gets an older model's name. Each extension Forge checks that the model
    implies and this CPU lacks is turned off (``-avx512f``), each that this
    CPU has and the model lacks is turned on.
    """
    arch = host_machine()
    if arch not in FLAGS_BY_ARCH:
        return mattr
    host = _host_cpu_features()
    implied = llvm_features(Target({"kind": "llvm", "mcpu": mcpu}))
    given = {entry.lstrip("+-") for entry in mattr}
    extra = []
    for feature in FLAGS_BY_ARCH[arch]:
        if feature in given or feature not in host:
            continue
        if feature in implied and not host[feature]:
            extra.append(f"-{feature}")
        elif feature not in implied and host[feature]:
            extra.append(f"+{feature}")
    return list(mattr) + extra


def runnable_here(target: Target) -> Target:
    """``target``, or the closest target whose code this CPU runs, for running kernels on the host.

    A target of this CPU's architecture keeps its CPU and loses, through
    ``-mattr``, each extension this CPU lacks (``-mcpu=znver4`` on an AVX2
    machine: ``-mattr=-avx512f,...``), so the same schedule builds to code
    that runs here. Another architecture (or a kind other than LLVM) gets
    generic LLVM for this machine.
    """
    from forge_core.runtime.cpu_features import host_features

    arch, have = target_arch(target), host_features()
    if arch is None or arch != host_machine():
        return Target({"kind": "llvm"})
    if have is None:
        return target  # this CPU's extensions cannot be read: trust the target
    names = FLAGS_BY_ARCH[arch]
    lacking = [feature for feature in sorted(llvm_features(target)) if feature in names and names[feature] not in have]
    if not lacking:
        return target
    config = {key: value for key, value in target.export().items() if not key.startswith("feature.")}
    config.pop("host", None)
    config["mattr"] = [*(str(entry) for entry in config.get("mattr") or []), *(f"-{feature}" for feature in lacking)]
    return Target(config)
