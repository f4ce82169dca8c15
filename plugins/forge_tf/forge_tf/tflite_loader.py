"""``forge.from_tflite``: a TFLite flatbuffer to Forge's IRModule through TVM's Relax TFLite importer."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import tvm

from forge_core.errors import ForgeError, ModelImportError, OptionTypeError, UnsupportedOperatorError
from forge_core.ir.module import IRModule
from forge_core.ir.naming import rename_inputs, with_output_names
from forge_core.ir.state import with_initial_state
from forge_tf import onnx_fallback
from forge_tf.console import one_line
from forge_tf.operator_support import check_operators
from forge_tf.signature import Dim, InputSpec, dtype_name, parse_shape
from forge_tf.tflite_import import fixed_dynamic_dims, import_tflite
from forge_tf.tflite_model import TFLiteModel, read_tflite

logger = logging.getLogger("forge.tf")

LOADER = "from_tflite"


def _check_names(option: str, given: Mapping[str, Any], model: TFLiteModel) -> None:
    names = [info.name for info in model.inputs]
    for name in given:
        if name not in names:
            raise ModelImportError(
                f"{LOADER}: {option} names input {name!r}, which the model does not have. Inputs: {', '.join(names)}"
            )


def _input_specs(model: TFLiteModel, shape_dict: Mapping[str, Any] | None,
                 dtype_dict: Mapping[str, str] | None) -> list[InputSpec]:
    for option, value in (("shape_dict", shape_dict), ("dtype_dict", dtype_dict)):
        if value is not None and not isinstance(value, Mapping):
            raise OptionTypeError(f"{LOADER}: {option} must be a dict of input name to "
                                  f"{'shape' if option == 'shape_dict' else 'dtype'}, not {type(value).__name__}")
    shape_dict, dtype_dict = dict(shape_dict or {}), dict(dtype_dict or {})
    _check_names("shape_dict", shape_dict, model)
    _check_names("dtype_dict", dtype_dict, model)
    specs = []
    for info in model.inputs:
        shape: tuple[Dim, ...] = info.shape
        if info.name in shape_dict:
            shape = parse_shape(info.name, shape_dict[info.name])
            if len(shape) != len(info.shape):
                raise ModelImportError(
                    f"{LOADER}: shape_dict for input {info.name!r} has rank {len(shape)}; the model's input has "
                    f"rank {len(info.shape)}: {info.shape}"
                )
        dtype = dtype_name(dtype_dict[info.name]) if info.name in dtype_dict else info.dtype
        if dtype != info.dtype:
            # TVM's converters read every other tensor's type, and quantization parameters, from the flatbuffer:
            # an input of another type made them compute with mismatched types or parameters.
            raise ModelImportError(
                f"{LOADER}: dtype_dict gives input {info.name!r} the type {dtype}; the model declares {info.dtype}, "
                "and a TFLite model's types are fixed (dtype_dict may only repeat them)"
            )
        specs.append(InputSpec(info.name, shape, dtype))
    return specs


def _through_tflite(model: TFLiteModel, specs: Sequence[InputSpec]) -> tvm.IRModule:
    check_operators(model)
    mod = import_tflite(model, {s.name: s.shape for s in specs}, {s.name: s.dtype for s in specs})
    fixed = fixed_dynamic_dims(mod, model) if any(s.dynamic_axes for s in specs) else []
    if fixed:
        raise ModelImportError(
            f"TVM's TFLite importer fixed dimensions that should stay dynamic ({'; '.join(fixed)}): the TFLite "
            "graph or one of TVM's converters uses the size the flatbuffer stores"
        )
    return mod


def _explicit_state(mod: tvm.IRModule, tflite_model: TFLiteModel, output_names: list[str]) -> tvm.IRModule:
    """The state inputs named after their variables, their outputs ``<variable>_next``, their starting values
    recorded (:mod:`forge_tf.resource_variables`)."""
    state, inputs = tflite_model.state, tflite_model.inputs
    own_inputs = len(inputs) - len(state)
    own_outputs = len(output_names) - len(state)
    input_names = [info.name for info in inputs[:own_inputs]] + [v.name for v in state]
    mod = rename_inputs(mod, input_names)
    mod = with_output_names(mod, output_names[:own_outputs] + [v.output_name for v in state])
    starts = {}
    for variable, info in zip(state, inputs[own_inputs:]):
        if variable.initial is None:
            raise ModelImportError(
                f"{LOADER}: resource variable {variable.name!r} is read before it is assigned and no CALL_ONCE "
                "init assigns it a constant: its first value is unknown (TFLite's interpreter fails on such a read)"
            )
        if variable.initial.shape != info.shape or str(variable.initial.dtype) != info.dtype:
            raise ModelImportError(
                f"{LOADER}: resource variable {variable.name!r} starts as a {variable.initial.dtype} "
                f"{variable.initial.shape} value and is read as {info.dtype} {info.shape}"
            )
        starts[variable.name] = variable.initial
    logger.info("%s: the model keeps state in %d resource variable(s), now explicit: input %s, fed back from "
                "output %s; they start at IRModule.initial_state", LOADER, len(state),
                ", ".join(v.name for v in state), ", ".join(v.output_name for v in state))
    return with_initial_state(mod, starts)


def load_tflite(
    model: Any,
    shape_dict: Mapping[str, Sequence[int | None]] | None = None,
    dtype_dict: Mapping[str, str] | None = None,
    *,
    fallback_to_onnx: bool = True,
    onnx_opset: int = onnx_fallback.DEFAULT_ONNX_OPSET,
    fold_constants: bool = True,
    fold_batch_norms: bool = True,
) -> IRModule:
    """Convert a TFLite model into a Forge IRModule. See :func:`forge.from_tflite`."""
    tflite_model = read_tflite(model)
    specs = _input_specs(tflite_model, shape_dict, dtype_dict)
    dynamic = any(spec.dynamic_axes for spec in specs)
    output_names = [info.name for info in tflite_model.outputs]
    try:
        mod = _through_tflite(tflite_model, specs)
    except ForgeError as direct_error:
        # Only a dynamic shape the importer cannot keep falls back: TVM's importer is the reference for
        # everything else (quantized models included), and an unsupported operator is reported as such.
        if not (dynamic and fallback_to_onnx) or isinstance(direct_error, UnsupportedOperatorError):
            raise
        try:
            onnx_model = onnx_fallback.onnx_from_tflite(tflite_model, onnx_opset)
            mod = onnx_fallback.import_through_onnx(onnx_model, specs, LOADER)
        except Exception as onnx_error:  # noqa: BLE001 - report both routes whatever failed
            raise ModelImportError(
                f"{LOADER}: both routes failed.\nTVM's TFLite importer: {one_line(direct_error)}\n"
                f"ONNX route (tf2onnx): {one_line(onnx_error)}"
            ) from onnx_error
        logger.warning("%s: loaded through tf2onnx and ONNX, because TVM's TFLite importer could not keep the "
                       "dynamic shape: %s", LOADER, one_line(direct_error))
    else:
        logger.info("%s: loaded %d operators through TVM's TFLite importer", LOADER,
                    tflite_model.subgraph.OperatorsLength())
    mod = with_output_names(mod, output_names)
    if tflite_model.state:
        mod = _explicit_state(mod, tflite_model, output_names)
    ir = IRModule(mod, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)
    return ir.with_state(is_quantized=True) if tflite_model.is_quantized else ir

