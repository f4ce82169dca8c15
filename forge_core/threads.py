"""How many threads TVM's runtime uses.

TVM's thread pool assumes hyper-threading and starts half the cores (one
thread on a 2-core machine), and it reads ``TVM_NUM_THREADS`` only once, when
the pool first starts. Forge therefore sets that variable when it imports TVM
(:func:`set_thread_environment`), and a runtime then narrows the pool to what
the artifact asks for (:func:`configure_threads`).

Order of precedence: ``FORGE_NUM_THREADS``; ``TVM_NUM_THREADS``; the
``num-cores`` the artifact was compiled for (a tag's), capped at the cores
this process may use; the cores this process may use.

Threads are not pinned to cores unless ``TVM_BIND_THREADS=1`` asks, as
onnxruntime and PyTorch leave them. TVM pins by default, and a pool of one
thread pins the calling thread itself to core 0, for good: every process that
ran with ``FORGE_NUM_THREADS=1`` then shared one core, whatever else the
machine had (measured: two such processes on 2 cores ran at one core's speed,
and so did all the work of the process after its first inference).
"""

from __future__ import annotations

import os

THREADS_ENV = "FORGE_NUM_THREADS"

# Whether TVM_NUM_THREADS was set by Forge (every core) rather than by the user.
_chosen_by_forge = False


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_thread_count() -> int:
    """``FORGE_NUM_THREADS`` if set, else every core this process may use."""
    value = os.environ.get(THREADS_ENV)
    return int(value) if value else available_cores()


BIND_ENV = "TVM_BIND_THREADS"


def set_thread_environment() -> None:
    """Before TVM's pool starts: ``TVM_NUM_THREADS`` from ``FORGE_NUM_THREADS``, else every core; threads
    unpinned unless ``TVM_BIND_THREADS`` says otherwise."""
    global _chosen_by_forge
    os.environ.setdefault(BIND_ENV, "0")
    if os.environ.get(THREADS_ENV):
        os.environ["TVM_NUM_THREADS"] = os.environ[THREADS_ENV]
    elif not os.environ.get("TVM_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(available_cores())
        _chosen_by_forge = True


def configure_threads(target_cores: int | None = None) -> int:
    """Size TVM's pool for an artifact compiled for ``target_cores`` cores; return the thread count."""
    import tvm_ffi

    from forge_core.tvm_import import load_tvm_runtime

    load_tvm_runtime()
    set_thread_environment()
    count = int(os.environ["TVM_NUM_THREADS"])
    if target_cores and _chosen_by_forge:
        count = max(1, min(count, int(target_cores)))
    tvm_ffi.get_global_func("runtime.config_threadpool")(0, count)
    return count
