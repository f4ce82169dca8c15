"""Checks of CUDA libraries without a GPU: what nvcc was given, and what the library's fatbin holds."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path


def cuda_compiles(monkeypatch) -> list[str]:
    """The CUDA source of each library linked while the returned list lives: nvcc's input, captured as
    ``compile()`` hands it to nvcc (the library holds the fatbin nvcc makes of it, not the source). The export
    runs in this process so that the capture sees it."""
    from forge_core.compiler import cuda_code
    from forge_core.compiler.isolation import FORK_ENV

    sources: list[str] = []
    real = cuda_code.compile_fatbin

    def capture(source: str, *args, **kwargs) -> bytes:
        sources.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setenv(FORK_ENV, "1")
    monkeypatch.setattr(cuda_code, "compile_fatbin", capture)
    return sources


def check_cuda_library(library_path: Path, arch: str, *, ptx: bool = True) -> list[str]:
    """The library holds its kernels as a fatbin (no CUDA source) that cuobjdump lists with machine code for
    ``arch`` and, with ``ptx``, PTX for the same arch; returns the kernels' names as cuobjdump's ELF lists them."""
    from forge_core.compiler.cuda_code import cuda_modules, library_blob

    library = library_path.read_bytes()
    assert b'extern "C" __global__' not in library, "the library holds CUDA source"
    modules = cuda_modules(library_blob(library))
    assert modules and all(fmt == "fatbin" for fmt, _ in modules), [fmt for fmt, _ in modules]
    names = []
    for index, (_, fatbin) in enumerate(modules):
        path = library_path.parent / f"kernels{index}.fatbin"
        path.write_bytes(fatbin)
        listed = subprocess.run([cuobjdump(), "--list-elf", "--list-ptx", str(path)], capture_output=True,
                                text=True, check=True).stdout
        assert f".{arch}.cubin" in listed, listed
        assert (f".{arch}.ptx" in listed) == ptx, listed
        symbols = subprocess.run([cuobjdump(), "-symbols", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        names += re.findall(r"STT_FUNC\s+STB_GLOBAL\s+STO_ENTRY\s+(\S+)", symbols)
    return names


def cuobjdump() -> str:
    """NVIDIA's cuobjdump, from the nvidia-cuda-cuobjdump wheel (the test extra) or the CUDA toolkit."""
    for root in getattr(__import__("nvidia"), "__path__", []) if _has_nvidia() else []:
        found = Path(root) / "cu13" / "bin" / "cuobjdump"
        if found.is_file():
            return str(found)
    found = shutil.which("cuobjdump")
    assert found, "cuobjdump is missing: ./scripts/setup installs the test extra (nvidia-cuda-cuobjdump)"
    return found


def _has_nvidia() -> bool:
    return importlib.util.find_spec("nvidia") is not None
