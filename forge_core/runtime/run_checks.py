"""The run-time checks a compiled model makes (an index in range, a size it can compute at), as a function of
Forge's runtime.

A converter writes a check as Relax's ``assert_op`` (its message begins with
:data:`~forge_core.runtime.signature.RUN_TIME_CHECK`). TVM's VM calls the global function
``relax.run.assert_op`` for it, which TVM registers in Python, in ``tvm.relax``: a process with TVM's runtime
library alone (Forge's light runtime, a board) has no such function, and an artifact holding a check failed
to run at all ("Cannot find ffi::Function relax.run.assert_op"). The compiler therefore writes each check as a
call of :data:`ASSERT_FUNCTION`, which this module registers wherever Forge's runtime is imported.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm_ffi

from forge_core.errors import InputError, MalformedDataError
from forge_core.runtime.outputs import _to_numpy

ASSERT_FUNCTION = "forge.run.assert_op"
"""The global function a compiled check calls: ``(condition, format, *values)``, as ``relax.run.assert_op``."""


def _render(value: Any) -> str:
    """A check's value in its message: a tensor's numbers (a scalar as one number), a shape as a tuple."""
    if isinstance(value, tvm_ffi.Shape):
        return str(tuple(int(d) for d in value))
    if isinstance(value, tvm_ffi.Tensor):
        return str(_to_numpy(value))  # copied from the device (a CUDA artifact's checks run on the GPU)
    return str(value)


def _condition(value: Any) -> bool:
    if isinstance(value, (bool, int, np.bool_)):
        return bool(value)
    array = _to_numpy(value)
    if array.dtype != np.bool_ or array.shape != ():
        raise MalformedDataError(f"a run-time check's condition must be a bool scalar, given {array.dtype} "
                                 f"{array.shape}")
    return bool(array)


def assert_op(condition: Any, format_string: str, *values: Any) -> None:
    """Raise :class:`~forge_core.errors.InputError` with the formatted message unless ``condition`` holds (the
    runtime names the inputs: :func:`~forge_core.runtime.signature.run_error`)."""
    if _condition(condition):
        return
    rendered = [_render(v) for v in values]
    if format_string:
        raise InputError(str(format_string).format(*rendered))
    raise InputError(", ".join(rendered) or "a run-time check failed")


if tvm_ffi.get_global_func(ASSERT_FUNCTION, allow_missing=True) is None:
    tvm_ffi.register_global_func(ASSERT_FUNCTION, assert_op)
