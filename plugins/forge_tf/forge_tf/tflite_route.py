"""The direct route: a frozen function through TensorFlow's TFLite converter and TVM's TFLite importer.

TensorFlow and Keras have no Relax frontend in TVM 0.27; TFLite is the
closest format TVM reads. The converter runs with ``SELECT_TF_OPS`` and custom ops
allowed, so that a TensorFlow op without a TFLite builtin does not abort the
conversion but shows up as a ``Flex<Op>`` (or custom ``<Op>``) operator,
which the operator check then lists, counted, with every other operator TVM
lacks.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf
import tvm

from forge_core.errors import ModelImportError
from forge_core.ir.naming import rename_inputs, with_output_names
from forge_tf.console import captured_output, first_line
from forge_tf.frozen_function import FrozenFunction
from forge_tf.interface import rewrite_main
from forge_tf.operator_support import check_operators
from forge_tf.tflite_import import fixed_dynamic_dims, import_tflite
from forge_tf.tflite_model import TensorInfo, TFLiteModel, parse_tflite

logger = logging.getLogger("forge.tf")


def convert_to_tflite(frozen: FrozenFunction) -> TFLiteModel:
    """The TFLite flatbuffer of a frozen function (float, no optimization)."""
    try:
        with captured_output("the TFLite converter"):
            # Without trackable_obj the converter takes its path for frozen functions (and says so).
            converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen.function])
            # The function is frozen already; the converter's own freezing (convert_variables_to_constants_v2,
            # unlowered) would copy the whole graph once more to find no variable: 5 to 8 s on DenseNet-121 or
            # NASNet, a third of their conversion. It gets the frozen graph as that step returns it.
            converter._freeze_concrete_function = lambda: _frozen_graph(frozen)  # noqa: SLF001
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
            converter.allow_custom_ops = True
            buffer = converter.convert()
    except Exception as exc:  # noqa: BLE001 - ConverterError, ValueError...
        raise ModelImportError(
            f"TensorFlow's TFLite converter failed on {frozen.source}: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return parse_tflite(buffer, f"the TFLite conversion of {frozen.source}")


def _frozen_graph(frozen: FrozenFunction) -> tuple[Any, list[Any], list[Any], Any]:
    """What ``TFLiteFrozenGraphConverterV2._freeze_concrete_function`` returns, for a function without
    variables: its GraphDef, its (non-resource) input and output tensors, and the function."""
    function = frozen.function
    inputs = [tensor for tensor in function.inputs if tensor.dtype != tf.resource]
    return function.graph.as_graph_def(), inputs, list(function.outputs), function


def _base(name: str) -> str:
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def _match(wanted: list[str], found: list[TensorInfo], what: str, source: str) -> list[int]:
    """For each wanted tensor name, the position of the TFLite tensor of that name (else positional)."""
    if len(wanted) != len(found):
        raise ModelImportError(
            f"The TFLite conversion of {source} has {len(found)} {what}s, the function has {len(wanted)}"
        )
    positions = {_base(info.name): position for position, info in enumerate(found)}
    if all(_base(name) in positions for name in wanted):
        return [positions[_base(name)] for name in wanted]
    return list(range(len(wanted)))


def import_through_tflite(frozen: FrozenFunction, frontend: str) -> tvm.IRModule:
    """A Relax module of ``frozen``, inputs and outputs in its order and with its names.

    Raises:
        forge.UnsupportedOperatorError: Listing every operator TVM's TFLite
            importer lacks.
        forge.ModelImportError: The converter or the importer failed, or the
            importer fixed a dimension that was asked to stay dynamic.
    """
    tflite_model = convert_to_tflite(frozen)
    check_operators(tflite_model, frontend=f"{frontend} (TFLite route)")
    tflite_inputs, tflite_outputs = tflite_model.inputs, tflite_model.outputs
    input_order = _match([spec.name for spec in frozen.inputs], tflite_inputs, "input", frozen.source)
    output_order = _match(frozen.output_tensor_names, tflite_outputs, "output", frozen.source)
    shapes = {tflite_inputs[position].name: spec.shape
              for spec, position in zip(frozen.inputs, input_order) if spec.shape is not None}
    mod = import_tflite(tflite_model, shapes)
    fixed = fixed_dynamic_dims(mod, tflite_model) if frozen.is_dynamic else []
    if fixed:
        raise ModelImportError(
            f"the TFLite route fixed dimensions that should stay dynamic ({'; '.join(fixed)}): the TFLite graph "
            "or one of TVM's converters uses the size the flatbuffer stores"
        )
    mod = rewrite_main(mod, input_order=input_order, output_order=output_order)
    mod = rename_inputs(mod, [spec.name for spec in frozen.inputs])
    return with_output_names(mod, frozen.output_names)
