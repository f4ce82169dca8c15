"""Forge's PyTorch frontend plugin: ``forge.from_torch``."""

from forge_torch.loader import load_torch

__all__ = ["load_torch"]
