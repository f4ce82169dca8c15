"""Forge's own ONNX converters, and the context every ONNX converter receives.

Converters reach the importer through the ``register_converters`` hook (see
``forge_core.hookspecs``), the same way a third-party plugin adds one: this
plugin registers the ones in this package, and a registered converter takes
precedence over TVM's conversion of the same operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConverterContext:
    """What a converter knows about the node beside its inputs and attributes."""

    opset: int
    """The model's opset of the default domain."""
    node: str
    """The node's name."""
    domain: str
    """The node's domain (``""`` for ONNX's default one)."""
    importer: Any
    """TVM's importer, for converters that need the graph's other values (rarely)."""
