"""Identity of a module: a structural hash and a fingerprint over structure plus weights.

* :func:`structural_hash` ignores every weight value: two models of one
  architecture with other weights hash equal. It covers the graph, the
  constants' shapes and dtypes, and the names, shapes and dtypes of ``params``.
* :func:`fingerprint` is a SHA-256 over that hash and every weight's bytes, in
  a deterministic order. It is the same across processes and machines for the
  same model, and changes when any single weight element changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import tvm
import tvm_ffi

from forge_core.ir.weights import Tensor, iter_constants

_FINGERPRINT_VERSION = b"forge-fingerprint-v1"


def _graph_hash(mod: tvm.IRModule) -> int:
    return int(tvm_ffi.structural_hash(mod, map_free_vars=False, skip_tensor_content=True))


def structural_hash(mod: tvm.IRModule, params: Mapping[str, Tensor]) -> int:
    """A 64-bit hash of the structure, blind to weight values."""
    digest = hashlib.sha256()
    digest.update(_graph_hash(mod).to_bytes(8, "little"))
    for name in sorted(params):
        tensor = params[name]
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
    # Python hashes are signed machine words.
    return int.from_bytes(digest.digest()[:8], "little", signed=True)


def _update_with_tensor(digest: "hashlib._Hash", tensor: Tensor) -> None:
    array = tensor.numpy()
    digest.update(f"{array.dtype.str}:{array.shape};".encode())
    digest.update(np.ascontiguousarray(array.reshape(-1)).view(np.uint8).data)


def fingerprint(mod: tvm.IRModule, params: Mapping[str, Tensor]) -> str:
    """Hex SHA-256 over structure and every weight byte."""
    digest = hashlib.sha256(_FINGERPRINT_VERSION)
    digest.update(_graph_hash(mod).to_bytes(8, "little"))
    for const in iter_constants(mod):
        _update_with_tensor(digest, const.value)
    for name in sorted(params):
        digest.update(name.encode() + b"=")
        _update_with_tensor(digest, params[name])
    return digest.hexdigest()
