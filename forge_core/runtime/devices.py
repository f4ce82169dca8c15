"""The device backends of TVM's runtime: loaded when an artifact needs one.

TVM's runtime library (``libtvm_runtime.so``) drives the CPU. A GPU's backend is
a sidecar library beside it (``libtvm_runtime_cuda.so``), which the compiler
library loads as a dependency; with the runtime library alone (a board,
``TVM_USE_RUNTIME_LIB=1``, or Forge's runtime, which imports no ``tvm``) nothing loads it, and ``tvm.cuda(0).exist`` is
False on a machine with a GPU. :func:`ensure_backend` loads it on demand.
"""

from __future__ import annotations

import tvm_ffi
from tvm_ffi.libinfo import load_lib_ctypes

from forge_core.errors import ForgeError
from forge_core.tvm_import import load_tvm_runtime, tvm_package_directory

SIDECARS = {"cuda": "tvm_runtime_cuda"}
"""Device type -> the TVM library (``lib<name>.so``) that registers its backend."""

_NEEDS = {"cuda": "the NVIDIA driver (libcuda.so.1) and the CUDA 13 runtime (libcudart.so.13, which torch's CUDA "
                  "wheels and `pip install nvidia-cuda-runtime` provide; put its directory on LD_LIBRARY_PATH)"}


def registered(device_type: str) -> bool:
    return f"device_api.{device_type}" in set(tvm_ffi.registry.list_global_func_names())


def ensure_backend(device_type: str, artifact: str) -> None:
    """Load the backend of ``device_type`` unless it is registered; a ForgeError names what is missing."""
    if device_type == "cpu" or registered(device_type) or device_type not in SIDECARS:
        return
    name = SIDECARS[device_type]
    load_tvm_runtime()  # the sidecar links against it
    try:
        load_lib_ctypes(package="tvm", target_name=name, mode="RTLD_GLOBAL",
                        extra_lib_paths=[tvm_package_directory() / "lib"])
    except OSError as error:
        raise ForgeError(
            f"{artifact!r} is built for {device_type}, and TVM's {device_type} runtime (lib{name}.so) did not load: "
            f"{error}. It needs {_NEEDS[device_type]}."
        ) from None
