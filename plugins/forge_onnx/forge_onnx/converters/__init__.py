"""Forge's own ONNX converters, and the context every ONNX converter receives.

Converters reach the importer through the ``register_converters`` hook (see
``forge_core.hookspecs``), the same way a third-party plugin adds one: this
plugin registers the ones in this package, and a registered converter takes
precedence over TVM's conversion of the same operator.

The ``"onnx"`` frontend's converter contract (what ``register(frontend="onnx",
op_type, converter, domain=...)`` of ``register_converters`` means here)::

    converter(bb, inputs, attrs, context) -> relax.Expr

``bb`` is the ``relax.BlockBuilder`` being filled, ``inputs`` the node's
inputs as Relax expressions (``None`` for an omitted optional input),
``attrs`` the node's attributes as Python values, and ``context`` a
:class:`ConverterContext` (``opset``, ``node`` name, ``domain``...). Return
one expression, or a ``relax.Tuple`` for a node with several outputs. Raise an
exception naming what is unsupported; the importer reports it with the node's
name and op (:class:`forge_core.errors.OperatorConversionError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    raw_attrs: dict[str, Any] = field(default_factory=dict)
    """The attributes as TVM's converters expect them (with TVM's bookkeeping entries)."""

    def branch_taken(self) -> Any:
        """None at the graph's top level; in an If branch, a bool scalar tensor true when the branch runs.

        TVM's importer emits a branch's bindings outside the If, so they run whichever branch is taken: a
        converter that checks a value at run time guards the check with this.
        """
        return self.importer.branch_taken()

    @property
    def outputs(self) -> int:
        """How many outputs the node has."""
        return int(self.raw_attrs.get("tvm_custom", {}).get("num_outputs", 1))

    def tvm_convert(self, op_type: str, inputs: list[Any], attrs: dict[str, Any] | None = None) -> Any:
        """Convert with TVM's own converter for ``op_type``: for cases a Forge converter leaves to it.

        ``attrs`` replaces the node's attributes (TVM's bookkeeping entries are kept).
        """
        from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

        convert = _get_convert_map()[op_type].get_converter(self.opset)
        given = self.raw_attrs if attrs is None else {**attrs, "tvm_custom": self.raw_attrs.get("tvm_custom", {})}
        return convert(self.importer.bb, inputs, given, [self.importer._nodes, self.importer._params])


def constant_value(value: Any) -> Any:
    """A Relax constant's value as a numpy array; None for any other expression."""
    import tvm

    return value.value.numpy() if isinstance(value, tvm.ir.GenericConst) else None


def attr_text(value: Any, default: str = "") -> str:
    """A string attribute as a ``str`` (TVM's importer gives bytes), ``default`` when absent."""
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)
