"""The encrypted library and its key file (format version 1).

``compile(encrypt_password=...)`` writes two files: ``model_library.so``,
encrypted, and the key file ``modelKey.bin`` (the reference product's name).

**The library.** A random 256-bit data key encrypts the compiled library with
AES-256-GCM, in chunks of :data:`CHUNK_SIZE` bytes::

    "FORGE-ENCRYPTED-LIBRARY\\n"   24 bytes
    header length                  4 bytes, big-endian
    header                         JSON, ASCII: format_version, cipher, uuid, key_id,
                                   chunk_size, size (of the plaintext), metadata
    chunk 0 ... chunk n-1          AES-GCM ciphertext of each plaintext chunk + its 16-byte tag

Chunk ``i`` is encrypted with the 96-bit nonce ``i`` (big-endian; the data
key is never used for another library) and the whole prefix (magic, length
and header) as associated data. Every chunk's tag therefore authenticates the
header too, the nonce fixes each chunk's position, and the header's ``size``
fixes how many chunks there are: a flipped byte anywhere, a reordered,
dropped or appended chunk, or a truncation fails with
:class:`~forge_core.errors.CorruptLibraryError` before any byte is loaded.
The header carries the artifact's metadata document (uuid, target, inputs,
outputs), so ``forge info`` reads it without the password; it is verified
only once the library is decrypted. The entries that describe the model's
inside, :data:`PRIVATE_METADATA` (the kernel names of ``schedules``, a stateful model's ``initial_state``, the
per-layer scales of ``quantization``), stay in the encrypted library only.

**The key file.** The data key, wrapped with AES-256-GCM under a key that
scrypt derives from the password::

    "FORGE-KEY\\n"                  10 bytes
    header length                  4 bytes, big-endian
    header                         JSON, ASCII: format_version, cipher, uuid, key_id,
                                   kdf {name: "scrypt", n, r, p, salt}, nonce
    wrapped key                    48 bytes: the AES-GCM ciphertext of the data key + tag

The header is the associated data of the wrapping. A wrong password and a
modified byte are indistinguishable by design (both fail the tag):
:class:`~forge_core.errors.WrongPasswordError` says "wrong password or
corrupted key file". ``uuid`` and ``key_id`` (a random id shared by the two
files) tell a key of another artifact apart before any password is tried.

scrypt's cost parameters are read from the key file, so they are bounded
(:data:`SCRYPT_LIMITS`): a modified key file cannot make the runtime allocate
gigabytes. Everything comes from ``cryptography``; nothing here is a
hand-written primitive or padding (GCM needs none).
"""

from __future__ import annotations

import json
import os
import uuid as uuid_lib
from dataclasses import dataclass
from typing import Any


from forge_core.errors import CorruptKeyError, CorruptLibraryError, MalformedDataError, OptionError, WrongPasswordError

FORMAT_VERSION = 1
CIPHER = "AES-256-GCM"
KEY_FILE = "modelKey.bin"
"""The key file's name in an artifact directory (the reference product's)."""
LIBRARY_MAGIC = b"FORGE-ENCRYPTED-LIBRARY\n"
KEY_MAGIC = b"FORGE-KEY\n"
CHUNK_SIZE = 1 << 20
SCRYPT_PARAMETERS = {"n": 1 << 15, "r": 8, "p": 1}
"""scrypt's cost when encrypting: 32 MiB and about 0.1 s here per derivation."""
SCRYPT_LIMITS = {"n": (1 << 14, 1 << 20), "r": (1, 16), "p": (1, 4), "memory": 1 << 28}
"""What a key file may ask for: n (a power of two), r and p ranges, and at most 256 MiB (128·n·r)."""
PRIVATE_METADATA = ("schedules", "quantization", "initial_state")
"""Metadata entries left out of the readable header: they name the model's layers."""
_TAG = 16
_NONCE = 12
_DATA_KEY = 32
_SALT = 16
_LENGTH = 4


@dataclass(frozen=True)
class LibraryHeader:
    """The readable part of an encrypted library."""

    uuid: str
    key_id: str
    chunk_size: int
    size: int
    """The plaintext library's size in bytes."""
    metadata: dict[str, Any]
    """The artifact's metadata document (verified only once the library is decrypted)."""
    prefix: bytes
    """Magic, length and header: the associated data of every chunk."""

    @property
    def chunks(self) -> int:
        return -(-self.size // self.chunk_size)

    @property
    def file_size(self) -> int:
        """The encrypted file's exact size."""
        return len(self.prefix) + self.size + self.chunks * _TAG


@dataclass(frozen=True)
class KeyFile:
    """A parsed key file: who it belongs to, and the wrapped data key."""

    uuid: str
    key_id: str
    scrypt: dict[str, int]
    salt: bytes
    nonce: bytes
    wrapped: bytes
    prefix: bytes
    source: str

    def unwrap(self, password: bytes) -> bytes:
        """The data key; :class:`WrongPasswordError` when the password (or the file) is wrong."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

        kek = Scrypt(salt=self.salt, length=_DATA_KEY, **self.scrypt).derive(password)
        try:
            return AESGCM(kek).decrypt(self.nonce, self.wrapped, self.prefix)
        except InvalidTag:
            raise WrongPasswordError(
                f"Corrupted chunk encountered while decrypting the key {self.source}: wrong password or "
                "corrupted key file. Check the password (FORGE_DECRYPT_PASSWORD for the command line), "
                "and that the key file is the one compile() wrote."
            ) from None


def is_encrypted(data: bytes) -> bool:
    """Whether ``data`` starts like an encrypted Forge library."""
    return data[:len(LIBRARY_MAGIC)] == LIBRARY_MAGIC


def _framed(magic: bytes, header: dict[str, Any]) -> bytes:
    text = json.dumps(header, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode("ascii")
    return magic + len(text).to_bytes(_LENGTH, "big") + text


def _reject_constant(name: str) -> Any:
    raise MalformedDataError(f"{name} is not a number JSON allows")


def _unframe(data: bytes, magic: bytes) -> tuple[dict[str, Any], bytes] | str:
    """(header, prefix), or a sentence saying what is wrong with the framing."""
    if data[:len(magic)] != magic:
        return "it does not start with the Forge signature"
    start = len(magic) + _LENGTH
    if len(data) < start:
        return f"it is truncated ({len(data)} bytes)"
    length = int.from_bytes(data[len(magic):start], "big")
    if len(data) < start + length:
        return f"it is truncated: the header needs {length} bytes, {len(data) - start} follow"
    try:
        header = json.loads(data[start:start + length].decode("ascii"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        # _reject_constant's MalformedDataError keeps the name the message has always given it
        kind = "ValueError" if isinstance(exc, MalformedDataError) else type(exc).__name__
        return f"its header is not valid JSON ({kind})"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    return header, data[:start + length]


def _field(header: dict[str, Any], name: str, kind: type) -> Any:
    value = header.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise MalformedDataError(f"header field {name!r} is missing or not a {kind.__name__}")
    return value


def _hex(header: dict[str, Any], name: str, size: int) -> bytes:
    text = _field(header, name, str)
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise MalformedDataError(f"header field {name!r} is not hexadecimal") from None
    if len(value) != size:
        raise MalformedDataError(f"header field {name!r} holds {len(value)} bytes, not {size}")
    return value


def _common(header: dict[str, Any]) -> tuple[str, str]:
    version = header.get("format_version")
    if version != FORMAT_VERSION:
        raise MalformedDataError(f"format version {version!r}; this Forge reads version {FORMAT_VERSION}")
    if header.get("cipher") != CIPHER:
        raise MalformedDataError(f"cipher {header.get('cipher')!r}; this Forge reads {CIPHER}")
    try:
        uuid_text = str(uuid_lib.UUID(_field(header, "uuid", str)))
    except ValueError:
        raise MalformedDataError("header field 'uuid' is not a UUID") from None
    return uuid_text, _hex(header, "key_id", 16).hex()


def read_library_header(data: bytes, source: str = "library") -> LibraryHeader:
    """The header of an encrypted library; :class:`CorruptLibraryError` when it is malformed or truncated."""
    framed = _unframe(data, LIBRARY_MAGIC)
    if isinstance(framed, str):
        raise CorruptLibraryError(f"The encrypted library {source} is corrupted: {framed}. Copy it again from "
                                  "the compile output.")
    header, prefix = framed
    try:
        uuid_text, key_id = _common(header)
        chunk_size = _field(header, "chunk_size", int)
        size = _field(header, "size", int)
        metadata = _field(header, "metadata", dict)
        if not 1 <= chunk_size <= 1 << 30 or size < 1:
            raise MalformedDataError(f"chunk_size {chunk_size} or size {size} out of range")
    except ValueError as exc:
        raise CorruptLibraryError(f"The encrypted library {source} is corrupted: {exc}.") from None
    parsed = LibraryHeader(uuid_text, key_id, chunk_size, size, metadata, prefix)
    if len(data) != parsed.file_size:
        state = "truncated" if len(data) < parsed.file_size else "extended"
        raise CorruptLibraryError(
            f"The encrypted library {source} is {state}: its header announces {parsed.file_size} bytes, the file "
            f"holds {len(data)}. Copy it again from the compile output."
        )
    return parsed


def decrypt_library(data: bytes, header: LibraryHeader, data_key: bytes, source: str = "library") -> bytes:
    """The plaintext library; :class:`CorruptLibraryError` at the first chunk that fails authentication."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(data_key)
    offset = len(header.prefix)
    plaintext = []
    for index in range(header.chunks):
        plain_size = min(header.chunk_size, header.size - index * header.chunk_size)
        sealed = data[offset:offset + plain_size + _TAG]
        offset += plain_size + _TAG
        try:
            plaintext.append(aead.decrypt(index.to_bytes(_NONCE, "big"), sealed, header.prefix))
        except InvalidTag:
            raise CorruptLibraryError(
                f"The encrypted library {source} was tampered with or corrupted: chunk {index + 1} of "
                f"{header.chunks} fails authentication. Copy it again from the compile output."
            ) from None
    return b"".join(plaintext)


def read_key_file(data: bytes, source: str = "key file") -> KeyFile:
    """A parsed key file; :class:`CorruptKeyError` when it is malformed, truncated or not a key file."""
    if is_encrypted(data):
        raise CorruptKeyError(f"{source} is an encrypted library, not a key file: pass the library first, then "
                              f"its key file ({KEY_FILE}).")
    framed = _unframe(data, KEY_MAGIC)
    if isinstance(framed, str):
        raise CorruptKeyError(f"The key file {source} is corrupted or not a Forge key file: {framed}.")
    header, prefix = framed
    try:
        uuid_text, key_id = _common(header)
        kdf = _field(header, "kdf", dict)
        if kdf.get("name") != "scrypt":
            raise MalformedDataError(f"key derivation {kdf.get('name')!r}; this Forge reads scrypt")
        params = {name: _field(kdf, name, int) for name in ("n", "r", "p")}
        n, r, p = params["n"], params["r"], params["p"]
        lo_n, hi_n = SCRYPT_LIMITS["n"]
        if (n & (n - 1) or not lo_n <= n <= hi_n or not SCRYPT_LIMITS["r"][0] <= r <= SCRYPT_LIMITS["r"][1]
                or not SCRYPT_LIMITS["p"][0] <= p <= SCRYPT_LIMITS["p"][1] or 128 * n * r > SCRYPT_LIMITS["memory"]):
            raise MalformedDataError(f"scrypt parameters n={n}, r={r}, p={p} outside what Forge writes or accepts")
        salt = _hex(kdf, "salt", _SALT)
        nonce = _hex(header, "nonce", _NONCE)
    except ValueError as exc:
        raise CorruptKeyError(f"The key file {source} is corrupted: {exc}.") from None
    wrapped = data[len(prefix):]
    if len(wrapped) != _DATA_KEY + _TAG:
        state = "truncated" if len(wrapped) < _DATA_KEY + _TAG else "extended"
        raise CorruptKeyError(f"The key file {source} is {state}: {len(data)} bytes where "
                              f"{len(prefix) + _DATA_KEY + _TAG} belong.")
    return KeyFile(uuid_text, key_id, params, salt, nonce, wrapped, prefix, source)


def encrypt_library(plaintext: bytes, metadata: dict[str, Any], password: bytes,
                    chunk_size: int = CHUNK_SIZE) -> tuple[bytes, bytes]:
    """``(encrypted library, key file)`` for ``plaintext``; ``password`` as :func:`check_password` returns it."""
    if not plaintext:
        raise OptionError("Nothing to encrypt: the library is empty")
    uuid_text = str(uuid_lib.UUID(str(metadata["uuid"])))
    key_id = os.urandom(16).hex()
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    data_key = AESGCM.generate_key(bit_length=256)
    prefix = _framed(LIBRARY_MAGIC, {
        "format_version": FORMAT_VERSION, "cipher": CIPHER, "uuid": uuid_text, "key_id": key_id,
        "chunk_size": chunk_size, "size": len(plaintext),
        "metadata": {k: v for k, v in metadata.items() if k not in PRIVATE_METADATA},
    })
    aead = AESGCM(data_key)
    sealed = [aead.encrypt(index.to_bytes(_NONCE, "big"), plaintext[start:start + chunk_size], prefix)
              for index, start in enumerate(range(0, len(plaintext), chunk_size))]
    salt, nonce = os.urandom(_SALT), os.urandom(_NONCE)
    key_prefix = _framed(KEY_MAGIC, {
        "format_version": FORMAT_VERSION, "cipher": CIPHER, "uuid": uuid_text, "key_id": key_id,
        "kdf": {"name": "scrypt", **SCRYPT_PARAMETERS, "salt": salt.hex()}, "nonce": nonce.hex(),
    })
    kek = Scrypt(salt=salt, length=_DATA_KEY, **SCRYPT_PARAMETERS).derive(password)
    wrapped = AESGCM(kek).encrypt(nonce, data_key, key_prefix)
    return prefix + b"".join(sealed), key_prefix + wrapped
