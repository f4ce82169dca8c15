"""Which TFLite operators TVM's importer converts, checked before conversion starts.

The check reads the converter table of TVM's Relax TFLite frontend
(``OperatorConverter.convert_map`` in ``tvm/relax/frontend/tflite``) and its
list of operators supported on quantized tensors, and raises one
:class:`~forge_core.errors.UnsupportedOperatorError` listing every operator
the model uses that the table lacks, with its count and one example (the
name of the operator's first output tensor: TFLite operators have no names).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from tflite.BuiltinOperator import BuiltinOperator
from tvm.relax.frontend.tflite.tflite_frontend import ExprTable, OperatorConverter

from forge_core.errors import OperatorConversionError, UnsupportedOperatorError
from forge_tf.custom_ops import plugin_converters
from forge_tf.hybrid import HYBRID_OPS, is_hybrid_op
from forge_tf.resource_variables import RESOURCE_OPS
from forge_tf.tflite_model import TFLiteModel, tensor_name

_BUILTIN_NAMES = {value: name for name, value in vars(BuiltinOperator).items() if isinstance(value, int)}

# The one custom operator TVM's importer converts (as DETECTION_POSTPROCESS).
_SUPPORTED_CUSTOM = {"TFLite_Detection_PostProcess"}

FLEX_NOTE = (
    "Flex* operators are TensorFlow ops that have no TFLite builtin; TVM's TFLite importer cannot run them."
)


def supported_operators() -> set[str]:
    """The TFLite builtin operator names TVM's importer converts."""
    return set(OperatorConverter(None, None, ExprTable(), None).convert_map)


def operator_code(model: Any, op: Any) -> str:
    """The operator's builtin name (``"CONV_2D"``), or its custom code (``"FlexErf"``)."""
    code_entry = model.OperatorCodes(op.OpcodeIndex())
    code = max(code_entry.DeprecatedBuiltinCode(), code_entry.BuiltinCode())
    if code == BuiltinOperator.CUSTOM:
        custom = code_entry.CustomCode()
        return custom.decode("utf-8") if custom is not None else "CUSTOM"
    return _BUILTIN_NAMES.get(code, f"BUILTIN_{code}")


def _example_name(subgraph: Any, op: Any, index: int) -> str:
    if op.OutputsLength():
        output = int(op.Outputs(0))
        if output >= 0:
            return tensor_name(subgraph, output)
    return f"operator {index}"


# Ops that only move values: on quantized tensors whose outputs have their data input's scale and zero point,
# TVM's float converter moves the integers exactly (the converter writes an int8 embedding table as GATHER +
# DEQUANTIZE, a streaming model's state as STRIDED_SLICE and SPLIT_V of int8 tensors). The position of the data
# input, for the ops where it is not the first.
MOVES_QUANTIZED_VALUES = frozenset({"GATHER", "STRIDED_SLICE", "SLICE", "SPLIT", "SPLIT_V", "TRANSPOSE"})
_DATA_INPUT = {"SPLIT": 1}


def _same_quantization(source: Any, outputs: list[Any]) -> bool:
    def params(wrapper: Any) -> tuple[Any, ...] | None:
        q = wrapper.qnn_params
        if q is None:
            return None
        return (wrapper.tensor.Type(), tuple(np.ravel(q["scale"].value.numpy())),
                tuple(np.ravel(q["zero_point"].value.numpy())))

    want = params(source)
    return want is not None and len(outputs) >= 1 and all(params(output) == want for output in outputs)


def _quantization_issue(converter: OperatorConverter, op: Any, code: str) -> str | None:
    """Why TVM rejects a supported op on quantized tensors, as TVM's own check decides, or None."""
    if is_hybrid_op(converter.model, converter.subgraph, op, code):
        return None  # its int8 weights are read as floats (forge_tf.hybrid)
    if code in RESOURCE_OPS:
        return None  # they move stored values, quantized or not (forge_tf.resource_variables)
    inputs = converter.get_input_tensors(op)
    outputs = converter.get_output_tensors(op)
    quantized_in = sum(1 for t in inputs[:1] if t.qnn_params is not None)
    quantized_weights = sum(1 for t in inputs[1:] if t.qnn_params is not None)
    quantized_out = sum(1 for t in outputs if t.qnn_params is not None)
    if quantized_in == 0 and quantized_out == 0 and quantized_weights > 0:
        return "dynamic-range quantized"
    if quantized_in + quantized_weights + quantized_out > 0 and code not in OperatorConverter._SUPPORTED_QUANTIZED_OPS:
        data = _DATA_INPUT.get(code, 0)
        if code in MOVES_QUANTIZED_VALUES and len(inputs) > data and _same_quantization(inputs[data], outputs):
            return None
        return "quantized"
    return None


def check_operators(tflite_model: TFLiteModel, frontend: str = "tflite") -> None:
    """Raise one :class:`UnsupportedOperatorError` listing every operator TVM's importer cannot convert."""
    model = tflite_model.model
    supplied = plugin_converters()
    known: set[str] | None = None
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        converter = OperatorConverter(model, subgraph, ExprTable(), None)
        if known is None:
            known = set(converter.convert_map)
        for index in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(index)
            code = operator_code(model, op)
            if code in _SUPPORTED_CUSTOM or code in supplied:
                continue
            if code not in known:
                key = code
            else:
                try:
                    issue = _quantization_issue(converter, op, code)
                except Exception as exc:  # noqa: BLE001 - TVM's reading of quantization fails with anything
                    raise OperatorConversionError(frontend, code, _example_name(subgraph, op, index), exc) from exc
                if issue is None:
                    continue
                key = f"{code} ({issue})"
            counts[key] += 1
            examples.setdefault(key, _example_name(subgraph, op, index))
    if counts:
        notes = []
        if any(key.startswith("Flex") for key in counts):
            notes.append(FLEX_NOTE)
        custom = sorted(key for key in counts if key not in _BUILTIN_NAMES.values() and " (" not in key
                        and not key.startswith("Flex"))
        if custom:
            notes.append(f"Custom operators ({', '.join(custom)}) are the model's own, not TFLite builtins: a plugin "
                         "can supply each, a package on the 'forge' entry-point group whose register_converters "
                         "hook calls register(\"tflite\", custom_code, converter) (the README's Custom operators; "
                         "examples/forge_mediapipe implements Convolution2DTransposeBias; `forge plugins` lists "
                         "the installed ones).")
        if any("(dynamic-range quantized)" in key for key in counts):
            notes.append("Dynamic-range quantized operators (float activations, int8 weights) are supported in "
                         f"{', '.join(sorted(HYBRID_OPS))} only; convert without dynamic-range quantization, or "
                         "use full-integer quantization with a representative dataset.")
        raise UnsupportedOperatorError(frontend, {k: (n, examples[k]) for k, n in counts.items()}, "\n".join(notes))
