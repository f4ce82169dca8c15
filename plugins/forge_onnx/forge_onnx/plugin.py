"""The entry point Forge loads: registers the ``onnx`` frontend."""

from __future__ import annotations

from collections.abc import Callable

from forge_core.hookspecs import hookimpl


@hookimpl
def register_frontends(register: Callable[..., None]) -> None:
    from forge_onnx.loader import load_onnx

    register("onnx", load_onnx, description="ONNX ModelProto or .onnx file, via TVM's Relax ONNX importer")
