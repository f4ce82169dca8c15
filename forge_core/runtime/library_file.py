"""Library files: which machine an ELF file is for, and loading one safely.

Loading trap: glibc's ``dlopen`` caches libraries by path. Loading a second,
different library from a path that was loaded before (a recompiled artifact
in the same directory) silently returns the first one. Forge therefore loads
every library from a fresh, uniquely named private copy, removed right after
``dlopen`` (the mapping keeps the file alive), so two runtimes of two
libraries, or of one path rewritten, live side by side in one process.

Decrypted libraries never touch a disk: :func:`load_library_in_memory` writes
them to an anonymous memory file (``memfd_create``), sealed against writes,
and loads ``/proc/self/fd/N`` with TVM's shared-library loader
(``tvm.runtime.load_module`` cannot: it resolves the path and picks a loader
by extension). The same cache bites there: a closed descriptor's number is
reused, and ``dlopen`` of a reused ``/proc/self/fd/N`` returns the library
loaded earlier under that name (measured: the second model computed the
first one's numbers). So the caller keeps the descriptor open while the
library is in use, and every load is checked (the loaded library must be the
one just written); on a stale hit the number is held and the load retried
under a new one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import tvm_ffi

from forge_core.errors import ArtifactCorruptedError, ForgeError
from forge_core.runtime.cpu_features import host_machine  # noqa: F401 - imported from here too
from forge_core.tvm_import import load_tvm_runtime


# ELF e_machine values (the ELF specification)
_ELF_MACHINES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv"}


def elf_machine(data: bytes) -> str | None:
    """The architecture an ELF file was built for, or None when ``data`` is not ELF."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    byteorder = "little" if data[5] == 1 else "big"
    machine = int.from_bytes(data[18:20], byteorder)
    return _ELF_MACHINES.get(machine, f"elf-machine-{machine}")


CHECKSUM_MAGIC = b"FORGE-SHA256T-V1"
_TRAILER = len(CHECKSUM_MAGIC) + 32 + 8
_CHUNK = 8 << 20


def content_digest(content: bytes | memoryview) -> bytes:
    """The checksum of ``content``: SHA-256 over the SHA-256 digests of its 8 MiB chunks, in order.

    The chunks are hashed on every core (``hashlib`` releases the GIL), so a
    100 MB library is checked in a fraction of the time one SHA-256 pass takes.
    """
    view = memoryview(content)
    chunks = [view[start:start + _CHUNK] for start in range(0, len(view), _CHUNK)] or [view]
    workers = min(len(chunks), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(lambda chunk: hashlib.sha256(chunk).digest(), chunks))
    else:
        digests = [hashlib.sha256(chunk).digest() for chunk in chunks]
    return hashlib.sha256(b"".join(digests)).digest()


def seal(content: bytes) -> bytes:
    """``content`` with its checksum trailer: magic, :func:`content_digest`, its length (8 bytes, big-endian).

    ``compile()`` seals every library. The dynamic loader reads an ELF file
    through its program headers and ignores bytes after them, so the sealed
    file loads as it is.
    """
    return content + CHECKSUM_MAGIC + content_digest(content) + len(content).to_bytes(8, "big")


def verify(data: bytes, name: str) -> None:
    """Check ``data``'s checksum trailer before anything maps it.

    :class:`ArtifactCorruptedError` names what differs: a missing trailer (a
    truncated file), a length that does not match (truncated or extended),
    or content whose checksum is not the one recorded (a flipped or spliced
    byte).
    """
    if len(data) < _TRAILER or data[-_TRAILER:-40] != CHECKSUM_MAGIC:
        raise ArtifactCorruptedError(
            f"{name} carries no Forge checksum at its end: it is truncated (a partial download or copy), or "
            "was compiled by a Forge older than its checksums. Copy it again from the compile output, or "
            "recompile it."
        )
    recorded, length = data[-40:-8], int.from_bytes(data[-8:], "big")
    content_size = len(data) - _TRAILER
    if length != content_size:
        raise ArtifactCorruptedError(
            f"{name} is {'truncated' if content_size < length else 'extended'}: its checksum covers {length} "
            f"bytes, the file holds {content_size} before it. Copy it again from the compile output."
        )
    found = content_digest(memoryview(data)[:content_size])
    if found != recorded:
        raise ArtifactCorruptedError(
            f"{name} was modified or corrupted: the checksum of its {length} bytes is {found.hex()}, "
            f"the one recorded is {recorded.hex()}. Copy it again from the compile output."
        )


def _load_shared_library(path: str) -> tvm_ffi.Module:
    """``dlopen`` a library as a TVM module that is unloaded when its last user goes.

    ``tvm.runtime.load_module`` adds every module it loads to TVM's process-wide
    list (``keep_module_alive``), so no library it loads is ever unmapped: a
    process that loads and drops runtimes grows by every library (measured:
    4 mappings and 26 KiB of a 36 KiB library, per load, for ever). The VM and every
    function taken from the module hold it, so unloading waits for them.
    """
    load_tvm_runtime()  # the model library calls into it
    return tvm_ffi.get_global_func("ffi.Module.load_from_file.so")(path, "so")


def load_library_bytes(data: bytes, name: str) -> tvm_ffi.Module:
    """Load a TVM library from its bytes, through a private, uniquely named file."""
    private_dir = tempfile.mkdtemp(prefix="forge-lib-")
    try:
        path = Path(private_dir) / "model_library.so"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        try:
            return _load_shared_library(str(path))
        except Exception as exc:  # noqa: BLE001 - TVM reports load failures as various errors
            raise ForgeError(f"Could not load {name}: {exc}") from exc
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_ATTEMPTS = 8


def _memory_file(data: bytes) -> int:
    fd = os.memfd_create("forge-model", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def load_library_in_memory(data: bytes, name: str,
                           is_this_library: Callable[[tvm_ffi.Module], bool]) -> tuple[tvm_ffi.Module, int]:
    """Load a TVM library from bytes held in memory only: ``(module, descriptor)``.

    Keep the descriptor open while the module is in use, and close it after.
    ``is_this_library(module)`` tells whether ``dlopen`` returned the library
    just written rather than one loaded earlier under the same descriptor path.
    """
    if not hasattr(os, "memfd_create"):
        raise ForgeError(f"Could not load {name}: encrypted libraries load from anonymous memory files "
                         "(memfd_create), which only Linux has")
    held: list[int] = []
    try:
        for _ in range(_ATTEMPTS):
            fd = _memory_file(data)
            try:
                module = _load_shared_library(f"/proc/self/fd/{fd}")
            except Exception as exc:  # noqa: BLE001 - TVM reports load failures as various errors
                os.close(fd)
                raise ForgeError(f"Could not load {name}: {exc}") from exc
            if is_this_library(module):
                return module, fd
            del module
            held.append(fd)  # keep the stale name's number taken while retrying
    finally:
        for fd in held:
            os.close(fd)
    raise ForgeError(f"Could not load {name}: {_ATTEMPTS} descriptor paths in a row named libraries loaded "
                     "earlier in this process")
