"""Library files: which machine an ELF file is for, and loading one safely.

Loading trap: glibc's ``dlopen`` caches libraries by path. Loading a second,
different library from a path that was loaded before (a recompiled artifact
in the same directory) silently returns the first one. Forge therefore loads
every library from a fresh, uniquely named private copy, removed right after
``dlopen`` (the mapping keeps the file alive), so two runtimes of two
libraries, or of one path rewritten, live side by side in one process.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from pathlib import Path

import tvm

from forge_core.errors import ForgeError

# ELF e_machine values (the ELF specification)
_ELF_MACHINES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv"}
_HOST_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "armv7l": "arm", "i686": "x86"}


def elf_machine(data: bytes) -> str | None:
    """The architecture an ELF file was built for, or None when ``data`` is not ELF."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    byteorder = "little" if data[5] == 1 else "big"
    machine = int.from_bytes(data[18:20], byteorder)
    return _ELF_MACHINES.get(machine, f"elf-machine-{machine}")


def host_machine() -> str:
    machine = platform.machine().lower()
    return _HOST_ALIASES.get(machine, machine)


def load_library_bytes(data: bytes, name: str) -> tvm.runtime.Module:
    """Load a TVM library from its bytes, through a private, uniquely named file."""
    private_dir = tempfile.mkdtemp(prefix="forge-lib-")
    try:
        path = Path(private_dir) / "model_library.so"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        try:
            return tvm.runtime.load_module(str(path))
        except Exception as exc:  # noqa: BLE001 - TVM reports load failures as various errors
            raise ForgeError(f"Could not load {name}: {exc}") from exc
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)
