"""TVM's Relax virtual machine, its devices and tensors, through ``tvm_ffi`` and TVM's runtime library alone.

``import tvm`` costs about 0.23 s even with TVM's runtime library alone (its Python
object types register on import); the runtime needs only the library's functions,
which ``tvm_ffi`` calls: loading a library, the VM's ``vm_load_executable`` and
``vm_initialization`` (what ``tvm.runtime.vm.VirtualMachine`` calls), a device's
attributes. ``import forge_core.runtime`` then takes about 0.15 s (numpy and
``tvm_ffi``). Where ``tvm`` is imported anyway (the compiler's process), its
classes come back instead, and everything here works the same.
"""

from __future__ import annotations

from typing import Any

import tvm_ffi

from forge_core.tvm_import import load_tvm_runtime

load_tvm_runtime()

from forge_core.runtime import run_checks  # noqa: E402,F401 - registers the function compiled checks call

CPU = 1  # DLPack device type
_POOLED_ALLOCATOR = 2  # TVM's VirtualMachine.POOLED_ALLOCATOR
_RPC_SESSION_MASK = 128  # device types of a remote session carry this bit


def device_exists(dev: Any) -> bool:
    """Whether the device is present (``tvm.runtime.Device.exist``; a backend not loaded has none)."""
    get = tvm_ffi.get_global_func("runtime.GetDeviceAttr", allow_missing=True)
    if get is None:
        return False
    try:
        return bool(get(dev.dlpack_device_type(), dev.index, 0))  # 0: kExist
    except Exception:  # noqa: BLE001 - no device API registered for this type
        return False


class VirtualMachine:
    """A Relax VM on ``dev`` over a loaded library: ``vm[name]`` is the VM's function ``name``.

    As ``tvm.runtime.vm.VirtualMachine`` sets one up: the CPU is added for shape functions, every device
    with TVM's pooled allocator. A Relax executable (the compiler's, where ``tvm`` is imported) is run
    through its in-memory library.
    """

    def __init__(self, library: Any, dev: Any) -> None:
        if not isinstance(library, tvm_ffi.Module) and hasattr(library, "jit"):
            library = library.jit()  # tvm.runtime.Executable: only where the compiler built it in this process
        self.module = library["vm_load_executable"]()
        devices = [dev]
        if dev.dlpack_device_type() % _RPC_SESSION_MASK != CPU:
            devices.append(tvm_ffi.device("cpu", 0))
        args: list[int] = []
        for each in devices:
            args += [each.dlpack_device_type() % _RPC_SESSION_MASK, each.index, _POOLED_ALLOCATOR]
        self.module["vm_initialization"](*args)
        self._set_instrument = self.module["set_instrument"]

    def __getitem__(self, name: str) -> Any:
        return self.module[name]

    def set_instrument(self, instrument: Any) -> None:
        """Call ``instrument`` around every packed call the VM makes (``tvm.runtime.vm.VirtualMachine``'s)."""
        self._set_instrument(instrument)
