"""ONNX graphs for ``ONNXModule``: reading, signatures, operator counts, onnxruntime runs and the batch size.

Everything here works on ``onnx.ModelProto`` and numpy; TVM is not involved.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from forge_core.errors import ModelImportError, ModelStateError, OptionError, OptionTypeError
from forge_core.runtime.signature import DYNAMIC_DIM, TensorSpec

logger = logging.getLogger("forge.tensorrt")

QDQ_OPSET = 13
"""The first opset whose ``DequantizeLinear`` takes per-axis scales (TensorRT's per-channel weights)."""


def read_model(path_or_proto: Any) -> tuple[onnx.ModelProto, str]:
    """A private copy of the model, checked with ``onnx.checker``; and a description of where it came from.

    Raises:
        ModelImportError: a missing file, a file that is not ONNX, or a model the checker rejects.
        TypeError: neither a ModelProto nor a path.
    """
    if isinstance(path_or_proto, onnx.ModelProto):
        proto, source = onnx.ModelProto(), "the given ModelProto"
        proto.CopyFrom(path_or_proto)
    elif isinstance(path_or_proto, (str, os.PathLike)):
        path = Path(path_or_proto)
        source = repr(str(path))
        if not path.is_file():
            raise ModelImportError(f"ONNX model file {source} does not exist")
        try:
            proto = onnx.load(str(path))
        except (DecodeError, ValueError, RuntimeError, OSError) as exc:
            raise ModelImportError(f"{source} is not an ONNX model: {exc}") from exc
        # Protobuf parses many non-ONNX byte strings into a near-empty message.
        if not proto.HasField("graph") or not proto.graph.output:
            raise ModelImportError(f"{source} is not an ONNX model: it holds no graph with outputs")
    else:
        raise OptionTypeError(f"ONNXModule expects an onnx.ModelProto or a path to a .onnx file, "
                        f"not {type(path_or_proto).__name__}")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelImportError(f"{source} fails onnx.checker: {first}") from exc
    return proto, source


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of ``model``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default ("" / "ai.onnx") operator set the model imports."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def upgrade_opset(model: onnx.ModelProto, opset: int = QDQ_OPSET) -> onnx.ModelProto:
    """``model`` at opset ``opset`` or higher (``onnx.version_converter``); unchanged when already there.

    Raises:
        ValueError: the converter cannot take the model (the message says which opset it has).
    """
    have = default_opset(model)
    if have >= opset:
        return model
    try:
        upgraded = onnx.version_converter.convert_version(model, opset)
        onnx.checker.check_model(upgraded)
    except Exception as exc:  # the converter raises RuntimeError or its own errors
        raise ModelImportError(f"the model has opset {have} and onnx.version_converter cannot raise it to {opset}, "
                         f"which per-channel QDQ needs: {str(exc).strip().splitlines()[0]}. "
                         f"Export the model at opset {opset} or later") from exc
    logger.info("upgraded the model from opset %d to %d", have, opset)
    return upgraded


def initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {init.name for init in graph.initializer}


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    dtype = str(helper.tensor_dtype_to_np_dtype(tensor.elem_type)) if tensor.elem_type else "unknown"
    if not tensor.HasField("shape"):
        return TensorSpec(value.name, None, dtype)
    shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else DYNAMIC_DIM for d in tensor.shape.dim)
    return TensorSpec(value.name, shape, dtype)


def input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Graph inputs that are not initializers (IR version 3 models list their weights as inputs too)."""
    weights = initializer_names(model.graph)
    return [_spec(v) for v in model.graph.input if v.name not in weights]


def output_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Graph outputs; a shape the graph does not declare comes from ONNX shape inference."""
    specs = [_spec(v) for v in model.graph.output]
    if any(s.shape is None for s in specs):
        inferred = onnx.shape_inference.infer_shapes(model)
        specs = [_spec(v) if s.shape is None else s for s, v in zip(specs, inferred.graph.output)]
    return specs


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _nodes(sub)


def count_operators(model: onnx.ModelProto) -> dict[str, int]:
    """Operator type to node count over every graph (subgraphs of If/Loop/Scan included), first seen first.

    Operators of another domain than ONNX's are prefixed with it: ``"com.microsoft.FusedConv"``.
    """
    return dict(Counter(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
                        for node in _nodes(model.graph)))


QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "ConvInteger", "MatMulInteger")


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether the model holds quantization operators (QDQ, QLinear or integer ops)."""
    return any(node.op_type in QUANTIZED_OPS for node in _nodes(model.graph))


# ----------------------------------------------------------------------
# Running with onnxruntime
# ----------------------------------------------------------------------


def session(model: onnx.ModelProto | bytes, use_cuda: bool = False) -> Any:
    """An onnxruntime session over ``model`` (CUDA when asked for and present, else the CPU)."""
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if use_cuda:
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        else:
            logger.info("use_cuda=True but onnxruntime has no CUDA provider here: running on the CPU")
    data = model if isinstance(model, bytes) else model.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(data, options, providers=providers)


def random_inputs(specs: Sequence[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for a numerical check: standard normal floats, zeros for integers (safe as indices).

    A dynamic dimension takes 1.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if spec.shape is None:
            raise ModelStateError(f"input {spec.name!r} has no shape: set_batch_size() or export the model with shapes")
        shape = tuple(1 if d == DYNAMIC_DIM else d for d in spec.shape)
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=dtype)
    return feeds


# ----------------------------------------------------------------------
# Batch size
# ----------------------------------------------------------------------

_NODE_IN_ERROR = (re.compile(r"node name: ([^)]*)\)"), re.compile(r"Name:'([^']*)'"))


def _leading(value: onnx.ValueInfoProto) -> int | None:
    shape = value.type.tensor_type.shape
    if not value.type.tensor_type.HasField("shape") or not shape.dim:
        return None
    first = shape.dim[0]
    return first.dim_value if first.HasField("dim_value") and first.dim_value > 0 else None


def _with_batch(model: onnx.ModelProto, batch_size: int) -> onnx.ModelProto:
    updated = onnx.ModelProto()
    updated.CopyFrom(model)
    weights = initializer_names(updated.graph)
    for value in [*updated.graph.input, *updated.graph.output]:
        if value.name in weights or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_value = batch_size
    del updated.graph.value_info[:]
    return updated


def _culprit(model: onnx.ModelProto, batch_size: int) -> onnx.NodeProto | None:
    """The first node that receives the batch and loses it, by lenient shape inference.

    A tensor is batched when it is a graph input, or a node's output with the
    new batch on its leading axis computed from a batched input. The culprit is
    the first node with a batched input whose outputs all lead with another
    size (``Shape`` and ``Size`` excepted: they describe, they do not carry).
    """
    loose = onnx.ModelProto()
    loose.CopyFrom(model)
    for value in loose.graph.output:  # the declared outputs must not mask what the nodes compute
        value.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(loose, data_prop=True)
    except Exception:  # noqa: BLE001 - lenient inference is a best effort
        return None
    leading = {v.name: _leading(v) for v in [*inferred.graph.value_info, *inferred.graph.output]}
    weights = initializer_names(model.graph)
    batched = {v.name for v in model.graph.input if v.name not in weights and _leading(v) == batch_size}
    for original, node in zip(model.graph.node, inferred.graph.node):
        if node.op_type in ("Shape", "Size") or not any(name in batched for name in node.input):
            continue
        known = [leading.get(name) for name in node.output if leading.get(name) is not None]
        if known and all(first != batch_size for first in known):
            return original
        batched.update(name for name in node.output if leading.get(name) == batch_size)
    return None


def _refuse(model: onnx.ModelProto, batch_size: int, old: str, detail: str) -> ValueError:
    node = _culprit(model, batch_size)
    if node is None:
        named = next((m.group(1) for pattern in _NODE_IN_ERROR for m in [pattern.search(detail)] if m), None)
        node = next((n for n in model.graph.node if named is not None and n.name == named), None)
    first_line = detail.strip().splitlines()[0] if detail.strip() else "an output loses the batch"
    if node is None:
        return ValueError(f"set_batch_size({batch_size}): the model cannot run at batch {batch_size}: {first_line}")
    hint = (": its target shape spells the batch out; export it with 0 or -1 on the batch axis"
            if node.op_type in ("Reshape", "Expand", "ConstantOfShape", "Tile") else "")
    return ValueError(f"set_batch_size({batch_size}): node {node.name or node.output[0]!r} ({node.op_type}) keeps "
                      f"the batch size {old}{hint}. The model cannot run at batch {batch_size} ({first_line})")


def set_batch_size(model: onnx.ModelProto, batch_size: int, dry_run: bool = True) -> onnx.ModelProto:
    """``model`` with the leading dimension of every input and output set to ``batch_size``.

    Intermediate ``value_info`` is dropped and shapes inferred again
    (``strict_mode=True``); then, with ``dry_run``, onnxruntime runs the model
    once on zeros and every output must carry the new batch.

    Raises:
        ValueError: ``batch_size`` is not a positive integer, or a node keeps
            the old batch (found by lenient shape inference: the first node
            whose input carries the new batch and whose outputs do not; else
            the node an error names).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise OptionError(f"batch_size must be a positive integer, given {batch_size!r}")
    batch_size = int(batch_size)
    specs = input_specs(model)
    olds = {str(s.shape[0]) if s.shape[0] != DYNAMIC_DIM else "(dynamic)" for s in specs if s.shape}
    old = ", ".join(sorted(olds)) or "(none)"
    updated = _with_batch(model, batch_size)
    try:
        updated = onnx.shape_inference.infer_shapes(updated, strict_mode=True, data_prop=True)
    except Exception as exc:  # onnx.shape_inference.InferenceError, or a checker error
        raise _refuse(updated, batch_size, old, str(exc)) from None
    if dry_run:
        try:
            zeros = {name: np.zeros_like(value) for name, value in random_inputs(input_specs(updated)).items()}
            results = session(updated).run(None, zeros)
        except Exception as exc:  # onnxruntime's Fail / InvalidArgument / RuntimeException
            raise _refuse(updated, batch_size, old, str(exc)) from None
        for spec, value in zip(output_specs(updated), results):
            if np.ndim(value) == 0 or value.shape[0] != batch_size:
                raise _refuse(updated, batch_size, old,
                              f"output {spec.name!r} has shape {tuple(np.shape(value))} at batch {batch_size}")
    return updated
