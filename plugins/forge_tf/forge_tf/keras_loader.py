"""``forge.from_keras``: a Keras 3 model to Forge's IRModule, fed NCHW (default) or NHWC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras

from forge_core.errors import ModelImportError, OptionTypeError
from forge_core.ir.module import IRModule
from forge_tf import layout as layouts
from forge_tf.frozen_function import freeze
from forge_tf.onnx_fallback import DEFAULT_ONNX_OPSET
from forge_tf.routes import import_function
from forge_tf.signature import InputSpec, apply_shapes, dtype_name, parse_shape, resolve_unknown_dims

LOADER = "from_keras"


def _declared_inputs(model: keras.Model) -> list[Any]:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return []
    return list(inputs or [])


def _input_specs(model: keras.Model, shape: Mapping[str, Any] | None, layout: str) -> list[InputSpec]:
    """The model's inputs in NHWC, the layout Keras computes in; ``shape`` is given in ``layout``."""
    if shape is not None and not isinstance(shape, Mapping):
        raise OptionTypeError(
            f"{LOADER}: shape must be a dict of input name to shape, e.g. {{'input_1': (1, 3, 224, 224)}}, "
            f"not {type(shape).__name__}"
        )
    given = {name: parse_shape(name, dims) for name, dims in (shape or {}).items()}
    if layout == "NCHW":
        given = {name: layouts.nchw_shape_to_nhwc(dims) if len(dims) == 4 else dims for name, dims in given.items()}
    declared = _declared_inputs(model)
    for tensor in declared:
        kind = "ragged" if getattr(tensor, "ragged", False) else "sparse" if getattr(tensor, "sparse", False) else None
        if kind is not None or str(tensor.dtype) == "string":
            raise ModelImportError(
                f"{LOADER}: input {str(tensor.name)!r} of model {model.name!r} is "
                f"{f'a {kind} tensor' if kind else 'a string tensor'}; Forge converts models whose inputs are dense "
                "numeric tensors (move the preprocessing out of the model)"
            )
    if declared:
        specs = [InputSpec(str(t.name), tuple(t.shape) if t.shape is not None else None, dtype_name(t.dtype))
                 for t in declared]
    elif given:
        specs = [InputSpec(name, dims, "float32") for name, dims in given.items()]
    else:
        raise ModelImportError(
            f"{LOADER}: model {model.name!r} declares no inputs (a subclassed model, or a Sequential model built "
            "without keras.Input); pass shape={'input_name': (1, ...)} to give them"
        )
    specs = apply_shapes(specs, given, LOADER)
    return resolve_unknown_dims(specs, given, LOADER)


def load_keras(
    model: Any,
    shape: Mapping[str, Sequence[int | None]] | None = None,
    layout: str = "NCHW",
    *,
    fallback_to_onnx: bool = True,
    onnx_opset: int = DEFAULT_ONNX_OPSET,
    fold_constants: bool = True,
    fold_batch_norms: bool = True,
) -> IRModule:
    """Convert a Keras model into a Forge IRModule. See :func:`forge.from_keras`."""
    if not isinstance(model, keras.Model):
        hint = " (use forge.from_tensorflow for a tf.function or SavedModel)" if hasattr(
            model, "get_concrete_function") or isinstance(model, (str, bytes)) else ""
        raise OptionTypeError(f"{LOADER} expects a keras.Model, not {type(model).__name__}{hint}")
    layouts.check_layout(layout, layouts.KERAS_LAYOUTS, LOADER)
    specs = _input_specs(model, shape, layout)
    single = len(specs) == 1

    def call(*tensors: Any) -> Any:
        return model(tensors[0] if single else list(tensors), training=False)

    frozen = freeze(call, specs, f"Keras model {model.name!r}", getattr(model, "output_names", None))
    mod = import_function(frozen, LOADER, fallback_to_onnx=fallback_to_onnx, onnx_opset=onnx_opset)
    if layout == "NCHW":
        # NCHW in and out, and NCHW inside: CPU convolution schedules are channels-first, and Keras's
        # channels-last convolutions, left as they are, ran 20 times slower (Xception 430 ms -> 22 ms).
        mod = layouts.convolutions_to_nchw(layouts.channels_first(mod))
    return IRModule(mod, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)
