"""Every converter module of this package, in one table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge_core.errors import PluginDefinitionError
from forge_onnx.converters import (
    activations,
    attention,
    elementwise,
    indexing,
    losses,
    microsoft,
    microsoft_bert,
    ml,
    normalization,
    qoperator,
    quantized,
    ranges,
    recurrent,
    reductions,
    resize,
    sequences,
    shapes,
    signal,
    unique,
)

MODULES = (
    activations, attention, elementwise, indexing, losses, normalization, quantized, ranges, recurrent, reductions, resize,
    sequences, shapes, signal, unique,
)


def all_converters() -> dict[tuple[str, str], Callable[..., Any]]:
    """Every converter of this package by ``(domain, op_type)``; ``""`` is ONNX's default domain."""
    table: dict[tuple[str, str], Callable[..., Any]] = {}

    def add(domain: str, op_type: str, convert: Callable[..., Any]) -> None:
        if (domain, op_type) in table:
            raise PluginDefinitionError(f"Two converter modules define {domain or 'ai.onnx'}.{op_type}")
        table[(domain, op_type)] = convert

    for module in MODULES:
        for op_type, convert in module.CONVERTERS.items():
            add("", op_type, convert)
    for op_type, convert in {**microsoft.CONVERTERS, **microsoft_bert.CONVERTERS,
                             **indexing.MICROSOFT_CONVERTERS, **qoperator.CONVERTERS}.items():
        add(microsoft.DOMAIN, op_type, convert)
    for op_type, convert in ml.CONVERTERS.items():
        add(ml.DOMAIN, op_type, convert)
    for op_type, convert in microsoft.DEFAULT_DOMAIN_CONVERTERS.items():
        add("", op_type, convert)
    return table
