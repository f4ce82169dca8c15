"""Forge's ONNX frontend plugin: ``forge.from_onnx``."""

from forge_onnx.loader import load_onnx

__all__ = ["load_onnx"]
