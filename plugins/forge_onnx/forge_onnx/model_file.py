"""Reading an ONNX model from what the user hands over, with clear errors."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from forge_core.errors import InvalidModelError, OptionTypeError, PathNotFoundError


def describe_source(model: Any) -> str:
    """How errors name what the user handed over: the file's path, "the given ModelProto" or "the given bytes"."""
    if isinstance(model, (str, os.PathLike)):
        return repr(str(model))
    return "the given bytes" if isinstance(model, (bytes, bytearray, memoryview)) else "the given ModelProto"


def read_model(model: Any) -> onnx.ModelProto:
    """A ``ModelProto`` from a ModelProto, a path to a ``.onnx`` file, or its bytes."""
    source = describe_source(model)
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise PathNotFoundError(f"ONNX model file {str(path)!r} does not exist")
        try:
            proto = onnx.load(str(path))
        except (DecodeError, ValueError, RuntimeError, OSError, onnx.checker.ValidationError) as exc:
            # ValidationError: an initializer's external data is missing, too short or outside the model's folder.
            detail = " ".join(str(exc).split())
            tensor = re.search(r"tensor name: (.*?)\)", detail)
            where = f"initializer {tensor.group(1)!r}: " if tensor else ""
            raise InvalidModelError(f"{source} is not a valid ONNX model: {where}{detail}") from exc
    elif isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise InvalidModelError(f"{source} are not a valid ONNX model: {exc}") from exc
    else:
        raise OptionTypeError(
            f"from_onnx expects an onnx.ModelProto, a path to a .onnx file or its bytes, not {type(model).__name__}"
        )
    _check_structure(proto, source)
    _check_text(proto, "", source)
    return proto


def _repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; ``label`` before
    return bool(repeated) if repeated is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _check_text(message: Message, path: str, source: str) -> None:
    """Every string field (names, op types, domains...) is UTF-8, as protobuf requires.

    Python's protobuf parses a string field without decoding it and hands a
    corrupted one over as ``bytes``, which fails wherever it is used as text.
    Tensors' data fields are not touched (``raw_data`` may be large).
    """
    if isinstance(message, onnx.TensorProto):
        fields = [(f, getattr(message, f.name)) for f in message.DESCRIPTOR.fields
                  if f.type == FieldDescriptor.TYPE_STRING or f.name == "external_data"]
    else:
        fields = message.ListFields()
    for field, value in fields:
        where = f"{path}.{field.name}" if path else field.name
        items = list(value) if _repeated(field) else [value]
        if field.type == FieldDescriptor.TYPE_STRING:
            for index, item in enumerate(items):
                if isinstance(item, bytes):
                    at = f"{where}[{index}]" if _repeated(field) else where
                    raise InvalidModelError(f"{source} is not a valid ONNX model: its text field {at} is not "
                                            f"UTF-8: {item[:60]!r}")
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for index, item in enumerate(items):
                _check_text(item, f"{where}[{index}]" if _repeated(field) else where, source)


def _check_structure(proto: onnx.ModelProto, source: str) -> None:
    # Protobuf parses many non-ONNX byte strings into a near-empty message.
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise InvalidModelError(f"{source} is not a valid ONNX model: it has no graph")
    if proto.ir_version < 3:
        raise InvalidModelError(
            f"{source} has ONNX IR version {proto.ir_version}; Forge needs IR version 3 (ONNX 1.1) or newer"
        )
    if not proto.graph.output:
        raise InvalidModelError(f"{source} is not a valid ONNX model: its graph has no outputs")
