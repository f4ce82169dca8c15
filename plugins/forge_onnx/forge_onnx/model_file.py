"""Reading an ONNX model from what the user hands over, with clear errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from forge_core.errors import ModelImportError


def read_model(model: Any) -> onnx.ModelProto:
    """A ``ModelProto`` from a ModelProto, a path to a ``.onnx`` file, or its bytes."""
    if isinstance(model, onnx.ModelProto):
        proto, source = model, "the given ModelProto"
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX model file {str(path)!r} does not exist")
        source = repr(str(path))
        try:
            proto = onnx.load(str(path))
        except (DecodeError, ValueError, RuntimeError, OSError) as exc:
            raise ModelImportError(f"{source} is not a valid ONNX model: {exc}") from exc
    elif isinstance(model, (bytes, bytearray, memoryview)):
        source = "the given bytes"
        try:
            proto = onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise ModelImportError(f"{source} are not a valid ONNX model: {exc}") from exc
    else:
        raise TypeError(
            f"from_onnx expects an onnx.ModelProto, a path to a .onnx file or its bytes, not {type(model).__name__}"
        )
    _check_structure(proto, source)
    return proto


def _check_structure(proto: onnx.ModelProto, source: str) -> None:
    # Protobuf parses many non-ONNX byte strings into a near-empty message.
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelImportError(f"{source} is not a valid ONNX model: it has no graph")
    if proto.ir_version < 3:
        raise ModelImportError(
            f"{source} has ONNX IR version {proto.ir_version}; Forge needs IR version 3 (ONNX 1.1) or newer"
        )
    if not proto.graph.output:
        raise ModelImportError(f"{source} is not a valid ONNX model: its graph has no outputs")
