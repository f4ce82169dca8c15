"""Every TensorFlow source becomes a frozen concrete function: the one thing both routes convert.

A Keras model, a GraphDef, a SavedModel's signature or a ``tf.function`` is
traced with the input signature Forge settled on (:class:`InputSpec`), and
its variables are folded into constants. The TFLite converter and tf2onnx
then see the same graph, with the same input and output order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from forge_core.errors import ForgeError, ModelImportError
from forge_tf.console import captured_output, first_line
from forge_tf.signature import InputSpec


# Ops that update a variable: a model holding them computes something else at each call.
_ASSIGN_OPS = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign", "AssignAdd",
               "AssignSub", "ResourceScatterUpdate", "ResourceScatterAdd"}


@dataclass(frozen=True)
class FrozenFunction:
    """A concrete function without variables, with the names Forge gives its inputs and outputs."""

    function: Any
    """The frozen ``ConcreteFunction``: ``function.inputs`` and ``function.outputs`` in Forge's order."""
    inputs: list[InputSpec]
    output_names: list[str]
    source: str
    """What it came from, for messages: ``"Keras model 'net'"``, ``"GraphDef"``..."""

    @property
    def is_dynamic(self) -> bool:
        return any(spec.dynamic_axes for spec in self.inputs)

    @property
    def graph_def(self) -> Any:
        return self.function.graph.as_graph_def()

    @property
    def input_tensor_names(self) -> list[str]:
        return [tensor.name for tensor in self.function.inputs]

    @property
    def output_tensor_names(self) -> list[str]:
        return [tensor.name for tensor in self.function.outputs]


def tensor_specs(specs: Sequence[InputSpec]) -> list[Any]:
    return [tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype), name=spec.name) for spec in specs]


def output_names_of(structure: Any, default: Sequence[str] | None = None) -> list[str]:
    """Output names: the keys of a flat dict of outputs, else ``default`` when it fits, else ``output_<i>``."""
    flat = [leaf for leaf in tf.nest.flatten(structure) if leaf is not None]
    if isinstance(structure, dict) and len(structure) == len(flat):
        # tf.nest flattens a dict in sorted key order.
        return [str(key) for key in sorted(structure)]
    if default is not None and len(default) == len(flat):
        return [str(name) for name in default]
    return [f"output_{i}" for i in range(len(flat))]


def freeze(
    call: Callable[..., Any],
    specs: Sequence[InputSpec],
    source: str,
    output_names: Sequence[str] | None = None,
) -> FrozenFunction:
    """Trace ``call(*inputs)`` with ``specs`` and fold its variables into constants.

    Args:
        call: Takes one tensor per spec, positionally; returns a tensor or a
            nest (list, tuple, dict) of tensors.
        specs: The input signature; None dimensions stay dynamic.
        source: What is converted, for messages.
        output_names: Names for the outputs when they are not a dict.

    Raises:
        forge.ModelImportError: Tracing or freezing failed (e.g. a shape the
            model cannot take); the message shows TensorFlow's reason.
    """
    try:
        with captured_output(f"tracing {source}"):
            traced = tf.function(call, autograph=False).get_concrete_function(*tensor_specs(specs))
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - tracing raises TypeError, ValueError, InvalidArgumentError...
        raise ModelImportError(
            f"Tracing {source} with inputs {_describe(specs)} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    assigning = [op.name for op in traced.graph.get_operations() if op.type in _ASSIGN_OPS]
    if assigning:
        raise ModelImportError(
            f"{source} updates variables when it runs ({len(assigning)} assignment"
            f"{'s' if len(assigning) > 1 else ''}, e.g. {assigning[0]!r}): a stateful layer (an RNN with "
            "stateful=True) or one that assigns in call. Forge converts stateless models, whose variables are "
            "frozen into constants"
        )
    try:
        with captured_output(f"freezing {source}"):
            frozen = convert_variables_to_constants_v2(traced)
    except Exception as exc:  # noqa: BLE001 - freezing raises ValueError, InvalidArgumentError...
        raise ModelImportError(f"Freezing the variables of {source} failed: {type(exc).__name__}: "
                               f"{first_line(exc)}") from exc
    names = output_names_of(traced.structured_outputs, output_names)
    if len(names) != len(frozen.outputs):
        names = [f"output_{i}" for i in range(len(frozen.outputs))]
    return FrozenFunction(frozen, list(specs), names, source)


def _describe(specs: Sequence[InputSpec]) -> str:
    return ", ".join(
        f"{spec.name}: ({', '.join('None' if d is None else str(d) for d in spec.shape or ())}) {spec.dtype}"
        for spec in specs
    )
