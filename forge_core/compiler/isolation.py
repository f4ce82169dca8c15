"""Running a library export in a child process, so that a failed write cannot end the caller's.

LLVM reports a failed write of the object file it emits (a full disk, a file
size limit) with ``report_fatal_error``, which prints ``LLVM ERROR: IO failure
on output stream: No space left on device`` and calls ``exit(1)``: inside
``compile()`` that would end the user's Python process, with no chance to
remove the half-written artifact. :func:`run_forked` runs the export in a
``fork()`` of this process (copy-on-write: no copy of the module, a few
milliseconds), whose temporary files go to a directory the parent removes
whatever happens; the parent gets the child's exception, or the errno that
its last words name, and raises it.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_core.errors import ExportProcessError, FileAccessError

FORK_ENV = "FORGE_EXPORT_IN_PROCESS"
"""Set to 1 to export in this process (no fork): for debuggers."""

DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)
"""What a failed write of an output reports: these, named in a message, become a FileAccessError."""

_MAX_MESSAGE = 8000


FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
"""A full disk, a file size limit, a quota: named in a linker's or LLVM's message, they mean the output."""


def errno_named_in(text: str) -> int | None:
    """The first of :data:`FULL_ERRNOS` whose system text (``No space left on device``) appears in ``text``."""
    for code in FULL_ERRNOS:
        if os.strerror(code) in text:
            return code
    return None


def _describe(exc: BaseException) -> dict[str, Any]:
    description: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:_MAX_MESSAGE]}
    if isinstance(exc, OSError):
        description.update(errno=exc.errno, strerror=exc.strerror,
                           filename=None if exc.filename is None else os.fsdecode(exc.filename))
        if isinstance(exc, FileAccessError):
            description["verb"] = exc.verb
    with contextlib.suppress(Exception):
        blob = pickle.dumps(exc)
        if len(blob) <= _MAX_MESSAGE and type(pickle.loads(blob)) is type(exc):
            description["pickled"] = blob
    return description


def _rebuild(description: dict[str, Any], output: Path, stderr: str) -> BaseException:
    """The child's exception in the parent: itself when it pickles, else an equivalent."""
    code = None if description.get("errno") is not None else errno_named_in(description["message"])
    if code is not None:  # a linker's "final link failed: No space left on device"
        return FileAccessError(code, os.strerror(code), str(output))
    if description.get("pickled") is not None:
        with contextlib.suppress(Exception):
            return pickle.loads(description["pickled"])
    if description.get("errno") is not None:
        if description.get("verb"):
            return FileAccessError(description["errno"], description["strerror"], description["filename"],
                                   description["verb"])
        return OSError(description["errno"], description["strerror"], description["filename"])
    message = description["message"]
    if description["type"] != "RuntimeError":
        message = f"{description['type']}: {message}"
    if stderr:
        message = f"{message}\n{stderr}"
    return RuntimeError(message)


_EXIT_HANDLER: Any = None


def _exit_at_once_on_exit() -> None:
    """In the child: make a C ``exit()`` (LLVM's ``report_fatal_error``) end the process at once.

    ``exit()`` runs the exit handlers of every library the parent loaded. Some
    wait on threads that do not exist in a fork: onnxruntime's destructors
    block for ever on a condition variable of its thread pool (measured: an
    export killed by a file size limit hung its parent's ``compile()``).
    Handlers run last-registered first, so this one, registered in the child
    after all of theirs, ends the process with status 1 before any of them.

    ``exit()`` first runs the ``thread_local`` destructors of the thread that
    calls it, before any handler: the export therefore runs in a thread of
    the child's own (:func:`_in_a_fresh_thread`), whose thread-locals are
    the child's. The main thread's are the parent's, among them TVM's worker
    pool, whose destructor waits for ever on workers that a fork does not
    copy (measured: a test worker that had run kernels hung in
    ``pthread_cond_destroy`` under ``exit()``).
    """
    global _EXIT_HANDLER
    import ctypes

    libc = ctypes.CDLL(None)

    def end(_argument: object) -> None:
        libc.fflush(None)  # LLVM's last words may still sit in a stdio buffer
        os._exit(1)

    # glibc exports no ``atexit`` (a static stub over ``__cxa_atexit``); ``ctypes`` would find another
    # library's, bound to that library's unloading. A null DSO handle: run at exit() only.
    _EXIT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(end)
    if libc.__cxa_atexit(_EXIT_HANDLER, None, None) != 0:
        raise ExportProcessError("atexit() refused a handler in the export's child process")


def _in_a_fresh_thread(function: Callable[[], None]) -> None:
    """Call ``function`` in a new thread and wait for it; raise what it raised (see :func:`_exit_at_once_on_exit`)."""
    import threading

    raised: list[BaseException] = []

    def call() -> None:
        try:
            function()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            raised.append(exc)

    worker = threading.Thread(target=call, name="forge-export")
    worker.start()
    worker.join()
    if raised:
        raise raised[0]


_PROBE_BYTES = 16 << 20


def _probe_write(directory: Path) -> int | None:
    """The errno with which writing 16 MiB into ``directory`` fails (a full disk, a file size limit), if any.

    A child that died in ``exit()`` without a Python exception (LLVM's fatal
    error; its message can be lost with the exit handlers this child skips)
    most likely failed to write its output: this asks the disk itself.
    """
    try:
        handle = tempfile.NamedTemporaryFile(dir=directory, prefix=".forge-probe-")  # noqa: SIM115
    except OSError as exc:
        return exc.errno if exc.errno in FULL_ERRNOS else None
    with handle:
        block = b"\0" * (1 << 20)
        try:
            for _ in range(_PROBE_BYTES // len(block)):
                handle.write(block)
            handle.flush()
            os.fsync(handle.fileno())
        except OSError as exc:
            return exc.errno if exc.errno in FULL_ERRNOS else None
    return None


def run_forked(function: Callable[[], None], output: Path) -> None:
    """Call ``function`` (which writes ``output``) in a child process; raise what it raised.

    When the child dies without a Python exception (LLVM's ``exit(1)``, a
    signal), the error is a :class:`FileAccessError` naming ``output`` when
    its last words name a write error, else an :class:`ExportProcessError` (a
    ``RuntimeError``) quoting them.
    Temporary files of the child (TVM's object files) go to a private
    directory that is removed before this returns.
    """
    if not hasattr(os, "fork") or os.environ.get(FORK_ENV) == "1":
        function()
        return
    try:
        scratch = Path(tempfile.mkdtemp(prefix="forge-export-"))  # 0700
    except OSError as exc:  # "No usable temporary directory found in [...]": a full disk, for one
        raise FileAccessError.from_os_error(exc, output) from exc
    try:
        _fork_and_wait(function, output, scratch)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def _fork_and_wait(function: Callable[[], None], output: Path, scratch: Path) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    stderr_read, stderr_write = os.pipe()
    result_read, result_write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork in a multithreaded process
        pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.close(stderr_read)
            os.close(result_read)
            os.dup2(stderr_write, 2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            # Fresh streams: the parent's may have been locked by one of its threads at the fork.
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            logging.disable(logging.CRITICAL)
            # No cyclic garbage collection in the child: a collection may free objects of the parent's, and an
            # onnxruntime session freed there waits for ever in pthread_cond_destroy on its thread pool's
            # workers, which a fork does not copy (measured: a test worker's export hung so, its parent too).
            # The child ends with os._exit, so nothing it keeps is leaked past it.
            gc.disable()
            _exit_at_once_on_exit()
            tempfile.tempdir = str(scratch)
            try:
                _in_a_fresh_thread(function)
                status = 0
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
                blob = pickle.dumps(_describe(exc))
                view = memoryview(blob)
                while view:
                    view = view[os.write(result_write, view):]
        finally:
            os._exit(status)
    os.close(stderr_write)
    os.close(result_write)
    try:
        with open(stderr_read, "rb") as child_stderr:
            last_words = child_stderr.read()
        with open(result_read, "rb") as child_result:
            blob = child_result.read()
    finally:
        _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    stderr = last_words.decode(errors="replace").strip()[-_MAX_MESSAGE:]
    if blob:
        raise _rebuild(pickle.loads(blob), output, stderr)
    if code == 0:
        return
    named = errno_named_in(stderr)
    if named is None and code > 0:
        named = _probe_write(output.parent)
    if named is not None:  # LLVM ERROR: IO failure on output stream: No space left on device
        raise FileAccessError(named, os.strerror(named), str(output))
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    detail = stderr.splitlines()[-1] if stderr else "no message"
    raise ExportProcessError(f"the export of {str(output)!r} {how}: {detail}")
