"""CUDA machine code in the library: the kernels compiled with nvcc when the library is linked.

TVM's CUDA code generator keeps the kernels as CUDA C++ source, and TVM's runtime
compiles that source when the library loads, through a Python callback of TVM's
compiler library (``tvm_callback_cuda_compile``, NVRTC by default). A GPU
deployment then needed the 260 MB compiler library and NVRTC, and a load took
1.8 to 15.6 s.

Here the source is compiled while the library is linked, with nvcc, into a
fatbin that holds machine code (SASS) for the target's arch and, for an arch
without a suffix, its PTX, which the driver compiles on a newer GPU. The fatbin
takes the source's place in the library: TVM's runtime stores a CUDA module as
``[format][function table][code]`` and loads any format but ``cuda`` with the
driver's ``cuModuleLoadData``, so loading needs the driver and TVM's runtime
library alone.

nvcc is found through ``FORGE_NVCC`` (the compiler itself), ``CUDA_HOME`` or
``CUDA_PATH``, ``PATH``, ``/usr/local/cuda``, then the ``nvidia-cuda-nvcc``
wheel. Fatbins are cached by the SHA-256 of the source, the arch, the options
and nvcc's version, in ``$FORGE_CACHE_DIR/cuda`` (default
``~/.cache/forge/cuda``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

from forge_core.errors import CompilationError, MalformedDataError
from forge_core.files import cache_dir, write_file

logger = logging.getLogger("forge.compile")

NVCC_ENV = "FORGE_NVCC"
CACHE_ENV = "FORGE_CACHE_DIR"
DEFAULT_ARCH = "sm_75"
"""The arch of a CUDA target that names none, where no GPU is here to ask: the oldest that CUDA 13 builds for
(Turing); its PTX runs on every later GPU."""

_STANDARD_NVCC = Path("/usr/local/cuda/bin/nvcc")

LIBRARY_SYMBOL = "__tvm_ffi__library_bin"
"""The symbol under which TVM's runtime finds the serialized modules a library imports."""

FATBIN_MAGIC = b"\x50\xed\x55\xba"
_U64 = struct.Struct("<Q")


def _install_hint() -> str:
    return (f"install the CUDA toolkit, or `pip install nvidia-cuda-nvcc` (CUDA 13), or set {NVCC_ENV} to the "
            "path of nvcc")


def find_nvcc() -> Path:
    """The nvcc that compiles CUDA kernels, or a CompilationError naming where it was looked for."""
    explicit = os.environ.get(NVCC_ENV)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise CompilationError(f"{NVCC_ENV}={explicit!r} is not an executable nvcc")
        return Path(explicit)
    candidates: list[Path] = []
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append(Path(os.environ[variable]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(_STANDARD_NVCC)
    candidates.extend(_wheel_nvccs())
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise CompilationError(
        "Compiling for CUDA needs nvcc, which turns the kernels into the machine code the library carries; none "
        f"was found ({NVCC_ENV}, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda, the nvidia-cuda-nvcc wheel): "
        + _install_hint()
    )


def _wheel_nvccs() -> Iterator[Path]:
    try:
        import nvidia  # type: ignore[import-not-found]  # namespace package of NVIDIA's wheels
    except ImportError:
        return
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cuda_nvcc", "cu12"):
            yield Path(root) / sub / "bin" / "nvcc"


@dataclass(frozen=True)
class Nvcc:
    """An nvcc, its version, and the GPU codes it builds."""

    path: Path
    version: str
    codes: frozenset[str]

    @classmethod
    def find(cls) -> Nvcc:
        return _probe(find_nvcc())

    def check_arch(self, arch: str) -> None:
        # nvcc lists the plain archs; an arch-specific (sm_90a) or family (sm_100f) one builds where its base does
        if arch not in self.codes and arch.rstrip("af") not in self.codes:
            supported = sorted(self.codes, key=_arch_order)
            raise CompilationError(
                f"nvcc {self.version} ({self.path}) does not build for {arch}: it builds for {', '.join(supported)}. "
                f"Name one of them (-arch=sm_XX or a tag for your GPU), or point {NVCC_ENV} at an nvcc that "
                f"supports {arch} (CUDA 12 for sm_50 to sm_72)"
            )


def _arch_order(code: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", code)
    return (int(digits) if digits else 0, code)


@lru_cache(maxsize=8)
def _probe(path: Path) -> Nvcc:
    def ask(*args: str) -> str:
        try:
            done = subprocess.run([str(path), *args], capture_output=True, text=True, check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompilationError(f"nvcc at {path} did not run: {exc}. {_install_hint()}") from exc
        if done.returncode != 0:
            raise CompilationError(f"nvcc at {path} failed on {' '.join(args)}: {done.stderr.strip()[-500:]}")
        return done.stdout

    found = re.search(r"release [\d.]+, V([\d.]+)", ask("--version"))
    codes = frozenset(line.strip() for line in ask("--list-gpu-code").splitlines() if line.strip())
    return Nvcc(path, found.group(1) if found else "unknown", codes)


def default_arch() -> str:
    """The arch of this machine's first GPU, where TVM's runtime sees one, else :data:`DEFAULT_ARCH`."""
    try:
        device = tvm.cuda(0)
        if device.exist:
            major, minor = str(device.compute_version).split(".")
            return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no driver, no runtime: there is no GPU to ask
        pass
    return DEFAULT_ARCH


def _codes(arch: str) -> tuple[str, list[str]]:
    """The virtual arch of ``arch`` and what its fatbin holds: its machine code, and its PTX unless the arch is
    arch-specific (``sm_90a``), whose PTX no other GPU runs."""
    virtual = "compute_" + arch.removeprefix("sm_")
    return virtual, [arch] if arch[-1] in "af" else [arch, virtual]


def gencode(arch: str) -> list[str]:
    """nvcc's options for ``arch``'s fatbin (:func:`_codes`)."""
    virtual, codes = _codes(arch)
    return ["-gencode", f"arch={virtual},code={codes[0] if len(codes) == 1 else '[' + ','.join(codes) + ']'}"]


def code_entry(nvcc: Nvcc, arch: str) -> dict[str, Any]:
    """The metadata entry ``cuda``: what the library's fatbin holds and what built it."""
    return {"arch": arch, "code": "fatbin", "contents": _codes(arch)[1], "nvcc": nvcc.version}


def compile_fatbin(source: str, arch: str, nvcc: Nvcc, *, fast_math: bool = False) -> bytes:
    """``source`` as a fatbin for ``arch``, from the cache when the same source was compiled before."""
    options = ["--fatbin", "-O3", *gencode(arch)] + (["--use_fast_math"] if fast_math else [])
    key = hashlib.sha256("\0".join([nvcc.version, *options, source]).encode()).hexdigest()
    cached = cache_dir("cuda") / f"{key}.fatbin"
    if cached.is_file():
        data = cached.read_bytes()
        if data.startswith(FATBIN_MAGIC):
            return data
    with tempfile.TemporaryDirectory(prefix="forge-nvcc-") as work:
        (Path(work) / "kernels.cu").write_text(source)
        done = subprocess.run([str(nvcc.path), *options, "-o", "kernels.fatbin", "kernels.cu"], cwd=work,
                              capture_output=True, text=True, errors="replace", check=False)
        if done.returncode != 0:
            raise CompilationError(
                f"nvcc {nvcc.version} failed on the kernels TVM generated for {arch} "
                f"({' '.join(options)}): {done.stderr.strip()[-2000:]}"
            )
        data = (Path(work) / "kernels.fatbin").read_bytes()
    try:  # a cache write that fails costs the next build a compile, nothing more
        write_file(cached, data)
    except OSError as exc:
        logger.debug("the CUDA fatbin cache %s was not written: %s", cached, exc)
    return data


# --- the library's serialized modules ------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u64(self) -> int:
        if self.at + 8 > len(self.data):
            raise MalformedDataError(f"the serialized modules end at byte {len(self.data)}, inside a length")
        (value,) = _U64.unpack_from(self.data, self.at)
        self.at += 8
        return value

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise MalformedDataError(f"a field of {count} bytes at byte {self.at} runs past the end ({len(self.data)})")
        chunk = self.data[self.at:self.at + count]
        self.at += count
        return chunk

    def string(self) -> bytes:
        return self.take(self.u64())


def _packed(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


def _modules(blob: bytes) -> tuple[bytes, list[tuple[bytes, bytes | None]]]:
    """TVM's serialized module tree: ``[length][row pointers][child indices]`` then, per module, its kind and,
    but for the host library (``_lib``), its bytes. Returns the import tree's bytes and each module's
    ``(kind, bytes or None)``; a blob that does not parse to its last byte raises ValueError."""
    reader = _Reader(blob)
    total = reader.u64()
    if total != len(blob) - 8:
        raise MalformedDataError(f"the serialized modules say {total} bytes and are {len(blob) - 8}")
    start = reader.at
    rows = [reader.u64() for _ in range(reader.u64())]
    for _ in range(reader.u64()):
        reader.u64()
    tree = blob[start:reader.at]
    modules: list[tuple[bytes, bytes | None]] = []
    for _ in range(max(len(rows) - 1, 0)):
        kind = reader.string()
        modules.append((kind, None if kind == b"_lib" else reader.string()))
    if reader.at != len(blob):
        raise MalformedDataError(f"{len(blob) - reader.at} bytes follow the last serialized module")
    return tree, modules


def replace_cuda_sources(blob: bytes, compile_source: Callable[[str], bytes]) -> tuple[bytes, int]:
    """``blob`` (TVM's serialized module tree, :func:`_modules`) with every CUDA module's source replaced by its
    fatbin; a CUDA module's bytes are ``[format][function table][code]``, the code last. Returns the new blob
    and the number of CUDA modules compiled; a blob that does not parse raises ValueError."""
    tree, modules = _modules(blob)
    out = [tree]
    for kind, payload in modules:
        out.append(_packed(kind))
        if payload is not None:
            out.append(_packed(_compiled_payload(payload, compile_source) if kind == b"cuda" else payload))
    body = b"".join(out)
    return _U64.pack(len(body)) + body, sum(kind == b"cuda" for kind, _ in modules)


def _compiled_payload(payload: bytes, compile_source: Callable[[str], bytes]) -> bytes:
    reader = _Reader(payload)
    fmt = reader.string()
    if fmt != b"cuda":
        return payload  # machine code already
    table, source = _split_code(payload[reader.at:], lambda code: b"__global__" in code)
    return _packed(b"fatbin") + table + _packed(compile_source(source.decode("utf-8")))


def _split_code(rest: bytes, is_code: Callable[[bytes], bool]) -> tuple[bytes, bytes]:
    """(function table, code) of a CUDA module's bytes after its format. The code is the last field; its length
    prefix is the first 8 bytes that, read as a length, end exactly at the end (the table is kept as bytes)."""
    for at in range(len(rest) - 7):
        (length,) = _U64.unpack_from(rest, at)
        if at + 8 + length == len(rest) and is_code(rest[at + 8:]):
            return rest[:at], rest[at + 8:]
    raise MalformedDataError("a CUDA module's code was not found after its function table")


def cuda_modules(blob: bytes) -> list[tuple[str, bytes]]:
    """Each CUDA module of a serialized tree (:func:`_modules`): its format (``fatbin``, ``cuda``...) and code."""
    found = []
    for kind, payload in _modules(blob)[1]:
        if kind == b"cuda" and payload is not None:
            inner = _Reader(payload)
            fmt = inner.string().decode()
            check = (lambda code: code.startswith(FATBIN_MAGIC)) if fmt == "fatbin" else (lambda code: True)
            found.append((fmt, _split_code(payload[inner.at:], check)[1]))
    return found


def elf_symbol(library: bytes, name: str) -> bytes:
    """The bytes of data symbol ``name`` in a 64-bit little-endian ELF shared object (x86_64, aarch64)."""
    if library[:4] != b"\x7fELF" or library[4] != 2 or library[5] != 1:
        raise MalformedDataError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", library, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", library, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", library, shoff + i * shentsize) for i in range(shnum)]
    wanted = name.encode()
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type not in (2, 11) or not entsize:  # SHT_SYMTAB, SHT_DYNSYM
            continue
        strings = sections[link]
        for at in range(offset, offset + size, entsize):
            st_name, _st_info, _other, shndx, value, st_size = struct.unpack_from("<IBBHQQ", library, at)
            start = strings[4] + st_name
            if library[start:library.index(b"\0", start)] != wanted or shndx == 0 or shndx >= len(sections):
                continue
            home = sections[shndx]
            file_at = home[4] + value - home[3]
            return library[file_at:file_at + st_size]
    raise MalformedDataError(f"no symbol {name} in the library")


def library_blob(library: bytes) -> bytes:
    """The serialized module tree inside a linked library (an ELF shared object), found by its symbol."""
    return elf_symbol(library, LIBRARY_SYMBOL)


def packer(arch: str, nvcc: Nvcc, *, fast_math: bool = False) -> Callable[..., str]:
    """An ``fpack_imports`` for ``export_library``: the imported modules, CUDA source compiled to a fatbin,
    in an assembly file that the library's C toolchain assembles (``.incbin``: no C array to compile, however
    large the weights)."""

    def pack(module: Any, is_system_lib: bool, prefix: str, workspace: str) -> str:
        if is_system_lib or prefix:
            raise CompilationError("a CUDA library with machine code cannot be a system library (--system-lib)")
        array = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(module)
        blob = array.numpy().tobytes()
        try:
            blob, count = replace_cuda_sources(
                blob, lambda source: compile_fatbin(source, arch, nvcc, fast_math=fast_math))
        except ValueError as exc:
            raise CompilationError(
                f"Forge could not read the CUDA modules TVM {tvm.__version__} serialized ({exc}); the kernels "
                "were not compiled to machine code") from exc
        logger.info("CUDA kernels compiled by nvcc %s for %s (%d module%s)", nvcc.version, arch, count,
                    "" if count == 1 else "s")
        data_path = Path(workspace) / "devc.bin"
        data_path.write_bytes(blob)
        asm_path = Path(workspace) / "devc.S"
        quoted = str(data_path).replace("\\", "\\\\").replace('"', '\\"')
        asm_path.write_text(
            f'\t.section .rodata.{LIBRARY_SYMBOL},"a"\n'
            f"\t.globl {LIBRARY_SYMBOL}\n"
            f"\t.type {LIBRARY_SYMBOL}, %object\n"
            "\t.p2align 4\n"
            f"{LIBRARY_SYMBOL}:\n"
            f'\t.incbin "{quoted}"\n'
            f"\t.size {LIBRARY_SYMBOL}, {len(blob)}\n"
            '\t.section .note.GNU-stack,"",%progbits\n'
        )
        return str(asm_path)

    return pack
