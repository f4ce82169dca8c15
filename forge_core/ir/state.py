"""A stateful model's state: inputs whose next values the model returns, and where they start.

A streaming model converted with its state explicit (TFLite resource variables,
:mod:`forge_tf.resource_variables`) has one input per state variable and one
output ``<input>_next`` with its next value; the caller feeds each output back
as the next call's input. ``main`` records the values the state starts from,
which the source model assigned on its first call.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tvm

INITIAL_STATE_ATTR = "forge.initial_state"
"""Attribute of ``main``: state input name -> the value it starts from."""
NEXT_SUFFIX = "_next"
"""A state input ``x``'s next value is the output ``x_next``."""


def with_initial_state(mod: tvm.IRModule, values: Mapping[str, np.ndarray]) -> tvm.IRModule:
    """``mod`` with ``main`` recording where each state input starts."""
    if not values:
        return mod
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = mod["main"].with_attr(
        INITIAL_STATE_ATTR, {name: tvm.runtime.tensor(np.ascontiguousarray(value)) for name, value in values.items()})
    return updated


def initial_state(func: tvm.relax.Function) -> dict[str, np.ndarray]:
    """The state inputs ``func`` records and their starting values (empty for a stateless model)."""
    values = func.attrs.get(INITIAL_STATE_ATTR) if func.attrs is not None else None
    if values is None:
        return {}
    return {str(name): value.numpy() for name, value in values.items()}
