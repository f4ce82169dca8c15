"""Forge's ONNX frontend plugin: ``forge.from_onnx``.

Importing this package does not import onnx; :func:`load_onnx` does.
"""

from typing import Any

__all__ = ["load_onnx"]


def __getattr__(name: str) -> Any:
    if name == "load_onnx":
        from forge_onnx.loader import load_onnx

        return load_onnx
    raise AttributeError(f"module 'forge_onnx' has no attribute {name!r}")
