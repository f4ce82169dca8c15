"""Import TVM without dragging torch in, and TVM's runtime without TVM's Python package.

``tvm_ffi`` imports torch eagerly when it is installed (about a second, and
hundreds of MB), to speed up DLPack exchange with torch tensors, and so does
``import tvm``. Forge passes numpy arrays to TVM, so it hides torch from those
imports: :func:`prepare_imports` imports ``tvm_ffi`` so, and arranges that the
first ``import tvm`` of the process, wherever it happens, runs so too. A user
who imports torch later gets it as usual; Forge's torch plugin restores TVM's
torch interop when it loads torch itself (:func:`enable_torch_interop`).

The runtime does not import ``tvm`` at all: TVM's Python package costs about
0.23 s to import even with its runtime library alone (its object types register
on import), where a board needs only the library, which ``tvm_ffi`` drives.
:func:`load_tvm_runtime` loads ``libtvm_runtime.so`` from TVM's package
directory without importing the package.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


_runtime_loaded = False  # load_tvm_runtime has loaded libtvm_runtime.so


class _HideFrameworks(importlib.abc.MetaPathFinder):
    hidden = ("torch",)

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname.split(".", 1)[0] in self.hidden:
            raise ModuleNotFoundError(f"{fullname} is hidden while Forge imports TVM", name=fullname)
        return None


def _hidden(run: Any) -> Any:
    """``run()`` with torch hidden from imports, unless it is imported already."""
    if "torch" in sys.modules:
        return run()
    finder = _HideFrameworks()
    sys.meta_path.insert(0, finder)
    try:
        return run()
    finally:
        sys.meta_path.remove(finder)


class _HiddenLoader(importlib.abc.Loader):
    """TVM's own loader, its package executed with torch hidden (its submodules import inside it)."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        _hidden(lambda: self._loader.exec_module(module))


class _TvmImport(importlib.abc.MetaPathFinder):
    """Finds ``tvm`` once, through the other finders, and has it executed with torch hidden."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "tvm":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("tvm")
        if spec is not None and spec.loader is not None and "torch" not in sys.modules:
            spec.loader = _HiddenLoader(spec.loader)
        return spec


def prepare_imports() -> None:
    """Import ``tvm_ffi`` with torch hidden, and have the first ``import tvm`` hide it too (module note)."""
    from forge_core.threads import set_thread_environment

    set_thread_environment()  # TVM reads it once, when its thread pool starts
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    if "tvm_ffi" not in sys.modules:
        _hidden(lambda: importlib.import_module("tvm_ffi"))
    if "tvm" not in sys.modules and not any(isinstance(f, _TvmImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _TvmImport())


def import_tvm() -> ModuleType:
    """``import tvm``, keeping torch out of ``sys.modules`` unless it is already there."""
    prepare_imports()
    import tvm

    return tvm


def tvm_package_directory() -> Path:
    """TVM's package directory (its libraries are in ``lib/``), found without importing it."""
    if "tvm" in sys.modules:
        return Path(sys.modules["tvm"].__file__).parent
    spec = importlib.machinery.PathFinder.find_spec("tvm")  # sys.path alone: not _TvmImport, which runs once
    if spec is None or not spec.submodule_search_locations:
        from forge_core.errors import MissingDependencyError

        raise MissingDependencyError("Forge's runtime needs TVM's package (apache-tvm, its runtime library in "
                                     "tvm/lib), which is not installed. Install it with: pip install forge-core",
                                     name="tvm")
    return Path(list(spec.submodule_search_locations)[0])


def load_tvm_runtime() -> None:
    """Load TVM's runtime library (``libtvm_runtime.so``) for ``tvm_ffi``, unless ``import tvm`` did: where TVM's
    package loads it (``TVM_LIBRARY_PATH`` first, then its ``lib/``)."""
    global _runtime_loaded
    if "tvm" in sys.modules or _runtime_loaded:
        return
    from tvm_ffi.libinfo import load_lib_ctypes

    paths = [Path(os.environ["TVM_LIBRARY_PATH"])] if os.environ.get("TVM_LIBRARY_PATH") else []
    load_lib_ctypes("tvm", "tvm_runtime", "RTLD_GLOBAL", extra_lib_paths=[*paths, tvm_package_directory() / "lib"])
    _runtime_loaded = True


def enable_torch_interop() -> None:
    """Give tvm_ffi the torch module it skipped at import (call after importing torch)."""
    import torch
    import tvm_ffi._convert as convert

    if getattr(convert, "torch", None) is None:
        convert.torch = torch
