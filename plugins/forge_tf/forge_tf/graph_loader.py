"""``forge.from_tensorflow``: a frozen GraphDef, a SavedModel or a tf.function to Forge's IRModule.

Each source becomes a frozen concrete function (:mod:`forge_tf.frozen_function`)
with named inputs and outputs, then goes through :mod:`forge_tf.routes`:

* a ``GraphDef`` (frozen: its variables are constants), or a path to a binary
  ``.pb`` file holding one: inputs are its ``Placeholder`` nodes, in graph
  order; outputs are ``outputs`` (node or tensor names), else the last node;
* a SavedModel directory: the signature ``signature_key`` (default
  ``serving_default``, or the only one); inputs and outputs are the
  signature's keys, and ``outputs`` selects some of them;
* a ``tf.function`` or a concrete function: inputs from its input signature
  (or from ``shape``, float32, for a tf.function without one); outputs are
  ``output_0``... or the keys of a dict it returns.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
from google.protobuf.message import DecodeError

from forge_core.errors import ModelImportError, OptionTypeError, PathNotFoundError
from forge_core.ir.module import IRModule
from forge_tf import layout as layouts
from forge_tf.console import captured_output, first_line
from forge_tf.frozen_function import FrozenFunction, freeze
from forge_tf.onnx_fallback import DEFAULT_ONNX_OPSET
from forge_tf.routes import import_function
from forge_tf.signature import InputSpec, apply_shapes, dtype_name, parse_shape, resolve_unknown_dims

LOADER = "from_tensorflow"

_VARIABLE_OPS = {"VariableV2", "Variable", "VarHandleOp", "ReadVariableOp", "AssignVariableOp"}


def _base(name: str) -> str:
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def _tensor_name(name: str) -> str:
    return name if _base(name) != name else f"{name}:0"


def _settle(specs: Sequence[InputSpec], shape: Mapping[str, Any] | None) -> list[InputSpec]:
    return resolve_unknown_dims(apply_shapes(specs, shape, LOADER), shape, LOADER)


# -- GraphDef ----------------------------------------------------------------


def _placeholder_spec(node: Any) -> InputSpec:
    dtype = dtype_name(tf.as_dtype(node.attr["dtype"].type))
    shape_proto = node.attr["shape"].shape if "shape" in node.attr else None
    if shape_proto is None or shape_proto.unknown_rank:
        return InputSpec(node.name, None, dtype)
    return InputSpec(node.name, tuple(None if d.size < 0 else int(d.size) for d in shape_proto.dim), dtype)


def _graph_def_function(graph_def: Any, shape: Mapping[str, Any] | None, outputs: Sequence[str] | None,
                        source: str) -> FrozenFunction:
    variables = sorted({node.op for node in graph_def.node if node.op in _VARIABLE_OPS})
    if variables:
        raise ModelImportError(
            f"{LOADER}: the GraphDef holds variables ({', '.join(variables)} nodes); freeze it first "
            "(tf.compat.v1.graph_util.convert_variables_to_constants, or convert_variables_to_constants_v2 "
            "for a concrete function)"
        )
    nodes = {node.name for node in graph_def.node}
    if not nodes:
        raise ModelImportError(f"{LOADER}: the GraphDef has no nodes")
    specs = _settle([_placeholder_spec(n) for n in graph_def.node if n.op == "Placeholder"], shape)
    fetches = [_tensor_name(name) for name in (outputs or [graph_def.node[-1].name])]
    missing = [name for name in fetches if _base(name) not in nodes]
    if missing:
        raise ModelImportError(
            f"{LOADER}: outputs names {_base(missing[0])!r}, which is not a node of the GraphDef"
        )

    def call(*tensors: Any) -> list[Any]:
        input_map = {f"{spec.name}:0": tensor for spec, tensor in zip(specs, tensors)}
        return tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=fetches,
                                              name="graph")

    return freeze(call, specs, source, [_base(name) for name in fetches])


def _read_graph_def(path: Path) -> Any:
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(path.read_bytes())
    except DecodeError as exc:
        raise ModelImportError(f"{str(path)!r} is not a binary GraphDef (.pb) file: {exc}") from exc
    return graph_def


# -- SavedModel ----------------------------------------------------------------


def _saved_model_function(path: Path, shape: Mapping[str, Any] | None, outputs: Sequence[str] | None,
                          signature_key: str | None) -> FrozenFunction:
    source = f"SavedModel {str(path)!r}"
    try:
        with captured_output(f"loading {source}"):
            loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # noqa: BLE001 - the loader raises OSError, ValueError, NotFoundError...
        raise ModelImportError(f"{LOADER}: {source} could not be loaded: {type(exc).__name__}: "
                               f"{first_line(exc)}") from exc
    signatures = dict(loaded.signatures)
    if signature_key is None:
        signature_key = "serving_default" if "serving_default" in signatures or not signatures else (
            next(iter(signatures)) if len(signatures) == 1 else None)
    if signature_key not in signatures:
        raise ModelImportError(
            f"{LOADER}: {source} has no signature {signature_key!r}; its signatures: "
            f"{', '.join(signatures) or 'none (export one with tf.saved_model.save(..., signatures=...))'}"
        )
    function = signatures[signature_key]
    _, kwarg_specs = function.structured_input_signature
    specs = _settle([InputSpec(name, tuple(spec.shape) if spec.shape.rank is not None else None,
                               dtype_name(spec.dtype)) for name, spec in kwarg_specs.items()], shape)
    available = list(function.structured_outputs)
    unknown = [name for name in outputs or () if name not in available]
    if unknown:
        raise ModelImportError(f"{LOADER}: outputs names {unknown[0]!r}, which signature {signature_key!r} of "
                               f"{source} does not return. Its outputs: {', '.join(available)}")
    selected = list(outputs) if outputs else available
    names = [spec.name for spec in specs]

    def call(*tensors: Any) -> dict[str, Any]:
        result = function(**dict(zip(names, tensors)))
        return {name: result[name] for name in selected}

    frozen = freeze(call, specs, source)
    # Keep the loaded object (and so its variables) alive until the graph is frozen.
    del loaded
    return frozen


# -- tf.function and concrete functions ----------------------------------------


def _function_specs(function: Any, shape: Mapping[str, Any] | None) -> tuple[list[InputSpec], bool]:
    """The inputs of a tf.function or concrete function, and whether they are passed by keyword."""
    signature = getattr(function, "input_signature", None)
    if hasattr(function, "structured_input_signature"):  # a ConcreteFunction
        args, kwargs = function.structured_input_signature
        if kwargs and not args:
            return [InputSpec(name, tuple(spec.shape), dtype_name(spec.dtype))
                    for name, spec in kwargs.items()], True
        signature = tf.nest.flatten(args)
    if signature:
        flat = tf.nest.flatten(signature)
        names = _argument_names(function, len(flat))
        return [InputSpec(spec.name or name, tuple(spec.shape) if spec.shape.rank is not None else None,
                          dtype_name(spec.dtype)) for spec, name in zip(flat, names)], False
    if not shape:
        raise ModelImportError(
            f"{LOADER}: the tf.function has no input_signature; give one, or pass shape={{'x': (1, 224, 224, 3)}} "
            "naming its inputs in order (float32)"
        )
    if not isinstance(shape, Mapping):
        raise OptionTypeError(f"{LOADER}: shape must be a dict of input name to shape, not {type(shape).__name__}")
    return [InputSpec(str(name), parse_shape(str(name), dims), "float32") for name, dims in shape.items()], False


def _argument_names(function: Any, count: int) -> list[str]:
    python_function = getattr(function, "python_function", None) or getattr(function, "_python_function", None)
    try:
        names = [p for p in inspect.signature(python_function).parameters if p != "self"] if python_function else []
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"input_{i}" for i in range(count)]


def _callable_function(function: Any, shape: Mapping[str, Any] | None, outputs: Sequence[str] | None,
                       kind: str) -> FrozenFunction:
    if outputs:
        warnings.warn(f"{LOADER}: outputs is not honoured for a {kind}: the function's return value defines "
                      "its outputs", UserWarning, stacklevel=4)
    specs, by_keyword = _function_specs(function, shape)
    specs = _settle(specs, shape)
    names = [spec.name for spec in specs]

    def call(*tensors: Any) -> Any:
        return function(**dict(zip(names, tensors))) if by_keyword else function(*tensors)

    name = getattr(function, "name", None) or getattr(function, "__name__", "")
    name = name.decode("utf-8") if isinstance(name, bytes) else str(name)
    return freeze(call, specs, f"{kind} {name}".strip())


# -- the loader ------------------------------------------------------------------


def _frozen_function(graph: Any, shape: Mapping[str, Any] | None, outputs: Sequence[str] | None,
                     signature_key: str | None) -> FrozenFunction:
    is_saved_model = isinstance(graph, (str, os.PathLike)) and Path(graph).is_dir()
    if signature_key is not None and not is_saved_model:
        warnings.warn(f"{LOADER}: signature_key is not honoured: it selects a SavedModel's signature, and "
                      f"this model is a {type(graph).__name__}", UserWarning, stacklevel=4)
    if isinstance(graph, tf.compat.v1.GraphDef):
        return _graph_def_function(graph, shape, outputs, "GraphDef")
    if isinstance(graph, (str, os.PathLike)):
        path = Path(graph)
        if path.is_dir():
            if not (path / "saved_model.pb").is_file() and not (path / "saved_model.pbtxt").is_file():
                raise ModelImportError(f"{LOADER}: directory {str(path)!r} is not a SavedModel (no saved_model.pb)")
            return _saved_model_function(path, shape, outputs, signature_key)
        if path.is_file():
            return _graph_def_function(_read_graph_def(path), shape, outputs, f"GraphDef {str(path)!r}")
        raise PathNotFoundError(f"TensorFlow model path {str(path)!r} does not exist")
    if _is_keras_model(graph):
        raise OptionTypeError(f"{LOADER} expects a GraphDef, a SavedModel directory or a tf.function; "
                              "for a keras.Model use forge.from_keras")
    if hasattr(graph, "structured_input_signature") and callable(graph):
        return _callable_function(graph, shape, outputs, "concrete function")
    if hasattr(graph, "get_concrete_function"):
        return _callable_function(graph, shape, outputs, "tf.function")
    raise OptionTypeError(
        f"{LOADER} expects a frozen tf.compat.v1.GraphDef (or a path to its .pb file), a SavedModel directory, "
        f"a tf.function or a concrete function, not {type(graph).__name__}"
    )


def _is_keras_model(value: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, keras.Model)


def load_tensorflow(
    graph: Any,
    layout: str | None = None,
    shape: Mapping[str, Sequence[int | None]] | None = None,
    outputs: Sequence[str] | None = None,
    convert_config: Mapping[str, Any] | None = None,
    *,
    signature_key: str | None = None,
    fallback_to_onnx: bool = True,
    onnx_opset: int = DEFAULT_ONNX_OPSET,
    fold_constants: bool = True,
    fold_batch_norms: bool = True,
) -> IRModule:
    """Convert a TensorFlow graph into a Forge IRModule. See :func:`forge.from_tensorflow`."""
    if convert_config is not None:
        warnings.warn(
            f"{LOADER}: convert_config is not honoured: it configures Relay's TensorFlow importer (use_dense, "
            "use_nt_batch_matmul), which Relax does not have; Forge converts through TFLite",
            UserWarning, stacklevel=3,
        )
    layouts.check_layout(layout, layouts.TENSORFLOW_LAYOUTS, LOADER)
    if isinstance(outputs, str):
        outputs = [outputs]
    frozen = _frozen_function(graph, shape, outputs, signature_key)
    mod = import_function(frozen, LOADER, fallback_to_onnx=fallback_to_onnx, onnx_opset=onnx_opset)
    if layout == "NCHW":
        mod = layouts.convolutions_to_nchw(mod)
    return IRModule(mod, fold_constants=fold_constants, fold_batch_norms=fold_batch_norms)

