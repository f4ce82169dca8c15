"""Built-in plugin: the artifact writers ``compile()`` uses.

* ``library``: ``model_library.so``, linked for the target's machine and
  sealed with a checksum trailer (:func:`forge_core.runtime.library_file.seal`); with
  ``encrypt_password``, the encrypted library and its key file ``modelKey.bin``
  (:mod:`forge_core.security.encrypted_library`);
* ``ir-text``: ``model_relay.txt``, the final IR (TVM Relax script) that was built;
* ``metadata``: ``model_metadata.json``, the embedded metadata plus the
  library's SHA-256 (schema in :mod:`forge_core.runtime.metadata`); for an
  encrypted artifact, without the entries that stay encrypted
  (``schedules``, ``quantization``).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_core.compiler.artifact import Artifact
from forge_core.hookspecs import hookimpl
from forge_core.runtime import metadata as schema
from forge_core.runtime.library_file import seal


def _link(artifact: Artifact, path: Path, name: Path | None = None) -> None:
    """Link the library to ``path``, in a child process (:mod:`forge_core.compiler.isolation`): LLVM ends
    the process it runs in when a write fails (disk full); ``name`` is the path an error names."""
    from forge_core.compiler.isolation import run_forked

    options: dict[str, Any] = {}
    if artifact.toolchain.fcompile is not None:
        options["fcompile"] = artifact.toolchain.fcompile
    if artifact.toolchain.pack_imports is not None:  # a GPU's kernels, as machine code
        options["fpack_imports"] = artifact.toolchain.pack_imports

    def export() -> None:
        artifact.executable.export_library(str(path), **options)

    run_forked(export, name or path)


def write_library(artifact: Artifact, directory: Path) -> list[Path]:
    path = directory / schema.LIBRARY_FILE
    password = artifact.options.encrypt_password
    if password is None:
        _link(artifact, path)
        path.write_bytes(seal(path.read_bytes()))
        return [path]
    from forge_core.security.encrypted_library import KEY_FILE, encrypt_library

    # The linker writes a file; it goes to a private directory (0700) that is removed
    # at once, never into the artifact directory.
    with tempfile.TemporaryDirectory(prefix="forge-link-") as private:
        plain = Path(private) / schema.LIBRARY_FILE
        _link(artifact, plain, path)
        plaintext = seal(plain.read_bytes())  # the same checksum as a plain library, inside the encryption
    library, key = encrypt_library(plaintext, artifact.metadata, password)
    path.write_bytes(library)
    key_path = directory / KEY_FILE
    key_path.write_bytes(key)
    key_path.chmod(0o600)
    return [path, key_path]


def write_ir_text(artifact: Artifact, directory: Path) -> list[Path]:
    path = directory / schema.IR_TEXT_FILE
    path.write_text(artifact.ir.script(show_meta=False) + "\n")
    return [path]


def write_metadata(artifact: Artifact, directory: Path) -> list[Path]:
    library = directory / schema.LIBRARY_FILE
    document = dict(artifact.metadata)
    if artifact.options.encrypted:  # what names the model's layers stays inside the encrypted library
        from forge_core.security.encrypted_library import PRIVATE_METADATA

        document = {k: v for k, v in document.items() if k not in PRIVATE_METADATA}
    document["library"] = {"file": schema.LIBRARY_FILE, "sha256": hashlib.sha256(library.read_bytes()).hexdigest()}
    path = directory / schema.METADATA_FILE
    path.write_text(json.dumps(document, indent=2) + "\n")
    return [path]


@hookimpl
def register_exporters(register: Callable[..., None]) -> None:
    register("library", write_library, description=f"{schema.LIBRARY_FILE}: the compiled model")
    register("ir-text", write_ir_text, description=f"{schema.IR_TEXT_FILE}: the final IR as text")
    register("metadata", write_metadata, description=f"{schema.METADATA_FILE}: artifact metadata")
