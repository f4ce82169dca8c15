"""Passwords of encrypted artifacts: refused when empty, a warning when weak.

A password is NFC-normalised and UTF-8 encoded before scrypt sees it, so a
password typed with composed or decomposed accents (``é`` as one code point or
two) opens the same key on every machine.

Weak means shorter than :data:`MIN_LENGTH` characters, or one kind of
character only (all lower-case letters, all digits, ...). The key file is
protected by scrypt (about 0.1 s a guess here), and whoever holds an artifact
and its key file can guess offline, so a weak password is a real risk; it
is still accepted, with a :class:`~forge_core.errors.WeakPasswordWarning`.
"""

from __future__ import annotations

import string
import unicodedata
import warnings

from forge_core.errors import OptionError, WeakPasswordWarning

MIN_LENGTH = 10
_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def _kinds(password: str) -> int:
    kinds = {next((i for i, chars in enumerate(_CLASSES) if ch in chars), len(_CLASSES)) for ch in password}
    return len(kinds)


def check_password(password: object, what: str = "encrypt_password", warn_weak: bool = True) -> bytes:
    """The password as scrypt takes it; ``ValueError`` when empty or not a string, a warning when weak.

    ``warn_weak=False`` when opening: the password is whatever encrypted the artifact.
    """
    if not isinstance(password, str):
        raise OptionError(f"{what} must be a string, given {type(password).__name__}")
    if password == "":
        raise OptionError(f"{what} is empty; an encrypted artifact needs a password")
    normalized = unicodedata.normalize("NFC", password)
    if warn_weak:
        problems = []
        if len(normalized) < MIN_LENGTH:
            problems.append(f"{len(normalized)} characters, fewer than {MIN_LENGTH}")
        if _kinds(normalized) == 1:
            problems.append("one kind of character only")
        if problems:
            warnings.warn(
                f"{what} is weak ({'; '.join(problems)}): whoever holds the artifact and its key file can try "
                f"passwords offline. Use {MIN_LENGTH + 2} or more characters mixing letters, digits and symbols.",
                WeakPasswordWarning,
                stacklevel=2,
            )
    return normalized.encode("utf-8")
