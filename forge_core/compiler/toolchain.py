"""Which C toolchain links the library, for the host or for another machine.

* The host's own architecture: TVM's default (the system ``g++``).
* ``aarch64-linux-gnu`` (Raspberry Pi, Jetson, Arm servers): Debian's
  ``gcc-aarch64-linux-gnu``; likewise ``arm-linux-gnueabihf`` and
  ``riscv64-linux-gnu``.
* Android (``*-linux-android*``): the Android NDK's clang, found through
  ``TVM_NDK_CC`` (the compiler itself) or ``ANDROID_NDK_HOME`` /
  ``ANDROID_NDK_ROOT`` (the NDK directory), at API level
  ``FORGE_ANDROID_API`` (default 28).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tvm
from tvm.support import cc

from forge_core.errors import CompilationError
from forge_core.runtime.library_file import host_machine

ANDROID_API_ENV = "FORGE_ANDROID_API"
DEFAULT_ANDROID_API = 28

_GNU_CROSS = {
    "aarch64": ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    "arm": ("arm-linux-gnueabihf-gcc", "gcc-arm-linux-gnueabihf"),
    "riscv64": ("riscv64-linux-gnu-gcc", "gcc-riscv64-linux-gnu"),
    "x86_64": ("x86_64-linux-gnu-gcc", "gcc-x86-64-linux-gnu"),
}


@dataclass(frozen=True)
class Toolchain:
    """How to link the library: ``fcompile`` for ``export_library`` (None: TVM's default), and for a GPU
    target ``pack_imports`` (``export_library``'s ``fpack_imports``), which puts the kernels' machine code in
    the library, and ``device_code``, the metadata entry that says what that code is."""

    description: str
    fcompile: Callable[..., Any] | None
    machine: str
    pack_imports: Callable[..., str] | None = None
    device_code: dict[str, Any] | None = None


def _triple(target: tvm.target.Target) -> str:
    cpu_target = target if target.kind.name == "llvm" else (target.host or tvm.target.Target("llvm"))
    triple = cpu_target.attrs.get("mtriple")
    if triple:
        return str(triple)
    return str(tvm.get_global_func("tvm.codegen.llvm.GetDefaultTargetTriple")())


def _arch(triple: str) -> str:
    arch = triple.split("-", 1)[0]
    if arch in ("arm64", "aarch64"):
        return "aarch64"
    if arch.startswith(("armv7", "armv8", "arm")):
        return "arm"
    if arch in ("x86_64", "amd64"):
        return "x86_64"
    return arch


def _android_compiler(triple: str) -> Path:
    explicit = os.environ.get("TVM_NDK_CC")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise CompilationError(f"TVM_NDK_CC points to {explicit!r}, which does not exist")
        return path
    ndk = os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not ndk:
        raise CompilationError(
            f"Compiling for Android ({triple}) needs the Android NDK, and none is configured. Install the NDK "
            "(Android Studio's SDK Manager, or `sdkmanager 'ndk;27.2.12479018'`), then set ANDROID_NDK_HOME to "
            "its directory (or TVM_NDK_CC to its clang++)."
        )
    api = int(os.environ.get(ANDROID_API_ENV, DEFAULT_ANDROID_API))
    arch = triple.split("-", 1)[0]
    prefix = "armv7a-linux-androideabi" if arch.startswith("arm") and arch != "arm64" else f"{arch}-linux-android"
    compiler = Path(ndk) / "toolchains" / "llvm" / "prebuilt" / "linux-x86_64" / "bin" / f"{prefix}{api}-clang++"
    if not compiler.is_file():
        raise CompilationError(
            f"ANDROID_NDK_HOME={ndk!r} has no compiler {compiler.name} for API level {api}; check the NDK "
            f"install or set {ANDROID_API_ENV} to an API level it has"
        )
    return compiler


def toolchain_for(target: tvm.target.Target) -> Toolchain:
    """The toolchain that links a library for ``target``, or a CompilationError naming what to install.

    A CUDA target's kernels are compiled by nvcc (:mod:`forge_core.compiler.cuda_code`), found here, before
    any build.
    """
    cpu = _cpu_toolchain(target)
    if target.kind.name != "cuda":
        return cpu
    from forge_core.compiler import cuda_code

    nvcc = cuda_code.Nvcc.find()
    arch = str(target.attrs["arch"])
    nvcc.check_arch(arch)
    fast_math = bool(target.attrs.get("fast-math", False))
    return replace(cpu, description=f"{cpu.description}; nvcc {nvcc.version} for {arch}",
                   pack_imports=cuda_code.packer(arch, nvcc, fast_math=fast_math),
                   device_code=cuda_code.code_entry(nvcc, arch))


def _cpu_toolchain(target: tvm.target.Target) -> Toolchain:
    triple = _triple(target)
    arch = _arch(triple)
    if "android" in triple:
        compiler = _android_compiler(triple)
        return Toolchain(f"Android NDK {compiler.name}", cc.cross_compiler(str(compiler)), arch)
    if arch == host_machine():
        return Toolchain("host C compiler", None, arch)
    if arch not in _GNU_CROSS:
        raise CompilationError(f"Forge has no cross toolchain for {triple!r}; export for it is not supported")
    compiler, package = _GNU_CROSS[arch]
    found = shutil.which(compiler)
    if found is None:
        raise CompilationError(
            f"Cross-compiling for {triple} needs {compiler}, which is not installed: "
            f"apt-get install {package} (./scripts/setup installs the aarch64 one)"
        )
    return Toolchain(f"cross compiler {compiler}", cc.cross_compiler(found), arch)
