"""Turning what a Relax VM returns into numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm

from forge_core.errors import ForgeError


def outputs_to_numpy(value: Any) -> list[np.ndarray]:
    """Flatten a VM result (a tensor, or nested tuples of them) into numpy arrays."""
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        flat: list[np.ndarray] = []
        for item in value:
            flat.extend(outputs_to_numpy(item))
        return flat
    if isinstance(value, (int, float, bool, np.generic)):
        return [np.asarray(value)]
    raise ForgeError(f"Unexpected model output of type {type(value).__name__}")
