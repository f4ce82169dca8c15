"""TFLite operators that plugins convert: custom ops (MediaPipe's, a vendor's) and builtins they override.

A plugin registers a converter for the ``"tflite"`` frontend through the core
hook ``register_converters``::

    @hookimpl
    def register_converters(register):
        register("tflite", "Convolution2DTransposeBias", convert)

``op_type`` is the custom operator's ``custom_code`` (or a builtin's name,
``"CONV_2D"``, to replace TVM's conversion of it); ``domain`` stays ``""``:
TFLite has none. The converter is called as::

    converter(bb, inputs, options, context) -> relax.Expr

``bb`` is the ``relax.BlockBuilder`` being filled; ``inputs`` the operator's
inputs as Relax expressions (a constant tensor as a ``relax.const``; ``None``
for an omitted optional input); ``options`` the operator's ``custom_options``
bytes for a custom op (``b""`` when it has none; MediaPipe's ops store a C
struct there, a flexbuffer elsewhere), or its builtin options table for a
builtin; ``context`` a :class:`TFLiteConverterContext`. Return one
expression, or a ``relax.Tuple`` for an operator with several outputs. Raise
an exception naming what is unsupported; the importer reports it with the
operator, its first output tensor and the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from forge_core.plugin_manager import Converter, get_plugin_manager

FRONTEND = "tflite"


@dataclass(frozen=True)
class TFLiteConverterContext:
    """What a TFLite converter knows about the operator beside its inputs and options."""

    op_type: str
    """The custom code (``"Convolution2DTransposeBias"``) or builtin name."""
    node: str
    """The name of the operator's first output tensor (TFLite operators have no names)."""
    constants: tuple[np.ndarray | None, ...]
    """Each input's value where it is a constant of the model, or computed from one at import (float16 weights
    behind a ``DEQUANTIZE``, a ``DENSIFY``'s dense weights), else None."""
    output_shapes: tuple[tuple[int, ...], ...]
    """Each output's shape as the flatbuffer declares it (a dynamic batch is stored as 1)."""
    output_dtypes: tuple[str, ...]
    """Each output's dtype as the flatbuffer declares it."""
    plugin: str
    """The plugin that registered the converter."""


def plugin_converters() -> dict[str, Converter]:
    """The converters plugins registered for the ``"tflite"`` frontend, by op type."""
    return {op_type: converter for (_, op_type), converter in get_plugin_manager().converters(FRONTEND).items()}


def call_plugin_converter(converter: Converter, bb: Any, inputs: list[Any], options: Any,
                          context: TFLiteConverterContext) -> Any:
    """Run a plugin's converter; its failure names the plugin (the importer adds the op and tensor)."""
    try:
        return converter.convert(bb, inputs, options, context)
    except Exception as exc:  # noqa: BLE001 - a plugin's converter fails with anything
        raise PluginConverterError(
            f"the converter of plugin {converter.plugin!r} failed: {type(exc).__name__}: {exc}") from exc


class PluginConverterError(Exception):
    """A plugin's TFLite converter raised; the message names the plugin."""
