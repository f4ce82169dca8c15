"""Moving arrays between numpy and a Relax VM: inputs in, outputs out.

``tvm.runtime.tensor(array)`` and ``Tensor.numpy()`` cost about 25 and 11
microseconds a call in TVM 0.27's Python layer, several times a small model's
whole inference. DLPack (``tvm_ffi.from_dlpack``, ``np.from_dlpack``) does the
same in about one, without importing ``tvm``: an input that is already
64-byte aligned, C-contiguous and writable is handed to the VM without a copy
(TVM requires that alignment, and the VM never writes its inputs); another is
copied once into an aligned buffer. Every output is copied out, so the arrays
returned never share memory with the VM or with an input.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np
import tvm_ffi

from forge_core.errors import ForgeError

ALIGNMENT = 64  # bytes: what TVM's kernels assume of every tensor


def _aligned(array: np.ndarray) -> bool:
    return array.ctypes.data % ALIGNMENT == 0


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` whose data starts on an ``ALIGNMENT``-byte boundary."""
    raw = np.empty(array.nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    copy = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(copy, array, casting="no")
    return copy


def to_device(array: np.ndarray, device: Any) -> Any:
    """``array`` as a VM argument on ``device`` (CPU: shared when aligned and writable, else one aligned copy).

    Bool and empty arrays, and any for another device, are copied into a tensor that TVM's runtime library
    allocates (what ``tvm.runtime.tensor`` calls, without importing ``tvm``): numpy before 1.25 (Debian 12's, on a
    board) exports no bool through DLPack ("DLPack only supports signed/unsigned integers, float and complex
    dtypes"), TVM's DLPack import refuses empty arrays' strides, and a GPU's memory is not numpy's.
    """
    if device.dlpack_device_type() != 1 or array.dtype.kind not in "iuf" or array.dtype.itemsize > 8 \
            or array.size == 0:
        return _copied_in(array, device)
    if not (array.flags.writeable and _aligned(array) and array.strides == _compact_strides(array)):
        array = aligned_copy(array)
    return tvm_ffi.from_dlpack(array)


@functools.cache
def _runtime_function(name: str) -> Any:
    """One of TVM's runtime library functions (``tvm.runtime._ffi_api``'s), through ``tvm_ffi``, looked up once."""
    return tvm_ffi.get_global_func(f"runtime.{name}")


def _copied_in(array: np.ndarray, device: Any) -> Any:
    """A tensor on ``device`` allocated by TVM's runtime library, ``array``'s elements copied into it."""
    tensor = _runtime_function("TVMTensorAllocWithScope")(
        tvm_ffi.Shape([int(d) for d in array.shape]), tvm_ffi.dtype(str(array.dtype)), device, None)
    if array.size:
        source = np.ascontiguousarray(array)
        _runtime_function("TVMTensorCopyFromBytes")(tensor, source.ctypes.data_as(ctypes.c_void_p), source.nbytes)
    return tensor


def _compact_strides(array: np.ndarray) -> tuple[int, ...]:
    """Row-major strides in bytes; numpy calls an array C-contiguous whatever its size-1 axes' strides, TVM not."""
    strides, step = [], array.itemsize
    for size in reversed(array.shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _to_numpy(tensor: Any) -> np.ndarray:
    try:
        return np.from_dlpack(tensor).copy()
    except (BufferError, TypeError, ValueError, RuntimeError):  # a dtype numpy's DLPack lacks, a GPU tensor
        return _copied_out(tensor)


def _copied_out(tensor: Any) -> np.ndarray:
    """A contiguous tensor's elements copied into numpy by TVM's runtime library, from any device (what
    ``tvm.runtime.Tensor.numpy`` calls, without importing ``tvm``; bool through numpy before 1.25's DLPack)."""
    try:
        dtype = np.dtype(str(tensor.dtype))
    except TypeError:  # bfloat16, float8...: numpy names them only through ml_dtypes, as TVM's own class does
        if hasattr(tensor, "numpy"):
            return tensor.numpy()
        raise ForgeError(f"Cannot copy a model output of dtype {tensor.dtype} to numpy") from None
    if not tensor.is_contiguous():
        raise ForgeError(f"Cannot copy a model output on {tensor.device} with strides to numpy")
    copy = np.empty(tuple(int(d) for d in tensor.shape), dtype)
    if copy.size:
        _runtime_function("TVMTensorCopyToBytes")(tensor, copy.ctypes.data_as(ctypes.c_void_p), copy.nbytes)
    return copy


def outputs_to_numpy(value: Any) -> list[np.ndarray]:
    """Flatten a VM result (a tensor, or nested tuples of them) into numpy arrays the caller owns."""
    if isinstance(value, tvm_ffi.Tensor):
        return [_to_numpy(value)]
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        flat: list[np.ndarray] = []
        for item in value:
            flat.extend(outputs_to_numpy(item))
        return flat
    if isinstance(value, (int, float, bool, np.generic)):
        return [np.asarray(value)]
    raise ForgeError(f"Unexpected model output of type {type(value).__name__}")
