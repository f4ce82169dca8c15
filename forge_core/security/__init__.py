"""Encrypted artifacts: the file formats of an encrypted library and its key, and passwords.

Imports nothing of the compiler, so the light runtime decrypts with it alone.
All cryptography comes from the ``cryptography`` package (AES-256-GCM, scrypt).
"""

from forge_core.security.encrypted_library import (
    KEY_FILE,
    KeyFile,
    LibraryHeader,
    decrypt_library,
    encrypt_library,
    is_encrypted,
    read_key_file,
    read_library_header,
)
from forge_core.security.passwords import check_password

__all__ = [
    "KEY_FILE",
    "KeyFile",
    "LibraryHeader",
    "check_password",
    "decrypt_library",
    "encrypt_library",
    "is_encrypted",
    "read_key_file",
    "read_library_header",
]
