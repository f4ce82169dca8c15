"""TensorFlow's, the TFLite converter's and tf2onnx's console output, kept in Forge's debug log.

Converting a model makes these libraries print to stdout ("Saved artifact
at ...", traced signatures) and log warnings through their own Python loggers.
None of it is for the user of Forge: while a conversion runs, it is captured
and then logged at DEBUG level on the ``forge.tf`` logger. Errors still reach
the user, as the exceptions Forge raises.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator

logger = logging.getLogger("forge.tf")

_LIBRARY_LOGGERS = ("tensorflow", "absl", "tf2onnx", "keras")


@contextlib.contextmanager
def captured_output(step: str) -> Iterator[None]:
    """Capture Python-level stdout, stderr and the libraries' loggers while ``step`` runs."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    saved = []
    for name in _LIBRARY_LOGGERS:
        library_logger = logging.getLogger(name)
        saved.append((library_logger, library_logger.handlers[:], library_logger.propagate))
        library_logger.handlers = [handler]
        library_logger.propagate = False
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield
    finally:
        for library_logger, handlers, propagate in saved:
            library_logger.handlers = handlers
            library_logger.propagate = propagate
        text = buffer.getvalue().strip()
        if text:
            logger.debug("%s printed:\n%s", step, text)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(exc: BaseException) -> str:
    """An exception's message on one line: its first non-empty line (the type's name when empty).

    Keras wraps an error raised in a layer's ``call`` as "Exception encountered
    when calling <Layer>.call()." with the reason on a later line: both are kept.
    """
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("Exception encountered when calling") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def one_line(exc: BaseException) -> str:
    """An exception's whole message joined on one line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "")
