"""The public loaders: each dispatches to the frontend a plugin registered.

A loader whose plugin is not installed raises
:class:`forge_core.errors.PluginNotInstalledError` naming the extra to install.
"""

from __future__ import annotations

from typing import Any

from forge_core.errors import PluginResultError
from forge_core.ir.module import IRModule
from forge_core.plugin_manager import get_plugin_manager

FRONTEND_EXTRAS: dict[str, str] = {
    "onnx": "onnx",
    "torch": "torch",
    "tensorflow": "tf",
    "keras": "tf",
    "tflite": "tf",
}
"""The ``forge-core`` extra that installs each known frontend's plugin."""


def load(frontend: str, *args: Any, **kwargs: Any) -> IRModule:
    """Load a model with the frontend registered as ``frontend`` (e.g. ``"onnx"``)."""
    loader = get_plugin_manager().frontend(frontend, extra=FRONTEND_EXTRAS.get(frontend))
    result = loader.load(*args, **kwargs)
    if not isinstance(result, IRModule):
        raise PluginResultError(loader.plugin, f"The {frontend!r} frontend", "a forge.IRModule", result)
    return result


def from_onnx(model: Any, *args: Any, **kwargs: Any) -> IRModule:
    """Convert an ONNX model into an equivalent Forge IRModule.

    ONNX graphs are Python protobuf objects; the weights (initializers) are
    handled automatically. ONNX describes inputs with possibly dynamic
    shapes; the importer keeps dimensions it cannot resolve dynamic (reported
    as ``-1``).

    Args:
        model: An ``onnx.ModelProto`` (ONNX IR version 3 / ONNX 1.1 or later),
            a path to a ``.onnx`` file, or the file's bytes.
        shape: Dict of input name to shape, overriding the model's declared
            input shapes. A dimension given as ``-1``, ``None`` or a string is
            dynamic.
        dtype: A dict of input name to dtype overrides those inputs' types; a
            string is the type of inputs the model leaves untyped. Defaults to
            ``"float32"``.
        opset: Override of the autodetected opset. This can be helpful for
            some testing.
        freeze_params: If True (the default), the initializers (weights,
            shapes...) are embedded into the graph as constants, which allows
            more aggressive optimization at compile time. If False, float
            weights stay parameters of ``main`` named ``param_0``, ``param_1``…
            and appear in ``IRModule.params``.
        convert_config: Relay-era conversion options. **Not honoured**: TVM's
            Relax importer has no such options; passing it warns.
        export_node_renamed_model_path: Export the model, with every unnamed
            node given a name ``<OpType>_<index>``, to this path. Errors name
            nodes by these names.
        fold_constants: Keyword-only; passed to :class:`forge.IRModule`.
        fold_batch_norms: Keyword-only; passed to :class:`forge.IRModule`.

    Returns:
        Forge IRModule object

    Raises:
        forge.UnsupportedOperatorError: Listing every operator type the model
            uses that the importer lacks, with its count and one node name.
        forge.InvalidModelError: The file or model breaks ONNX's rules: it
            does not parse, a value is read before it is produced or defined
            twice, a tensor's data does not fill its dims, an attribute or
            opset is unknown or of the wrong type... (the error names the
            node, value or field). A ``ModelImportError``.
        forge.ModelImportError: A node failed to convert (the error names the
            node and its op).
        forge.PluginNotInstalledError: The ``forge-onnx`` plugin is not
            installed: ``pip install 'forge-core[onnx]'``.
    """
    return load("onnx", model, *args, **kwargs)


def from_torch(*args: Any, **kwargs: Any) -> IRModule:
    """Load a PyTorch model and convert it into a Forge IRModule.

    The companion parameters (weights) are handled automatically. Routes:

    * a ``torch.nn.Module`` or ``torch.export.ExportedProgram`` goes through
      ``torch.export`` and TVM's Relax exported-program importer;
    * a traced TorchScript module (``torch.jit.trace(model, input)``) goes
      through ONNX (TVM 0.27 has no TorchScript importer);
    * Automatic ONNX: when the direct route fails, Forge exports the model to
      ONNX and loads it with the ``onnx`` frontend, logging one line that says
      why. When both fail, the error shows both causes and the unsupported ops.

    Args:
        script_module: A ``torch.nn.Module``, an ``ExportedProgram``, or a traced
            TorchScript module.
        input_infos: A list of ``(input name, input shape)`` or
            ``(input name, (input shape, input type))``, e.g.
            ``[('input0', (1, 2)), ('input1', ((3, 4), 'int'))]``. The names
            become the model's input names (choose easy ones such as input0).
            A dimension of ``-1`` or ``None`` is dynamic. Optional for an
            ExportedProgram or when ``example_inputs`` is given; the names then
            come from ``forward``'s signature.
        custom_convert_map: Converters for ops the importer lacks or should
            convert differently: ``{"op.overload": fn}`` (e.g.
            ``"rrelu_with_noise_functional.default"``), where
            ``fn(node, importer) -> relax.Var`` emits Relax through
            ``importer.block_builder`` and reads inputs from ``importer.env``.
            Used by the torch.export route.
        default_type: The dtype of inputs whose ``input_infos`` give none.
            Defaults to ``"float32"``.
        use_parser_friendly_name: Relay-era option; **not honoured** (Relax
            names are never parsed as text). Passing True warns.
        keep_quantized_weight: Relay-era option; **not honoured** (quantized
            weights are unpacked to float). Passing True warns.
        example_inputs: Keyword-only: tensors to trace the model with, instead
            of random ones built from ``input_infos``.
        fallback_to_onnx: Keyword-only; False disables the automatic ONNX route.
        onnx_opset: Keyword-only; the opset of the ONNX route. Defaults to 17.
        fold_constants: Keyword-only; passed to :class:`forge.IRModule`.
        fold_batch_norms: Keyword-only; passed to :class:`forge.IRModule`.

    Returns:
        Forge IRModule object

    Needs the PyTorch plugin: ``pip install 'forge-core[torch]'``.
    """
    return load("torch", *args, **kwargs)


def from_tensorflow(*args: Any, **kwargs: Any) -> IRModule:
    """Load a TensorFlow graph into a Forge IRModule.

    The companion parameters (weights) are handled automatically. TVM 0.27 has
    no Relax TensorFlow importer, so Forge traces the model into a frozen
    concrete function and converts it with TensorFlow's TFLite converter and
    TVM's TFLite importer; dynamic dimensions stay symbolic, Forge evaluating
    the graph's shape arithmetic on them. When that route fails, or fixes a
    dimension asked to be dynamic, Forge converts the same function with
    tf2onnx and loads it with the ``onnx`` frontend, logging one warning
    (logger ``forge.tf``) that says why; when both fail, the error shows both
    causes.

    Args:
        graph: A frozen ``tf.compat.v1.GraphDef`` (its variables turned into
            constants) or a path to its binary ``.pb`` file, whose
            ``Placeholder`` nodes are the inputs; a SavedModel directory
            (signature ``serving_default``, or the only one; inputs and
            outputs are the signature's keys); or a ``tf.function`` or
            concrete function (inputs from its input signature, outputs
            ``output_0``... or the keys of the dict it returns).
        layout: ``None`` or ``"NHWC"`` keeps the graph's layout. ``"NCHW"``
            converts the 2-D convolutions to compute in NCHW (TVM's
            ``ConvertLayout``); the inputs keep the graph's layout.
        shape: Dict of input name to shape, overriding the graph's. A
            dimension given as ``None`` or ``-1`` is dynamic. An unknown batch
            the dict does not give becomes 1; any other unknown dimension must
            be given. For a ``tf.function`` without an input signature it names
            the (float32) inputs in order.
        outputs: Output node or tensor names of a GraphDef; if not specified,
            the last node is assumed as graph output. For a SavedModel, the
            signature outputs to keep. **Not honoured** for a ``tf.function``
            (its return value defines the outputs); passing it warns.
        convert_config: Relay-era options (``use_dense``,
            ``use_nt_batch_matmul``). **Not honoured**: Relax has no such
            options; passing it warns.
        signature_key: Keyword-only: the SavedModel signature to load. Passing it
            for another kind of model warns (it is not honoured there).
        fallback_to_onnx: Keyword-only; False disables the tf2onnx route.
        onnx_opset: Keyword-only; the opset of the tf2onnx route. Defaults to 17.
        fold_constants: Keyword-only; passed to :class:`forge.IRModule`.
        fold_batch_norms: Keyword-only; passed to :class:`forge.IRModule`.

    Returns:
        Forge IRModule object

    Raises:
        forge.UnsupportedOperatorError: Listing every operator TVM's TFLite
            importer lacks, with its count and one example, checked before
            conversion (when the tf2onnx route fails too).
        forge.ModelImportError: The graph is not frozen, cannot be traced with
            the given shapes, or fails to convert (both routes' causes shown).
        forge.PluginNotInstalledError: The ``forge-tf`` plugin is not
            installed: ``pip install 'forge-core[tf]'``.
    """
    return load("tensorflow", *args, **kwargs)


def from_keras(*args: Any, **kwargs: Any) -> IRModule:
    """Convert a Keras model into a Forge IRModule.

    The weights are handled automatically. The model is traced with
    ``training=False`` and converted through TFLite, with the tf2onnx
    fallback of :func:`from_tensorflow` (logged on ``forge.tf``). Input names
    are the Keras inputs' names, output names the model's ``output_names``.

    Args:
        model: The ``keras.Model`` (Keras 3: functional, Sequential, or
            subclassed with ``shape`` given) to be converted.
        shape: Dict of input name to shape, in ``layout``, optional. A
            dimension given as ``None`` or ``-1`` is dynamic. The batch Keras
            leaves unknown becomes 1 unless given; any other unknown dimension
            must be given.
        layout: ``"NCHW"`` (default) or ``"NHWC"``, how the imported model
            expects its data. With ``"NCHW"``, every rank-4 input is taken as
            NCHW and transposed to Keras's NHWC before the first op, and every
            rank-4 output is transposed back to NCHW; inputs and outputs of
            other ranks pass unchanged; the transposes are exact. With
            ``"NHWC"``, data passes as Keras has it.
        fallback_to_onnx: Keyword-only; False disables the tf2onnx route.
        onnx_opset: Keyword-only; the opset of the tf2onnx route. Defaults to 17.
        fold_constants: Keyword-only; passed to :class:`forge.IRModule`.
        fold_batch_norms: Keyword-only; passed to :class:`forge.IRModule`.

    Returns:
        Forge IRModule object

    Raises:
        forge.UnsupportedOperatorError: Listing every operator TVM's TFLite
            importer lacks, with its count and one example (when the tf2onnx
            route fails too).
        forge.ModelImportError: A shape names an unknown input or has the
            wrong rank, or conversion fails (both routes' causes shown).
        forge.PluginNotInstalledError: The ``forge-tf`` plugin is not
            installed: ``pip install 'forge-core[tf]'``.
    """
    return load("keras", *args, **kwargs)


def from_tflite(*args: Any, **kwargs: Any) -> IRModule:
    """Convert a TFLite model into a Forge IRModule through TVM's Relax TFLite importer.

    An int8 or uint8 full-integer quantized model imports as quantize and
    dequantize around the float operators, matches the TFLite interpreter bit
    for bit (with its default XNNPACK delegate; TFLite's builtin int8 kernels
    round some values one step apart), and loads with ``is_quantized`` True.
    Input and output names are the flatbuffer's tensor names.

    The flatbuffer is checked before anything reads it (offsets, vectors,
    indices, tensor types, constant sizes, operator inputs and types): a
    corrupt file raises :class:`forge.InvalidModelError` naming the tensor,
    operator or field. An index that a GATHER or EMBEDDING_LOOKUP computes at
    run time out of range is clamped to the nearest valid one (TFLite raises).

    Args:
        model: The ``.tflite`` flatbuffer's bytes, a path to it, or a parsed
            ``tflite.Model``.
        shape_dict: Input shapes of the model, by input tensor name. A
            dimension given as ``None`` or ``-1`` is dynamic; where TVM's
            importer cannot keep it, the model is converted with tf2onnx and
            loaded with the ``onnx`` frontend, logging one warning on
            ``forge.tf``.
        dtype_dict: Input types of the model, by input tensor name. A
            TFLite model's types are fixed: a type other than the model's
            raises :class:`forge.ModelImportError`.
        fallback_to_onnx: Keyword-only; False disables the tf2onnx route.
        onnx_opset: Keyword-only; the opset of the tf2onnx route. Defaults to 17.
        fold_constants: Keyword-only; passed to :class:`forge.IRModule`.
        fold_batch_norms: Keyword-only; passed to :class:`forge.IRModule`.

    Returns:
        Forge IRModule object

    Raises:
        forge.UnsupportedOperatorError: Listing every operator TVM's TFLite
            importer lacks (custom and Flex ops, dynamic-range quantized ops
            included), with its count and one output tensor name, checked
            before conversion.
        forge.InvalidModelError: The data is not a valid TFLite flatbuffer
            (the error names the subgraph, tensor, operator or field). A
            ``ModelImportError``.
        forge.ModelImportError: An operator fails to convert (the error names
            it), or an option does not fit the model.
        forge.PluginNotInstalledError: The ``forge-tf`` plugin is not
            installed: ``pip install 'forge-core[tf]'``.
    """
    return load("tflite", *args, **kwargs)
