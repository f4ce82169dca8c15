"""Import TVM without dragging torch in.

``tvm_ffi`` imports torch eagerly when it is installed (about a second, and
hundreds of MB), to speed up DLPack exchange with torch tensors. Forge passes
numpy arrays to TVM, so it hides torch from that one import. A user who imports
torch later gets it as usual; Forge's torch plugin restores TVM's torch
interop when it loads torch itself (:func:`enable_torch_interop`).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from types import ModuleType


class _HideFrameworks(importlib.abc.MetaPathFinder):
    hidden = ("torch",)

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname.split(".", 1)[0] in self.hidden:
            raise ModuleNotFoundError(f"{fullname} is hidden while Forge imports TVM", name=fullname)
        return None


def import_tvm() -> ModuleType:
    """``import tvm``, keeping torch out of ``sys.modules`` unless it is already there."""
    from forge_core.threads import set_thread_environment

    set_thread_environment()  # TVM reads it once, when its thread pool starts
    if "tvm" in sys.modules:
        return sys.modules["tvm"]
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    if "torch" in sys.modules:
        import tvm

        return tvm
    finder = _HideFrameworks()
    sys.meta_path.insert(0, finder)
    try:
        import tvm
    finally:
        sys.meta_path.remove(finder)
    return tvm


def enable_torch_interop() -> None:
    """Give tvm_ffi the torch module it skipped at import (call after importing torch)."""
    import torch
    import tvm_ffi._convert as convert

    if getattr(convert, "torch", None) is None:
        convert.torch = torch
