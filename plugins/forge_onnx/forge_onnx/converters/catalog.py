"""Every converter module of this package, in one table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge_onnx.converters import (
    activations,
    attention,
    elementwise,
    losses,
    normalization,
    quantized,
    ranges,
    recurrent,
    reductions,
    resize,
    sequences,
    shapes,
    unique,
)

MODULES = (
    activations, attention, elementwise, losses, normalization, quantized, ranges, recurrent, reductions, resize,
    sequences, shapes, unique,
)


def all_converters() -> dict[str, Callable[..., Any]]:
    table: dict[str, Callable[..., Any]] = {}
    for module in MODULES:
        for op_type, convert in module.CONVERTERS.items():
            if op_type in table:
                raise RuntimeError(f"Two converter modules define {op_type}")
            table[op_type] = convert
    return table
