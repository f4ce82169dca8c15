"""Built-in plugin: the module transforms users run, ``set_batch_size`` and ``split_tensors``.

They are the passes behind ``IRModule.set_batch_size()`` and
``IRModule.split_tensors()``; ``ir.apply_pass("set_batch_size", batch_size=8)``
runs the same code.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm

from forge_core.errors import OptionError
from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext
from forge_core.transforms import batch, split


def set_batch_size(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Set the batch (each input's leading dimension) to ``batch_size``, rewriting shapes fixed in the model."""
    if "batch_size" not in context.options:
        raise OptionError("set_batch_size needs the option batch_size, e.g. apply_pass('set_batch_size', batch_size=8)")
    return batch.set_batch_size(mod, context.options["batch_size"], context.params.keys())


def split_tensors(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Split each convolution's weight in two along its output channels; concatenate the two results."""
    return split.split_tensors(mod)[0]


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    register("set_batch_size", set_batch_size, stage="transform",
             description="Set the batch size of the inputs and of every shape after them")
    register("split_tensors", split_tensors, stage="transform",
             description="Split each convolution's weight in two along its output channels",
             sets_flags={"is_split_tensors": True}, discards_calibration=True)
