"""Forge's PyTorch frontend plugin: ``forge.from_torch``.

Importing this package does not import torch; :func:`load_torch` does.
"""

from typing import Any

__all__ = ["load_torch"]


def __getattr__(name: str) -> Any:
    if name == "load_torch":
        from forge_torch.loader import load_torch

        return load_torch
    raise AttributeError(f"module 'forge_torch' has no attribute {name!r}")
