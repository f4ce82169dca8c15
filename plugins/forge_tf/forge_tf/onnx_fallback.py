"""The fallback route: tf2onnx, then whichever plugin registered the ``onnx`` frontend.

Where the TFLite route cannot keep a dynamic dimension (TVM's TFLite
importer handles symbolic shapes in fewer operators than its ONNX importer),
or fails for another reason, the loaders convert the same frozen function
(or TFLite model) with tf2onnx and load the ONNX model through the registry,
``forge_core.loaders.load("onnx", ...)``. Dynamic dimensions are named so that
the batch is one ``batch`` dimension shared by every input.

tf2onnx leaves TensorFlow's ``Erfc`` (which Keras 3's exact gelu uses) as a
node ONNX does not define; :func:`_erfc` converts it to ``1 - Erf(x)``. It
reads a TFLite flatbuffer in Python, but asks TFLite's interpreter for tensor
shapes, which runs C++ kernels on the model: Forge gives it the flatbuffer's
shapes instead (:class:`_StoredShapes`).
"""

from __future__ import annotations

import contextlib
import tempfile
import types
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from forge_core.errors import ForgeError, ModelImportError
from forge_core.loaders import load
from forge_tf.console import captured_output, first_line
from forge_tf.frozen_function import FrozenFunction
from forge_tf.signature import InputSpec
from forge_tf.tflite_import import outputs_are_fixed, unsafe_operation
from forge_tf.tflite_model import TFLiteModel, tensor_name

DEFAULT_ONNX_OPSET = 17


def _tf2onnx() -> Any:
    try:
        import tf2onnx
    except ModuleNotFoundError as exc:
        raise ModelImportError(
            "the ONNX fallback needs tf2onnx, which is not installed: pip install 'forge-core[tf]'"
        ) from exc
    return tf2onnx


def _erfc(ctx: Any, node: Any, name: str, args: Any) -> None:
    """tf2onnx handler: ``Erfc(x)`` as ``Sub(1, Erf(x))``."""
    from tf2onnx import utils

    x = node.input[0]
    one = ctx.make_const(utils.make_name(f"{name}/one"), np.array(1, utils.map_onnx_to_numpy_type(ctx.get_dtype(x))))
    erf = ctx.make_node("Erf", [x], name=utils.make_name(f"{name}/Erf"))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


_CUSTOM_OP_HANDLERS = {"Erfc": (_erfc, [])}


def _rename_tensors(proto: Any, mapping: Mapping[str, str]) -> None:
    """Rename tensors everywhere in an ONNX graph: its inputs, outputs and node edges."""
    for value in list(proto.graph.input) + list(proto.graph.output):
        value.name = mapping.get(value.name, value.name)
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]


def onnx_from_function(frozen: FrozenFunction, opset: int = DEFAULT_ONNX_OPSET) -> bytes:
    """The ONNX model of a frozen function, with Forge's input and output names."""
    tf2onnx = _tf2onnx()
    try:
        with captured_output("tf2onnx"):
            proto, _ = tf2onnx.convert.from_graph_def(
                frozen.graph_def,
                input_names=frozen.input_tensor_names,
                output_names=frozen.output_tensor_names,
                opset=opset,
                custom_op_handlers=dict(_CUSTOM_OP_HANDLERS),
            )
    except Exception as exc:  # noqa: BLE001 - tf2onnx raises many error types
        raise ModelImportError(f"tf2onnx failed on {frozen.source}: {type(exc).__name__}: {first_line(exc)}") from exc
    mapping = dict(zip(frozen.input_tensor_names, [spec.name for spec in frozen.inputs]))
    mapping.update(zip(frozen.output_tensor_names, frozen.output_names))
    _rename_tensors(proto, mapping)
    return proto.SerializeToString()


class _StoredShapes:
    """Stands in for ``tf.lite.Interpreter`` in tf2onnx's TFLite reader, which asks it for tensor shapes only.

    TFLite's interpreter prepares every kernel of the model to give them, and a
    kernel given inputs that do not fit it (a FULLY_CONNECTED whose opcode a
    corrupt file turned into a STRIDED_SLICE, say) reads past them: the
    process died of SIGSEGV. The shapes it gives are the flatbuffer's shape
    signatures, or its shapes where there are none: Forge reads them itself.
    """

    def __init__(self, details: list[dict[str, Any]]) -> None:
        self._details = details

    def allocate_tensors(self) -> None:
        pass

    def get_tensor_details(self) -> list[dict[str, Any]]:
        return self._details


class _TensorFlowView:
    """TensorFlow as tf2onnx's TFLite reader sees it: all of it, but ``tf.lite.Interpreter`` is
    :class:`_StoredShapes`."""

    def __init__(self, tf: Any, details: list[dict[str, Any]]) -> None:
        self._tf = tf
        self.lite = types.SimpleNamespace(Interpreter=lambda *args, **kwargs: _StoredShapes(details))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tf, name)


@contextlib.contextmanager
def _without_interpreter(tflite_model: TFLiteModel) -> Iterator[None]:
    """While tf2onnx reads ``tflite_model``, give it the stored shapes instead of TFLite's interpreter."""
    from tf2onnx import tflite_utils

    subgraph = tflite_model.subgraph
    details = []
    for index in range(subgraph.TensorsLength()):
        tensor = subgraph.Tensors(index)
        shape = tensor.ShapeSignatureAsNumpy() if tensor.ShapeSignatureLength() else tensor.ShapeAsNumpy()
        details.append({"name": tensor_name(subgraph, index),
                        "shape_signature": np.asarray(shape if tensor.ShapeLength() else [], dtype=np.int32)})
    real = tflite_utils.tf
    tflite_utils.tf = _TensorFlowView(real, details)
    try:
        yield
    finally:
        tflite_utils.tf = real


def onnx_from_tflite(tflite_model: TFLiteModel, opset: int = DEFAULT_ONNX_OPSET) -> bytes:
    """The ONNX model of a TFLite model, inputs and outputs named as in the flatbuffer.

    tf2onnx reads the flatbuffer in Python; the shapes it would ask TFLite's
    interpreter for come from the flatbuffer (see :class:`_StoredShapes`), so
    that no C++ kernel runs on a model only Forge's checks have seen.
    """
    tf2onnx = _tf2onnx()
    with tempfile.TemporaryDirectory(prefix="forge-tflite-") as directory:
        path = Path(directory) / "model.tflite"
        path.write_bytes(tflite_model.buffer)
        try:
            with captured_output("tf2onnx"), _without_interpreter(tflite_model):
                proto, _ = tf2onnx.convert.from_tflite(str(path), opset=opset,
                                                       custom_op_handlers=dict(_CUSTOM_OP_HANDLERS))
        except Exception as exc:  # noqa: BLE001
            raise ModelImportError(f"tf2onnx failed on the TFLite model: {type(exc).__name__}: {first_line(exc)}") \
                from exc
    inputs = [info.name for info in tflite_model.inputs]
    outputs = [info.name for info in tflite_model.outputs]
    mapping = {value.name: name for value, name in zip(proto.graph.input, inputs)}
    mapping.update({value.name: name for value, name in zip(proto.graph.output, outputs)})
    _rename_tensors(proto, mapping)
    return proto.SerializeToString()


def onnx_shapes(specs: Sequence[InputSpec]) -> dict[str, tuple[int | str, ...]]:
    """``shape`` for the ONNX loader: the batch is one dimension ``batch`` shared by every input."""
    return {
        spec.name: tuple(
            ("batch" if axis == 0 else f"{spec.name}_dim{axis}") if dim is None else int(dim)
            for axis, dim in enumerate(spec.shape)
        )
        for spec in specs if spec.shape is not None
    }


def import_through_onnx(onnx_model: bytes, specs: Sequence[InputSpec], loader: str) -> tvm.IRModule:
    """A Relax module of the ONNX model, loaded by the ``onnx`` frontend (constants not yet folded).

    When inputs were asked to be dynamic and no output dimension grows with
    them, the model itself fixes the batch (a reshape to a constant shape, say);
    that warns, naming the inputs.
    """
    try:
        ir = load("onnx", onnx_model, shape=onnx_shapes(specs), fold_constants=False, fold_batch_norms=False)
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a third-party plugin may raise anything
        raise ModelImportError(f"the onnx frontend failed: {type(exc).__name__}: {first_line(exc)}") from exc
    unsafe = unsafe_operation(ir.mod)
    if unsafe is not None:
        raise ModelImportError(f"the onnx frontend's module cannot be compiled safely: {unsafe}")
    dynamic = [spec.name for spec in specs if spec.dynamic_axes]
    if dynamic and outputs_are_fixed(ir.mod):
        warnings.warn(
            f"{loader}: input{'s' if len(dynamic) > 1 else ''} {', '.join(map(repr, dynamic))} "
            f"{'were' if len(dynamic) > 1 else 'was'} asked to be dynamic, but no output dimension depends on "
            "them: the model fixes its shapes (e.g. a reshape to a constant shape) and may only run at the "
            "size it was built for",
            UserWarning, stacklevel=5,
        )
    return ir.mod
