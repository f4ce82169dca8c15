"""The artifact metadata: its schema, and reading it back out of a library file.

``compile()`` embeds a JSON document in ``model_library.so`` (a Relax function
``forge_metadata`` that returns it, stored verbatim in the library), so a
runtime can read the uuid, target and signature without any side file, even
for a library built for another machine. ``export_metadata=True`` writes the
same document plus the library's SHA-256 to ``model_metadata.json``.

Schema, version 1 (``schema_version``)::

    forge_artifact   "model_library" (marks the document; always the first key)
    schema_version   1
    uuid             the artifact's uuid (the user's, or a random uuid4)
    forge_version    Forge version that compiled it
    tvm_version      TVM version that compiled it
    fingerprint      IRModule.fingerprint (hex SHA-256 over structure and weights)
    structural_hash  hash(IRModule) as 16 hex digits
    target           {"string": docs-style target string, "config": TVM config dict}
    host             same shape as target, or null
    device_type      "cpu" or "cuda": where the library runs
    cpu_features     optional: {"arch": "x86_64" or "aarch64", "flags": [...]}, the instruction-set
                     extensions (Linux's /proc/cpuinfo names: "avx2", "avx512_vnni", "asimddp")
                     that the library's CPU code may use, from the target's -mcpu and -mattr;
                     the runtime refuses to load it on a CPU without them. null for a CPU
                     architecture Forge does not check (absent from artifacts compiled before)
    inputs           [{"name", "shape", "dtype", "layout"}], -1 for a dynamic dim,
                     layout "NCHW"/"NHWC" when the input feeds a convolution or
                     pooling directly, else null; with "dims" where a dim is dynamic:
                     the model's name for each one ("batch", "h"), an int where static.
                     Inputs that share a name take the same size
    outputs          [{"name", "shape", "dtype", "layout"}]
    precision        "float32", or "float16" with set_float16; "int8"/"uint8" (the
                     activation dtype) for a module quantized by quantize(); "quantized"
                     for a model that arrived quantized (ONNX QDQ, TFLite int8)
    channel_layout   "first", "last" or null (set_channel_layout)
    opt_level        0..4
    created          UTC creation time, ISO 8601
    encrypted        true when compile() had an encrypt_password: the library file is then
                     the encrypted form (forge_core.security.encrypted_library) and this
                     document sits, readable, in its header
    key_file         only when encrypted: the key file's name, "modelKey.bin"
    schedules        optional: {"rules": {kernel: schedule rule}, "fallbacks": [kernels]},
                     the rule that scheduled each kernel, and the kernels that
                     fell back to the generic schedule or to none (absent
                     from artifacts compiled before Forge recorded it)
    shape_buckets    optional, present when compile(shape_buckets=...) specialized the model:
                     [{"function": "main_bucket0", "inputs": {input name: shape}}], a function of
                     the library per bucket, compiled for those exact shapes; the runtime calls
                     the bucket whose shapes the inputs have, and "main" for any other size
    cuda             only for a CUDA target: {"arch": "sm_90", "code": "fatbin", "contents": ["sm_90",
                     "compute_90"], "nvcc": "13.0.88"}, what the library's kernels are (machine
                     code for the arch, and its PTX unless the arch is arch-specific) and
                     the nvcc that built them (absent from artifacts that held CUDA source)
    quantization     optional, present when quantize() made the module: its settings
                     (activation_dtype, kernel_dtype, bias_dtype, per_channel, calib_method,
                     quant_type, excluded) and "layers": {output node: {"kind", "node",
                     "inputs": {tensor: {"scale", "zero_point", "dtype", "axis"} or "dynamic"},
                     "weight": {...}, "bias": {...}}}
    initial_state    optional, for a stateful model (TFLite resource variables as explicit state):
                     {state input name: {"dtype", "shape", "data": base64 of the C-order bytes}}, the
                     values the state inputs start from; each input's next value is the output
                     "<name>_next" (Runtime.initial_state)
    library          only in model_metadata.json: {"file": "model_library.so", "sha256": ...}
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
ARTIFACT_MARK = "model_library"
LIBRARY_FILE = "model_library.so"
METADATA_FILE = "model_metadata.json"
IR_TEXT_FILE = "model_relay.txt"
METADATA_FUNCTION = "forge_metadata"

REQUIRED_KEYS = (
    "forge_artifact",
    "schema_version",
    "uuid",
    "forge_version",
    "tvm_version",
    "fingerprint",
    "structural_hash",
    "target",
    "host",
    "device_type",
    "inputs",
    "outputs",
    "precision",
    "channel_layout",
    "opt_level",
    "created",
    "encrypted",
)

_TARGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["string", "config"],
    "properties": {"string": {"type": "string"}, "config": {"type": "object", "required": ["kind"]}},
}
_TENSOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "shape", "dtype", "layout"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": ["array", "null"], "items": {"type": "integer", "minimum": -1}},
        "dtype": {"type": "string"},
        "layout": {"type": ["string", "null"]},
        "dims": {"type": "array", "items": {"type": ["integer", "string"]}},
    },
}
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Forge artifact metadata",
    "type": "object",
    "required": list(REQUIRED_KEYS),
    "properties": {
        "forge_artifact": {"const": ARTIFACT_MARK},
        "schema_version": {"const": SCHEMA_VERSION},
        "uuid": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        "forge_version": {"type": "string"},
        "tvm_version": {"type": "string"},
        "fingerprint": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "structural_hash": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "target": _TARGET_SCHEMA,
        "host": {"oneOf": [{"type": "null"}, _TARGET_SCHEMA]},
        "device_type": {"enum": ["cpu", "cuda"]},
        "cpu_features": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["arch", "flags"],
            "properties": {"arch": {"type": "string"}, "flags": {"type": "array", "items": {"type": "string"}}}}]},
        "inputs": {"type": "array", "items": _TENSOR_SCHEMA},
        "outputs": {"type": "array", "items": _TENSOR_SCHEMA},
        "precision": {"enum": ["float32", "float16", "int8", "uint8", "quantized"]},
        "channel_layout": {"enum": ["first", "last", None]},
        "opt_level": {"type": "integer", "minimum": 0, "maximum": 4},
        "created": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z$"},
        "encrypted": {"type": "boolean"},
        "key_file": {"type": "string"},
        "schedules": {
            "type": "object",
            "required": ["rules", "fallbacks"],
            "properties": {"rules": {"type": "object", "additionalProperties": {"type": "string"}},
                           "fallbacks": {"type": "array", "items": {"type": "string"}}},
        },
        "shape_buckets": {
            "type": "array",
            "items": {"type": "object", "required": ["function", "inputs"],
                      "properties": {"function": {"type": "string"},
                                     "inputs": {"type": "object", "additionalProperties": {
                                         "type": "array", "items": {"type": "integer", "minimum": 0}}}}},
        },
        "cuda": {
            "type": "object",
            "required": ["arch", "code", "contents", "nvcc"],
            "properties": {"arch": {"type": "string"}, "code": {"enum": ["fatbin"]},
                           "contents": {"type": "array", "items": {"type": "string"}}, "nvcc": {"type": "string"}},
        },
        "quantization": {
            "type": "object",
            "required": ["activation_dtype", "kernel_dtype", "bias_dtype", "per_channel", "calib_method",
                         "quant_type", "layers"],
            "properties": {"quant_type": {"enum": ["static", "dynamic"]}, "layers": {"type": "object"}},
        },
        "initial_state": {
            "type": "object",
            "additionalProperties": {
                "type": "object", "required": ["dtype", "shape", "data"],
                "properties": {"dtype": {"type": "string"},
                               "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                               "data": {"type": "string"}}}},
        "library": {
            "type": "object",
            "required": ["file", "sha256"],
            "properties": {"file": {"type": "string"}, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
        },
    },
}
"""The schema as JSON Schema (draft 2020-12), for validating ``model_metadata.json``."""

_ANCHOR = b'{"forge_artifact": "' + ARTIFACT_MARK.encode() + b'"'


def encode_arrays(values: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Arrays as the ``initial_state`` entry holds them: dtype, shape and base64 of their bytes."""
    return {name: {"dtype": str(value.dtype), "shape": [int(d) for d in value.shape],
                   "data": base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")}
            for name, value in values.items()}


def decode_arrays(entry: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The arrays :func:`encode_arrays` wrote."""
    return {name: np.frombuffer(base64.b64decode(item["data"]), dtype=str(item["dtype"]))
            .reshape([int(d) for d in item["shape"]]).copy() for name, item in entry.items()}


def dumps(metadata: dict[str, Any]) -> str:
    """The JSON text embedded in a library: ASCII only, ``forge_artifact`` first."""
    ordered = {"forge_artifact": ARTIFACT_MARK, **{k: v for k, v in metadata.items() if k != "forge_artifact"}}
    return json.dumps(ordered, ensure_ascii=True, sort_keys=False)


def has_embedded(data: bytes) -> bool:
    """Whether ``data`` holds a Forge metadata document at all."""
    return data.find(_ANCHOR) >= 0


def read_embedded(data: bytes) -> dict[str, Any] | None:
    """The metadata document embedded in a library's bytes, or None when there is none."""
    start = data.find(_ANCHOR)
    if start < 0:
        return None
    text = data[start:start + 64_000_000].decode("ascii", errors="replace")  # per-channel scales of big models
    document, _ = json.JSONDecoder().raw_decode(text)
    return document


def library_document(data: bytes, name: str) -> dict[str, Any]:
    """The metadata of a plain (or decrypted) library, once its checksum is verified.

    ``ArtifactCorruptedError`` for a damaged library, or for a file that is no
    Forge library at all (neither metadata nor checksum: a truncated one looks
    the same).
    """
    from forge_core.errors import ArtifactCorruptedError, ForgeError
    from forge_core.runtime.library_file import verify

    try:
        verify(data, name)
    except ArtifactCorruptedError:
        if not has_embedded(data):
            raise ArtifactCorruptedError(
                f"{name} is not a Forge library, or a truncated one: it carries neither Forge metadata nor "
                "a Forge checksum"
            ) from None
        raise
    document = read_embedded(data)
    if document is None:
        raise ForgeError(f"{name} is not a Forge library: it carries no Forge metadata")
    return document


def bucket_functions(document: dict[str, Any]) -> dict[tuple[tuple[int, ...], ...], str]:
    """The document's shape buckets: the inputs' shapes, in input order -> the library function to call."""
    names = [spec["name"] for spec in document["inputs"]]
    return {tuple(tuple(int(d) for d in bucket["inputs"][name]) for name in names): str(bucket["function"])
            for bucket in document.get("shape_buckets") or ()}


def library_path(path: str | Path) -> Path:
    """The library file of an artifact given as its directory or as the file itself."""
    path = Path(path)
    return path / LIBRARY_FILE if path.is_dir() else path


def read_artifact(path: str | Path) -> tuple[dict[str, Any], bool]:
    """``(metadata, encrypted)`` of an artifact (directory or library), without loading or decrypting it.

    An encrypted library's document comes from its header, readable without
    the password and verified only when the library is decrypted.
    """
    from forge_core.errors import PathNotFoundError
    from forge_core.security.encrypted_library import is_encrypted, read_library_header

    file = library_path(path)
    if not file.is_file():
        raise PathNotFoundError(f"No compiled library at {str(file)!r}")
    data = file.read_bytes()
    if is_encrypted(data):
        return read_library_header(data, repr(str(file))).metadata, True
    document = library_document(data, repr(str(file)))
    return document, False
