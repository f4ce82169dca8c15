"""Loading a model named on the command line."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from forge_core.errors import FileAccessError, ForgeError, PathNotFoundError

FRONTEND_BY_SUFFIX = {
    ".onnx": "onnx",
    ".pt": "torch",
    ".pth": "torch",
    ".tflite": "tflite",
    ".h5": "keras",
    ".keras": "keras",
    ".pb": "tensorflow",
}


def frontend_for(path: Path, explicit: str | None) -> str:
    if explicit:
        return explicit
    if path.is_dir() and (path / "saved_model.pb").exists():
        return "tensorflow"
    if path.is_dir():
        raise ForgeError(f"Model {str(path)!r} is a directory, not a model file ({', '.join(sorted(FRONTEND_BY_SUFFIX))}); "
                         "a directory is read as a TensorFlow SavedModel only when it holds saved_model.pb")
    frontend = FRONTEND_BY_SUFFIX.get(path.suffix.lower())
    if frontend is None:
        known = ", ".join(sorted(FRONTEND_BY_SUFFIX))
        raise ForgeError(f"Cannot tell the framework of {str(path)!r} from its suffix ({known}); pass --frontend")
    return frontend


def parse_shapes(entries: list[str] | None, flag: str = "--shape") -> dict[str, tuple[int, ...]] | None:
    """``["x=1,3,224,224", "mask=-1,128"]`` -> ``{"x": (1, 3, 224, 224), "mask": (-1, 128)}``."""
    if not entries:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for entry in entries:
        name, sep, dims = entry.rpartition("=")
        if not sep or not name or not dims:
            raise ForgeError(f"{flag} {entry!r} must look like NAME=D0,D1,... (e.g. input=1,3,224,224)")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise ForgeError(f"{flag} {entry!r}: dimensions must be integers (-1 for dynamic)") from None
    return shapes


def parse_buckets(entries: list[str] | None) -> list[dict[str, tuple[int, ...]]] | None:
    """``["x=1,3,224,224", "x=8,3,224,224 mask=8,128"]`` -> one ``shape_buckets`` entry per string."""
    if not entries:
        return None
    return [parse_shapes(entry.split(), "--shape-bucket") or {} for entry in entries]


def load_model(path_text: str, frontend: str | None, shapes: list[str] | None) -> Any:
    from forge_core.loaders import load

    path = Path(path_text)
    if not path.exists():
        raise PathNotFoundError(f"Model {path_text!r} does not exist")
    if not os.access(path, os.R_OK):
        raise FileAccessError(errno.EACCES, os.strerror(errno.EACCES), path_text, "read the model")
    name = frontend_for(path, frontend)
    kwargs: dict[str, Any] = {}
    parsed = parse_shapes(shapes)
    if parsed:
        kwargs["shape"] = parsed
    return load(name, path, **kwargs)
