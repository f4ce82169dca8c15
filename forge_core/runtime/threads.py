"""How many threads TVM's runtime uses.

TVM's thread pool assumes hyper-threading and starts half the cores (one
thread on a 2-core machine). Forge uses every core the process may run on,
unless ``FORGE_NUM_THREADS`` or ``TVM_NUM_THREADS`` says otherwise.
"""

from __future__ import annotations

import os

THREADS_ENV = "FORGE_NUM_THREADS"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configure_threads() -> int:
    """Set TVM's thread count (before its pool starts) and return it."""
    if os.environ.get(THREADS_ENV):
        os.environ["TVM_NUM_THREADS"] = os.environ[THREADS_ENV]
    elif not os.environ.get("TVM_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(available_cores())
    return int(os.environ["TVM_NUM_THREADS"])
