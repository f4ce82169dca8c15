"""Schedule pass ``recurrent_kernels``: each recurrent kernel rebuilt for the target being compiled for.

The ONNX converter emits RNN/GRU/LSTM kernels (``converters/recurrent_kernel.py``)
for a CPU with AVX-512's registers and several cores, before any target is
known. At compile time this pass rebuilds a kernel whose best form differs:

* fewer accumulators per block where vectors take several registers (AVX2, NEON);
* no parallel region on a one-core target;
* GPU targets: one GPU thread runs the kernel (scalar loops), which the GPU
  pipeline requires (every kernel bound to threads). Correct, not fast.

The cell (what it computes) stays the same; only :class:`KernelOptions` change.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import tvm
from tvm import tirx

from forge_core.passes import PassContext, replace_functions
from forge_core.schedules.blocks import vector_unit
from forge_onnx.converters.recurrent_kernel import (
    ACCUMULATORS,
    CELL_ATTR,
    LANES,
    OPTIONS_ATTR,
    KernelOptions,
    RecurrentCell,
    build_kernel,
)

logger = logging.getLogger("forge.onnx")


def kernel_options(cell: RecurrentCell, built: KernelOptions, target: tvm.target.Target) -> KernelOptions:
    """The options for ``cell`` on ``target``, starting from those it was ``built`` with."""
    if target.kind.name != "llvm":
        return KernelOptions(accumulators=1, parallel=False, gpu=True)
    unit = vector_unit(target)
    registers_per_vector = max(1, LANES * tvm.DataType(cell.dtype).bits // unit.bits)
    accumulators = min(ACCUMULATORS, max(1, (unit.registers // 2) // registers_per_vector))
    cores = target.attrs.get("num-cores")
    parallel = built.parallel and not (cores is not None and int(cores) == 1)
    return KernelOptions(accumulators=accumulators, parallel=parallel, gpu=False)


def recurrent_kernels(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """``mod`` with every recurrent kernel whose options differ on ``context.target`` rebuilt."""
    if context.target is None:
        return mod
    updated = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or CELL_ATTR not in func.attrs:
            continue
        cell = RecurrentCell.from_json(str(func.attrs[CELL_ATTR]))
        built = KernelOptions(**json.loads(str(func.attrs[OPTIONS_ATTR])))
        options = kernel_options(cell, built, context.target)
        if options == built:
            continue
        logger.debug("recurrent kernel %s rebuilt for %s: %s", gv.name_hint, context.target.kind.name,
                     dataclasses.asdict(options))
        rebuilt = build_kernel(cell, options)
        for key in ("global_symbol", "op_pattern"):
            if key in func.attrs:
                rebuilt = rebuilt.with_attr(key, func.attrs[key])
        updated[gv] = rebuilt
    return replace_functions(mod, updated)
