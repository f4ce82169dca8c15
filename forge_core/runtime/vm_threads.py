"""Running TVM's virtual machine from any Python thread.

Two facts about TVM 0.27, measured:

- **The VM is not re-entrant.** ``VirtualMachine`` keeps its registers
  and its memory pool in the instance. Eight threads calling one instance
  fail with ``TypeError: Mismatched type on argument #0`` or mix their
  tensors.
- **TVM's worker pool belongs to the calling thread** and is never torn
  down. Every thread that runs a parallel kernel, or sizes the pool
  (``runtime.config_threadpool``), starts worker threads that outlive it:
  two more OS threads for every short-lived calling thread, for ever.

So Forge runs every VM call on one of two threads only: the main thread,
directly, and one process-wide daemon thread, ``forge-inference``, for calls
made from any other thread (they queue there, in order). Each of the two
has a VM of its own over the shared library, and its own pool sized to the
artifact. Calls from the main thread and from other threads therefore run
at the same time; calls from other threads run one at a time, each using
every core through the pool, which is also what a CPU can give them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from forge_core.runtime.vm import VirtualMachine  # TVM's runtime library through tvm_ffi: no compiler needed

from forge_core.threads import configure_threads

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _inference_thread() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-inference")
        return _executor


class VMSessions:
    """A loaded library's virtual machines: one per thread allowed to run TVM (see the module's note).

    Args:
        executable: A loaded library (``tvm_ffi.Module``) or a Relax executable.
        device: The device the VM runs on.
        target_cores: The ``num-cores`` the artifact was compiled for, if any,
            which sizes the worker pool (:func:`forge_core.threads.configure_threads`).
    """

    def __init__(self, executable: Any, device: Any, target_cores: int | None = None) -> None:
        self._executable = executable
        self._device = device
        self._target_cores = target_cores
        self._per_thread = threading.local()
        self.num_threads = 0
        self.run(lambda vm: None)  # sizes this thread's pool (num_threads) and makes its VM now

    def _vm(self) -> VirtualMachine:
        vm = getattr(self._per_thread, "vm", None)
        if vm is None:
            self.num_threads = configure_threads(self._target_cores)
            vm = VirtualMachine(self._executable, self._device)
            self._per_thread.vm = vm
            self._per_thread.functions = {}
        return vm

    def run(self, work: Callable[[VirtualMachine], T]) -> T:
        """``work(vm)`` on the calling thread if it is the main thread, else on ``forge-inference``."""
        current = threading.current_thread()
        if current is threading.main_thread() or current.name.startswith("forge-inference"):
            return work(self._vm())  # a thread allowed to run TVM (the second: work that calls back in)
        return _inference_thread().submit(lambda: work(self._vm())).result()

    def function(self, vm: VirtualMachine, name: str) -> Any:
        """``vm[name]``, looked up once per thread."""
        functions = self._per_thread.functions
        if name not in functions:
            functions[name] = vm[name]
        return functions[name]

    def call(self, name: str, *args: Any, convert: Callable[[Any], T]) -> T:
        """Call the VM's function ``name`` on ``args`` and pass its result to ``convert`` on the same thread.

        ``convert`` must copy what it keeps: the VM reuses its pooled memory on the next call.
        """
        return self.run(lambda vm: convert(self.function(vm, name)(*args)))
