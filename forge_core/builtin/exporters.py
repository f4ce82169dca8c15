"""Built-in plugin: the artifact writers ``compile()`` uses.

* ``library``: ``model_library.so``, linked for the target's machine;
* ``ir-text``: ``model_relay.txt``, the final IR (TVM Relax script) that was built;
* ``metadata``: ``model_metadata.json``, the embedded metadata plus the
  library's SHA-256 (schema in :mod:`forge_core.runtime.metadata`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from forge_core.compiler.artifact import Artifact
from forge_core.hookspecs import hookimpl
from forge_core.runtime import metadata as schema


def write_library(artifact: Artifact, directory: Path) -> list[Path]:
    path = directory / schema.LIBRARY_FILE
    fcompile = artifact.toolchain.fcompile
    if fcompile is None:
        artifact.executable.export_library(str(path))
    else:
        artifact.executable.export_library(str(path), fcompile=fcompile)
    return [path]


def write_ir_text(artifact: Artifact, directory: Path) -> list[Path]:
    path = directory / schema.IR_TEXT_FILE
    path.write_text(artifact.ir.script(show_meta=False) + "\n")
    return [path]


def write_metadata(artifact: Artifact, directory: Path) -> list[Path]:
    library = directory / schema.LIBRARY_FILE
    document = dict(artifact.metadata)
    document["library"] = {"file": schema.LIBRARY_FILE, "sha256": hashlib.sha256(library.read_bytes()).hexdigest()}
    path = directory / schema.METADATA_FILE
    path.write_text(json.dumps(document, indent=2) + "\n")
    return [path]


@hookimpl
def register_exporters(register: Callable[..., None]) -> None:
    register("library", write_library, description=f"{schema.LIBRARY_FILE}: the compiled model")
    register("ir-text", write_ir_text, description=f"{schema.IR_TEXT_FILE}: the final IR as text")
    register("metadata", write_metadata, description=f"{schema.METADATA_FILE}: artifact metadata")
