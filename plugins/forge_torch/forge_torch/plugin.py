"""The entry point Forge loads: registers the ``torch`` frontend (torch is imported on use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge_core.hookspecs import hookimpl


def _load(*args: Any, **kwargs: Any) -> Any:
    from forge_torch.loader import load_torch

    return load_torch(*args, **kwargs)


@hookimpl
def register_frontends(register: Callable[..., None]) -> None:
    register("torch", _load, description="torch.nn.Module, ExportedProgram or TorchScript; ONNX fallback")
