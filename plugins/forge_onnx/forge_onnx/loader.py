"""``forge.from_onnx``: ONNX to Forge's IRModule through TVM's Relax importer."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

from forge_core.errors import ModelImportError, ModelQuirkWarning, OperatorConversionError, UnsupportedFeatureError
from forge_core.ir.module import IRModule
from forge_core.ir.naming import with_output_names
from forge_core.ir.weights import lift_weights
from forge_core.plugin_manager import get_plugin_manager
from forge_core.quantization.held_weights import is_dequantized_constant
from forge_core.runtime.signature import RUN_TIME_CHECK
from forge_onnx import graph_rewrites, validation
from forge_onnx.constant_folding import fold_if_constant, scalar_float_constant, static_shape_constant
from forge_onnx.converters import ConverterContext, constant_value
from forge_onnx.import_passes import build_ir_module
from forge_onnx.loops import LoopImporter
from forge_onnx.model_file import describe_source, read_model
from forge_onnx.operand_dims import match_operand_dims
from forge_onnx.operator_support import check_operators, iter_nodes

logger = logging.getLogger("forge.onnx")

Dim = int | str | None

# The operators to which TVM's importer passes shape values (``Shape`` of a dynamic tensor) as they are (its
# ``shape_compatible_ops``). Every other operator gets the shape value as an int64 tensor, as ONNX defines
# it; TVM would stop with "cannot handle ShapeExpr inputs" (or fail inside an If branch, where it does not check).
_SHAPE_OPERAND_OPS = frozenset({
    "Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand", "Concat", "Equal", "Where",
    "Cast", "CastLike", "Squeeze",
})


_LIST_ATTRIBUTES = {onnx.AttributeProto.INTS: "ints", onnx.AttributeProto.FLOATS: "floats",
                    onnx.AttributeProto.STRINGS: "strings", onnx.AttributeProto.TENSORS: "tensors",
                    onnx.AttributeProto.GRAPHS: "graphs"}


def _attribute_values(attr: onnx.AttributeProto) -> list[Any]:
    return list(getattr(attr, _LIST_ATTRIBUTES[attr.type]))


class _OneNode:
    """A graph holding one node, for TVM's node loop, which reads only ``graph.node``."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self.node = [node]


class _LazyBranch:
    """An If branch for TVM's subgraph loop, its nodes produced as the loop reaches them (``_expanded``)."""

    def __init__(self, graph: onnx.GraphProto, nodes: Iterator[onnx.NodeProto]) -> None:
        self.name, self.input, self.output, self.initializer = graph.name, graph.input, graph.output, \
            graph.initializer
        self.node = nodes


def _is_shape_value(value: Any) -> bool:
    return isinstance(value, relax.Expr) and isinstance(getattr(value, "ty", None), relax.ShapeType)


def _takes_shape_values(op_type: str, operands: Sequence[Any]) -> bool:
    """Whether TVM's converter of ``op_type`` takes these operands' shape values as they are. Concat joins shape
    values only with shape values and constants; beside a tensor computed at run time (Paddle2ONNX's
    ``Concat(Shape(x)[:2], computed)`` with the dims dynamic), each becomes a tensor."""
    if op_type not in _SHAPE_OPERAND_OPS:
        return False
    if op_type == "Concat":
        return all(o is None or _is_shape_value(o) or isinstance(o, tvm.ir.GenericConst) for o in operands)
    return True


# An If with a condition known at run time only, converted by ``_ForgeImporter.convert_if`` rather than by
# TVM's node loops, which handle "If" themselves.
_RUN_TIME_IF = "If (condition at run time)"


def _run_time_if(node: onnx.NodeProto) -> onnx.NodeProto:
    renamed = onnx.NodeProto()
    renamed.CopyFrom(node)
    renamed.op_type = _RUN_TIME_IF
    return renamed


def _op_type(op_type: str) -> str:
    """The ONNX operator's name, for errors."""
    return "If" if op_type == _RUN_TIME_IF else op_type


def _fields(value: relax.Expr) -> list[Any]:
    ty = value.ty
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def _ranks(value: relax.Expr) -> str:
    ranks = [str(ty.ndim) if isinstance(ty, relax.TensorType) and ty.ndim >= 0 else "?" for ty in _fields(value)]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


def _same_ranks(then_expr: relax.Expr, else_expr: relax.Expr) -> bool:
    then_fields, else_fields = _fields(then_expr), _fields(else_expr)
    if len(then_fields) != len(else_fields):
        return False
    for a, b in zip(then_fields, else_fields, strict=True):
        if isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType) and a.ndim != b.ndim:
            return False
    return True


def _branch_key(graph: onnx.GraphProto) -> tuple[str, ...]:
    """An If branch's identity: its outputs' names, unique in a model (SSA holds in subgraphs too)."""
    return (graph.name, *(output.name for output in graph.output))


class _ForgeImporter(LoopImporter, ONNXGraphImporter):
    """TVM's importer, with the registered converters first, shape values turned into tensors for the
    operators that take tensors only, and every per-node failure named."""

    def __init__(self, *args: Any, converters: Mapping[tuple[str, str], Any], domains: Mapping[str, str],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forge_converters = converters
        self._domains = domains
        self._branch_conditions: dict[tuple[str, ...], tuple[str, bool]] = {}
        self._branch_stack: list[relax.Expr | None] = []
        self._branch_siblings: dict[tuple[str, ...], tuple[str, onnx.GraphProto]] = {}
        self._branch_depth_failing = False
        self._branch_results: dict[tuple[str, ...], Any] = {}
        self._stacked_sequences: list[relax.Expr] = []

    def _parse_attr(self, attr_proto: Any) -> dict[str, Any]:
        """TVM's attribute parsing, plus sparse tensors and empty lists (which it rejects)."""
        sparse = {a.name: a.sparse_tensor for a in attr_proto if a.type == onnx.AttributeProto.SPARSE_TENSOR}
        empty = {a.name: () for a in attr_proto if a.type in _LIST_ATTRIBUTES and not _attribute_values(a)}
        rest = [a for a in attr_proto if a.type != onnx.AttributeProto.SPARSE_TENSOR and a.name not in empty]
        return {**super()._parse_attr(rest), **sparse, **empty}

    def _check_for_unsupported_ops(self, graph: Any) -> None:
        """Forge checked already (operator_support.check_operators), counting registered converters."""

    def _expanded(self, nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
        """``nodes``, each If whose condition is a constant by the time it is reached replaced by the nodes of
        the branch it takes (its initializers as Constant nodes, its outputs bound by Identity nodes).

        Exporters trace Python ``if``s on shapes into If nodes: Silero VAD's decoder squeezes its last axis
        ``if x.shape[-1] == 1``, so its branches give tensors of different ranks. TVM's importer keeps both
        and types the result with an unknown rank, which the next Unsqueeze refused. Where the shapes are
        static, the condition folds to a constant as it converts (Shape of a static tensor is one), and the
        branch not taken is dropped here. A condition known only at run time stays an If.
        """
        for node in nodes:
            branch = self._taken_branch(node)
            if branch is None:
                self._register_branches(node)
                yield _run_time_if(node) if node.op_type == "If" else node
                continue
            logger.debug("If %r: its condition is known at import; the %s is taken", node.name, branch.name)
            for init in branch.initializer:
                yield onnx.helper.make_node("Constant", [], [init.name], name=f"{node.name}/{init.name}", value=init)
            yield from self._expanded(branch.node)
            for index, (inner, outer) in enumerate(zip(branch.output, node.output, strict=True)):
                yield onnx.helper.make_node("Identity", [inner.name], [outer], name=f"{node.name}/taken_{index}")

    def _taken_branch(self, node: onnx.NodeProto) -> onnx.GraphProto | None:
        """The branch an If takes when its condition is a constant already; else None."""
        if node.op_type != "If" or not node.input:
            return None
        cond = constant_value(self._nodes.get(node.input[0]))
        if cond is None or np.asarray(cond).size != 1:
            return None
        wanted = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
        return next((attr.g for attr in node.attribute if attr.name == wanted), None)

    def _construct_nodes(self, graph: Any) -> None:
        """TVM's node loop, one node at a time, each seeing shape values as tensors where it needs them."""
        for node in self._expanded(graph.node):
            replaced: dict[str, Any] = {}
            if not _takes_shape_values(node.op_type, [self._nodes.get(name) for name in node.input if name]):
                for name in node.input:
                    value = self._nodes.get(name)
                    if name and name not in replaced and _is_shape_value(value):
                        replaced[name] = value
                        self._nodes[name] = self.bb.emit(relax.op.shape_to_tensor(value))
            try:
                super()._construct_nodes(_OneNode(node))
            except ModelImportError:
                raise
            except Exception as exc:  # noqa: BLE001 - outside the converter (attributes, inputs): still this node's
                raise OperatorConversionError("onnx", _op_type(node.op_type), node.name, exc) from exc
            finally:
                self._nodes.update(replaced)  # later consumers (a Reshape...) still get the shape value
            for index, name in enumerate(node.output):
                if name in self._nodes:
                    self._nodes[name] = self._with_named_dims(self._nodes[name], f"{node.name}_{index}")
            self._bind_named(node)

    def _convert_subgraph(self, bb: relax.BlockBuilder, graph: Any) -> Any:
        """An If branch, with :meth:`branch_taken` answering while its nodes convert.

        TVM's importer converts a branch's nodes into the block that is open, outside the If: what a converter
        emits runs whichever branch is taken. (Giving each branch its own block crashed TVM's VM.) A converter
        that checks a value at run time must then check it only when its branch is taken.
        """
        key = _branch_key(graph)
        if key in self._branch_results:  # converted already, as a failing sibling's stand-in
            return self._branch_results.pop(key)
        taken = self._branch_conditions.get(key)
        cond = None
        if taken is not None:
            cond_name, is_then = taken
            cond = self._nodes.get(cond_name)
            if cond is not None:
                if not (isinstance(cond.ty, relax.TensorType) and cond.ty.ndim == 0):
                    cond = bb.emit(relax.op.reshape(cond, []))  # ONNX allows a one-element tensor, e.g. [1]
                cond = cond if is_then else bb.emit(relax.op.logical_not(cond))
            self._branch_stack.append(cond)
        try:
            result = super()._convert_subgraph(bb, _LazyBranch(graph, self._expanded(graph.node)))
            self._branch_results[key] = result  # kept for a sibling that fails next (TVM converts then, else)
            return result
        except (ModelImportError, OperatorConversionError) as exc:
            if taken is None or cond is None or self._branch_depth_failing:
                raise
            return self._failing_branch(bb, graph, exc)
        finally:
            if taken is not None:
                self._branch_stack.pop()

    def _failing_branch(self, bb: relax.BlockBuilder, graph: Any, error: Exception) -> Any:
        """A branch that cannot convert with the model's shapes (the one for the other sample rate of a Silero
        VAD, given 576 samples): an error when the model takes it at run time, and meanwhile the other branch's
        values as zeros, so that the If has that branch's types. onnxruntime, which runs the taken branch
        only, fails the same way when the model takes it."""
        node, sibling = self._branch_siblings[_branch_key(graph)]
        other = self._branch_results.get(_branch_key(sibling))  # the then branch, converted before the else
        if other is None:
            # Converted once, here, with its own condition alone on the stack (its run-time checks fire when it
            # runs); TVM's If converter asks for it next and gets this conversion back.
            failing_cond = self._branch_stack.pop()
            self._branch_depth_failing = True
            try:
                other = self._convert_subgraph(bb, sibling)
            except Exception:  # noqa: BLE001 - neither branch converts: the first error is the model's
                raise error from None
            finally:
                self._branch_depth_failing = False
                self._branch_stack.append(failing_cond)
        fields = [other] if not isinstance(other.ty, relax.TupleType) else \
            [bb.emit(relax.TupleGetItem(other, i)) for i in range(len(other.ty.fields))]
        if not all(isinstance(f.ty, relax.TensorType) for f in fields):
            raise error
        message = str(error).splitlines()[0]
        fine = bb.emit(relax.op.logical_not(self.branch_taken()))
        bb.emit(relax.op.assert_op(fine, [], f"{RUN_TIME_CHECK}If {node!r}: the model takes its branch "
                                             f"{graph.name!r}, which cannot run with these input shapes: {message}"))
        zeros = [bb.emit(relax.op.zeros_like(f)) for f in fields]
        logger.warning("If %r: its branch %r cannot run with these input shapes (%s); it raises an error if the "
                       "model takes it at run time", node, graph.name, message)
        return zeros[0] if len(zeros) == 1 and not isinstance(other.ty, relax.TupleType) else relax.Tuple(zeros)

    def convert_if(self, node: str, cond: relax.Expr, then_graph: onnx.GraphProto,
                   else_graph: onnx.GraphProto) -> relax.Expr:
        """An If whose condition is known at run time only: a Relax If, as TVM's importer builds it, where its
        branches give values of the same ranks.

        Where they do not (PyTorch exports ``x.squeeze(-1)`` on a dynamic dim as ``If(shape[-1] == 1, Squeeze,
        Identity)``; Silero VAD's decoder does), no Relax type holds the result, and the next operator that needs
        a rank could not convert. The If is then specialized, as ``torch.export`` specializes a guard: the
        importer goes on with the then branch, the one taken when the exporter's test holds, and the model
        checks the condition at run time, raising :class:`forge.InputError` with the If's name for inputs that
        take the other branch (onnxruntime runs them; import with static shapes for those).
        """
        then_expr = self._convert_subgraph(self.bb, then_graph)
        else_expr = self._convert_subgraph(self.bb, else_graph)
        if _same_ranks(then_expr, else_expr):
            if_result = self.bb.emit(relax.If(cond, relax.SeqExpr([], then_expr), relax.SeqExpr([], else_expr)))
            if isinstance(if_result.ty, relax.TupleType):
                return relax.Tuple([self.bb.emit(relax.TupleGetItem(if_result, i))
                                    for i in range(len(if_result.ty.fields))])
            return if_result
        if not (isinstance(cond.ty, relax.TensorType) and cond.ty.ndim == 0):
            cond = self.bb.emit(relax.op.reshape(cond, []))
        outer = self.branch_taken()  # the If sits in a branch of another: it is checked when that one runs
        holds = cond if outer is None else self.bb.emit(relax.op.logical_or(relax.op.logical_not(outer), cond))
        self.bb.emit(relax.op.assert_op(holds, [], (
            f"{RUN_TIME_CHECK}If {node!r}: its branches give tensors of different ranks "
            f"({_ranks(then_expr)} and {_ranks(else_expr)}), and Forge imported the model for its then branch; "
            f"these inputs take its else branch. Import the model with these inputs' shapes given "
            f"(from_onnx(shape=...)) to run them")))
        logger.warning("If %r: its branches give tensors of different ranks (%s and %s) and its condition is known "
                       "only at run time; the model is imported for its then branch, and inputs that take the else "
                       "branch raise an error", node, _ranks(then_expr), _ranks(else_expr))
        return then_expr

    def _register_branches(self, node: onnx.NodeProto) -> None:
        if node.op_type != "If":
            return
        branches = {attr.name: attr.g for attr in node.attribute if attr.name in ("then_branch", "else_branch")}
        for name, graph in branches.items():
            self._branch_conditions[_branch_key(graph)] = (node.input[0], name == "then_branch")
            other = branches.get("else_branch" if name == "then_branch" else "then_branch")
            if other is not None:
                self._branch_siblings[_branch_key(graph)] = (node.name, other)

    def branch_taken(self) -> relax.Expr | None:
        """None outside If branches; in one, a bool scalar tensor true when the branch being converted runs (true
        where a condition is not known: its checks then always run)."""
        if not self._branch_stack:
            return None
        known = [cond for cond in self._branch_stack if cond is not None]
        if not known:
            return relax.const(True, "bool")
        return functools.reduce(lambda a, b: self.bb.emit(relax.op.logical_and(a, b)), known)

    def _bind_named(self, node: onnx.NodeProto) -> None:
        """Bind a single-output node's result under the ONNX node's name, so the graph API finds it by that name."""
        if len(node.output) != 1 or not isinstance(self._nodes.get(node.output[0]), relax.Call):
            return
        self._nodes[node.output[0]] = self.bb.emit(self._nodes[node.output[0]], name_hint=node.name or node.output[0])

    def _with_named_dims(self, value: Any, label: str) -> Any:
        """``value`` match-cast to named symbolic dims when only its rank is known; else unchanged.

        Relax infers no dims where broadcasting cannot be decided at import, e.g. (batch, sequence, 32) +
        (1, arange_len, 32). The result's Shape would then be an opaque value that Slice and Gather cannot
        take, and Reshape could not infer a -1 from it. With every dim named it is a shape like any other.
        """
        ty = getattr(value, "ty", None)
        if not isinstance(value, relax.Expr) or not isinstance(ty, relax.TensorType) or ty.shape is not None \
                or ty.ndim <= 0:
            return value
        prefix = re.sub(r"\W+", "_", label).strip("_") or "value"
        dims = [tvm.tirx.Var(f"{prefix}_d{axis}", "int64") for axis in range(ty.ndim)]
        bound = value if isinstance(value, relax.Var) else self.bb.emit(value)
        return self.bb.match_cast(bound, relax.TensorType(dims, ty.dtype))

    def _convert_operator(self, op_name: str, inputs: Any, attrs: dict[str, Any], opset: int) -> Any:
        node = attrs.get("tvm_custom", {}).get("name") or f"<unnamed {op_name}>"
        if not _takes_shape_values(op_name, list(inputs)) and any(_is_shape_value(i) for i in inputs):
            # Inside an If branch, where TVM's loop (and so the one above) does not run.
            inputs = type(inputs)(self.bb.emit(relax.op.shape_to_tensor(i)) if _is_shape_value(i) else i
                                  for i in inputs)
        domain = self._domains.get(node, "")
        converter = self._forge_converters.get(("" if domain == "ai.onnx" else domain, op_name))
        try:
            if domain in ("", "ai.onnx"):
                inputs = match_operand_dims(self.bb, op_name, inputs, attrs)
            if op_name == _RUN_TIME_IF:
                return self.convert_if(node, inputs[0], attrs["then_branch"], attrs["else_branch"])
            if converter is None and op_name in ("Loop", "Scan") and domain in ("", "ai.onnx"):
                if op_name == "Scan" and opset < 9:
                    raise UnsupportedFeatureError(
                        "Scan before opset 9 (a batch axis and sequence_lens) is not supported; convert the model to "
                        "opset 9 or later (onnx.version_converter)")
                return self.convert_loop(op_name, node, list(inputs), attrs)
            if self._stacked_sequences and op_name.startswith(("Sequence", "ConcatFromSequence")):
                stacked = self.read_stacked_sequence(op_name, node, list(inputs), attrs)
                if stacked is not None:
                    return self.bb.normalize(stacked)
            if converter is not None:
                plain = {k: v for k, v in attrs.items() if k != "tvm_custom"}
                context = ConverterContext(opset, node, domain, self, attrs)
                result = converter.convert(self.bb, list(inputs), plain, context)
                if isinstance(result, relax.Expr):
                    result = self.bb.normalize(result)  # as TVM does for its own converters
            else:
                result = super()._convert_operator(op_name, inputs, attrs, opset)
            if isinstance(result, relax.ShapeExpr):
                return static_shape_constant(result)
            if isinstance(result, tvm.tirx.FloatImm):
                return scalar_float_constant(result, list(inputs))
            if isinstance(result, relax.Expr) and not isinstance(result, relax.Tuple) and inputs and all(
                    i is None or isinstance(i, (tvm.ir.GenericConst, relax.ShapeExpr)) for i in inputs) \
                    and not is_dequantized_constant(result):  # a quantized weight: folded on import if not read
                result = fold_if_constant(self.bb, result)  # normalized above, or by TVM
            return result
        except OperatorConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - TVM raises anything from asserts to TVMError
            raise OperatorConversionError("onnx", _op_type(op_name), node, exc) from exc


def _model_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def _needs_edit(model: onnx.ModelProto, shape: Mapping[str, Sequence[Dim]] | None, dtype: Any) -> bool:
    """Whether the user's options, unnamed nodes or an exporter's quirks require editing (a copy of) the model."""
    untyped = any(vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED for vi in _graph_inputs(model))
    return (
        bool(shape)
        or _anonymous_dims(model)
        or isinstance(dtype, Mapping)
        or untyped
        or any(not node.name for node in iter_nodes(model.graph))
        or validation.exporter_quirks(model)
        or graph_rewrites.needs_rewrite(model)
        or validation.needs_defaults(model)
    )


def _dim_name(input_name: str, axis: int) -> str:
    """The name Forge gives a graph input's dynamic dim that has none: ``<input>_dim<axis>``, an identifier."""
    return re.sub(r"\W+", "_", f"{input_name}_dim{axis}").strip("_") or f"dim{axis}"


def _anonymous_dims(model: onnx.ModelProto) -> list[tuple[onnx.ValueInfoProto, int]]:
    """Graph inputs' dims with neither a size nor a name (or a negative size, Paddle2ONNX's dynamic dim)."""
    found = []
    for vi in _graph_inputs(model):
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.dim_param and (not dim.HasField("dim_value") or dim.dim_value < 0):
                found.append((vi, axis))
    return found


def _name_dims(model: onnx.ModelProto) -> None:
    """Name every anonymous dynamic dim of a graph input ``<input>_dim<axis>``: one dim each (TVM would name them
    all ``v``, as though they were one), and a name its errors and the artifact's metadata can show."""
    taken = {d.dim_param for vi in _graph_inputs(model) for d in vi.type.tensor_type.shape.dim if d.dim_param}
    for vi, axis in _anonymous_dims(model):
        name = _dim_name(vi.name, axis)
        while name in taken:
            name += "_"
        taken.add(name)
        vi.type.tensor_type.shape.dim[axis].dim_param = name


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node, in subgraphs too, a name ``<OpType>_<index>``, unique in the model."""
    taken = {node.name for node in iter_nodes(model.graph) if node.name}
    for index, node in enumerate(iter_nodes(model.graph)):
        if node.name:
            continue
        name = f"{node.op_type}_{index}"
        while name in taken:
            name += "_"
        node.name = name
        taken.add(name)


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in initializers]


def _apply_shapes(model: onnx.ModelProto, shape: Mapping[str, Sequence[Dim]]) -> None:
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    for name, dims in shape.items():
        if name not in inputs:
            raise ModelImportError(
                f"shape names input {name!r}, which the model does not have. Inputs: {', '.join(inputs)}"
            )
        tensor_type = inputs[name].type.tensor_type
        declared = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
        if tensor_type.HasField("shape") and declared and len(declared) != len(dims):
            raise ModelImportError(
                f"shape for input {name!r} has rank {len(dims)}: {tuple(dims)}; the model declares rank "
                f"{len(declared)}: {tuple(declared)}"
            )
        tensor_type.ClearField("shape")
        new_shape = tensor_type.shape
        new_shape.SetInParent()
        for axis, dim in enumerate(dims):
            entry = new_shape.dim.add()
            if isinstance(dim, str):
                entry.dim_param = dim
            elif dim is None or int(dim) < 0:
                entry.dim_param = _dim_name(name, axis)
            else:
                entry.dim_value = int(dim)


def _check_strings(model: onnx.ModelProto) -> None:
    """No graph input holds strings, which TVM has no dtype for."""
    for vi in _graph_inputs(model):
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            raise ModelImportError(f"graph input {vi.name!r} is a tensor of strings; Forge compiles numeric tensors "
                                   "only")


def _check_ranks(model: onnx.ModelProto, shape: Mapping[str, Sequence[Dim]] | None) -> None:
    """Every tensor input (or untyped one) has at least a rank, or ``shape`` gives it: TVM cannot lower an
    operator on a tensor of unknown rank."""
    for vi in _graph_inputs(model):
        if vi.type.WhichOneof("value") in (None, "tensor_type") and not vi.type.tensor_type.HasField("shape") \
                and vi.name not in (shape or {}):
            raise ModelImportError(
                f"graph input {vi.name!r} has no shape, not even a rank; Forge needs at least its rank: give "
                f"its shape with from_onnx(shape={{{vi.name!r}: (...)}}), -1 for a dynamic dim"
            )


def _apply_dtypes(model: onnx.ModelProto, dtype: str | Mapping[str, str]) -> None:
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    if isinstance(dtype, Mapping):
        for name, value in dtype.items():
            if name not in inputs:
                raise ModelImportError(
                    f"dtype names input {name!r}, which the model does not have. Inputs: {', '.join(inputs)}"
                )
            inputs[name].type.tensor_type.elem_type = _elem_type(value)
    else:
        for vi in inputs.values():
            if vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
                vi.type.tensor_type.elem_type = _elem_type(dtype)


def _elem_type(dtype: str) -> int:
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except TypeError as exc:
        raise ModelImportError(f"Unknown dtype {dtype!r}") from exc


def _save_atomically(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _convert(model: onnx.ModelProto, opset: int | None) -> Any:
    model_opset = _model_opset(model)
    if opset is None:
        opset = model_opset
    elif opset < model_opset:
        warnings.warn(
            f"opset={opset} overrides the model's opset {model_opset} with a lower one; conversion may fail",
            stacklevel=3,
        )
    converters = get_plugin_manager().converters("onnx")
    domains = {node.name: node.domain for node in iter_nodes(model.graph)}
    importer = _ForgeImporter(None, "float32", keep_params_in_input=False, sanitize=False, converters=converters,
                              domains=domains)
    # TVM's importer prints every failing node's inputs to stdout; keep that for the debug log.
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            return importer.from_onnx(model.graph, opset)
    except ModelImportError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelImportError(f"TVM's ONNX importer failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if chatter.getvalue():
            logger.debug("importer output:\n%s", chatter.getvalue())


def load_onnx(
    model: onnx.ModelProto | str | os.PathLike[str] | bytes,
    shape: Mapping[str, Sequence[Dim]] | None = None,
    dtype: str | Mapping[str, str] = "float32",
    opset: int | None = None,
    freeze_params: bool = True,
    convert_config: Mapping[str, Any] | None = None,
    export_node_renamed_model_path: str | os.PathLike[str] | None = None,
    *,
    fold_constants: bool = True,
    fold_batch_norms: bool = True,
) -> IRModule:
    """Convert an ONNX model into a Forge IRModule. See :func:`forge.from_onnx`."""
    started = time.perf_counter()
    proto = read_model(model)
    if convert_config is not None:
        warnings.warn(
            "from_onnx: convert_config is not honoured: TVM's Relax ONNX importer has no such options "
            "(matmuls are always converted to Relax matmul).",
            UserWarning,
            stacklevel=3,
        )
    _check_ranks(proto, shape)
    # _apply_dtypes types sequence and optional inputs as tensors, as TVM's importer takes them; ONNX's type
    # inference would then reject the model.
    tensor_io = validation.tensor_typed_io(proto)
    unsorted = not validation.is_sorted(proto)
    if unsorted or _needs_edit(proto, shape, dtype):
        edited = onnx.ModelProto()
        edited.CopyFrom(proto)  # never modify the caller's model
        proto = edited
        repaired = validation.repair_quirks(proto)
        if repaired:
            shown = "; ".join(repaired[:8]) + (f"; and {len(repaired) - 8} more" if len(repaired) > 8 else "")
            warnings.warn(f"from_onnx: {describe_source(model)} deviates from the ONNX spec where onnx.checker "
                          f"accepts it, and is read leniently: {shown}", ModelQuirkWarning, stacklevel=3)
        _name_nodes(proto)
        _name_dims(proto)
        if unsorted:
            validation.sort_nodes(proto)
        if shape:
            _apply_shapes(proto, shape)
        _apply_dtypes(proto, dtype)
        validation.spell_out_defaults(proto)
    if export_node_renamed_model_path is not None:
        _save_atomically(proto, export_node_renamed_model_path)
    inferred = validation.check_model(proto, describe_source(model), infer_types=tensor_io, shapes_given=bool(shape))
    check_operators(proto)
    _check_strings(proto)
    if graph_rewrites.needs_rewrite(proto):
        graph_rewrites.rewrite_sums(proto)
    mod = _convert(proto, opset)
    mod = with_output_names(mod, [output.name for output in proto.graph.output])
    params: dict[str, Any] = {}
    if not freeze_params:
        mod, params = lift_weights(mod)
    ir = build_ir_module(mod, params, proto, describe_source(model), fold_constants=fold_constants,
                         fold_batch_norms=fold_batch_norms)
    validation.check_output_shapes(proto, inferred, [(spec.name, spec.shape) for spec in ir.output_specs])
    logger.info(
        "Imported ONNX model (%d nodes, opset %d) in %.2f s",
        len(proto.graph.node),
        opset or _model_opset(proto),
        time.perf_counter() - started,
    )
    return ir.with_state(is_quantized=True) if is_quantized_model(proto) else ir


QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                           "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
                           "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm",
                           "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def is_quantized_model(proto: onnx.ModelProto) -> bool:
    """Whether the model is already quantized: QDQ pairs, QLinear* or integer operators in its graph."""
    return any(node.op_type in QUANTIZED_OPS for node in proto.graph.node)
