"""Opening an encrypted library: from its bytes, a key file and a password to the plaintext library.

The checks run cheapest first, so each mistake gets its own error
(:mod:`forge_core.errors`) before any expensive step:

1. the library's header (:class:`CorruptLibraryError`);
2. a key file was given (:class:`MissingKeyError`), and a password
   (:class:`MissingPasswordError`);
3. the key file's framing (:class:`CorruptKeyError`), then whether it belongs
   to this library: same uuid and key id (:class:`KeyMismatchError`);
4. scrypt and the key's tag (:class:`WrongPasswordError`);
5. every chunk's tag (:class:`CorruptLibraryError`).

Nothing is written anywhere; the caller loads the plaintext from memory.
"""

from __future__ import annotations

import os
from pathlib import Path

from forge_core.errors import KeyMismatchError, MissingKeyError, MissingPasswordError
from forge_core.security.encrypted_library import (
    KEY_FILE,
    decrypt_library,
    read_key_file,
    read_library_header,
)
from forge_core.security.passwords import check_password


def open_encrypted(data: bytes, path: Path, key_path: str | os.PathLike[str] | None,
                   password: str | None) -> bytes:
    """The plaintext of the encrypted library ``data``, read from ``path``."""
    source = repr(str(path))
    header = read_library_header(data, source)
    if key_path is None:
        beside = path.parent / KEY_FILE
        hint = f" ({str(beside)!r} is beside it)" if beside.is_file() else ""
        raise MissingKeyError(
            f"Model looks encrypted but no key provided: {source} (uuid {header.uuid}) needs its key file "
            f"{KEY_FILE}{hint} and password: Runtime(library, key_path, password), or --key on the command line."
        )
    if password is None or password == "":
        raise MissingPasswordError(
            f"The key file {str(key_path)!r} needs its password, and none was given: pass password=, or set "
            "FORGE_DECRYPT_PASSWORD (or answer the prompt) on the command line."
        )
    secret = check_password(password, "password", warn_weak=False)
    key_source = repr(str(key_path))
    key = read_key_file(Path(key_path).read_bytes(), key_source)
    if key.uuid != header.uuid:
        raise KeyMismatchError(
            f"The key file {key_source} belongs to the artifact with uuid {key.uuid}, not to {source} "
            f"(uuid {header.uuid}). Use the {KEY_FILE} that compile() wrote beside this library."
        )
    if key.key_id != header.key_id:
        raise KeyMismatchError(
            f"The key file {key_source} has the uuid of {source} ({header.uuid}) but belongs to another compile "
            f"of it (key id {key.key_id}, the library's is {header.key_id}). Use the {KEY_FILE} written with this "
            "library."
        )
    return decrypt_library(data, header, key.unwrap(secret), source)
