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

    Bool and empty arrays, and any for another device, go through ``tvm.runtime.tensor`` (imported then): numpy
    before 1.25 (Debian 12's, on a board) exports no bool through DLPack ("DLPack only supports signed/unsigned
    integers, float and complex dtypes"), and TVM's DLPack import refuses empty arrays' strides.
    """
    if device.dlpack_device_type() != 1 or array.dtype.kind not in "iuf" or array.dtype.itemsize > 8 \
            or array.size == 0:
        from forge_core.tvm_import import import_tvm

        return import_tvm().runtime.tensor(array, device)
    if not (array.flags.writeable and _aligned(array) and array.strides == _compact_strides(array)):
        array = aligned_copy(array)
    return tvm_ffi.from_dlpack(array)


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
        if hasattr(tensor, "numpy"):  # tvm.runtime.Tensor (a GPU artifact's: the runtime imported tvm for it)
            return tensor.numpy()
        return _copy_out(tensor)


def _copy_out(tensor: Any) -> np.ndarray:
    """A contiguous CPU tensor's elements copied by address (bool through numpy before 1.25's DLPack)."""
    if str(tensor.device).split(":")[0] != "cpu" or not tensor.is_contiguous():
        raise ForgeError(f"Cannot copy a model output of dtype {tensor.dtype} on {tensor.device} to numpy")
    dtype = np.dtype(str(tensor.dtype))
    shape = tuple(int(d) for d in tensor.shape)
    count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * count).from_address(tensor.data_ptr())) if count else \
        np.empty(0, np.uint8)
    return raw.view(dtype).reshape(shape).copy()


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
