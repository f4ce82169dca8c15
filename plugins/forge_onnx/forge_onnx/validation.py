"""Checks of an ONNX model before TVM's importer sees it: every error names the node, value or field at fault.

TVM's importer takes the model as valid. A malformed one ends inside numpy or
TVM (an initializer whose data does not fill its dims, a value read before it is
produced), or worse, converts into a module that computes something no ONNX
runtime would (an attribute of the wrong type, an int32 tensor where an
operator takes floats). :func:`check_model` raises
:class:`~forge_core.errors.InvalidModelError` for what ONNX forbids and
onnxruntime refuses:

* the model: IR version 3 to ``onnx.IR_VERSION``; each domain imported once, at a
  version >= 1; the default domain's opset at most ``onnx.defs.onnx_opset_version()``;
  every node's domain imported;
* every graph (subgraphs with their outer scope): graph inputs, initializers and
  node names declared once; each value produced once; every node input and graph output
  defined (an acyclic graph out of order is sorted by :func:`sort_nodes`, a cycle is
  an error);
* tensors (initializers, Constant values): a known element type, dims >= 0, data
  that fills the dims;
* the main graph's inputs and outputs: a known element type, dims >= 0;
* nodes of ONNX's own domains: the operator exists at the imported opset and is
  not deprecated there; input and output counts; required inputs not empty;
  attributes known, of their type, the required ones present, flags 0 or 1,
  floats finite (but for Constant, Clip and Pad);
* types: ONNX's type and shape inference, in strict mode, on a copy of the graph
  whose large initializers are graph inputs and whose declared shapes (of graph
  outputs and intermediate values, which Forge does not use) are dropped; no
  value may be inferred with a negative dim, and :func:`check_output_shapes`
  compares the converted module's output shapes with the inferred ones.

Unknown operators are left to :func:`forge_onnx.operator_support.check_operators`.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping

import onnx
from onnx import AttributeProto, TensorProto, defs, helper

from forge_core.errors import InvalidModelError, ModelQuirkWarning

logger = logging.getLogger("forge.onnx")

ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")
"""The domains whose operators ONNX defines, with schemas to check nodes against."""

_ELEM_TYPES = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}
_SUB_BYTE_BITS = {getattr(TensorProto, name): bits
                  for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
                  if hasattr(TensorProto, name)}
_UNKNOWN_PACKING = frozenset(getattr(TensorProto, name) for name in ("FLOAT6E2M3", "FLOAT6E3M2")
                             if hasattr(TensorProto, name))
_INFERENCE_INLINE_LIMIT = 4096  # initializers of more elements become graph inputs in the inference copy
_SHAPE_LENGTH_LIMIT = 1024  # longer 1-D integer inputs have their length left unknown in the inference copy
_FLAGS = frozenset({
    "antialias", "broadcast", "ceil_mode", "center_point_box", "count_include_pad", "detect_negative",
    "detect_positive", "exclude_outside", "exclusive", "fmod", "input_forget", "interleaved", "inverse", "is_causal",
    "is_case_sensitive", "is_test", "keepdims", "largest", "layout", "linear_before_reset", "new_axis",
    "noop_with_empty_axes", "onesided", "periodic", "reverse", "saturate", "select_last_index", "sorted", "spatial",
    "storage_order", "training_mode", "transA", "transB", "upper",
})
"""INT attributes of ONNX's operators that are flags: ONNX defines 0 and 1 only, and runtimes read other values
differently (onnxruntime's ReduceMean takes keepdims=2 as 0, TVM as 1)."""
_ELEM_TYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})
"""INT attributes of ONNX's operators that hold an element type (Cast's ``to``...)."""
_NON_FINITE_ALLOWED = {"Constant": None, "Clip": {"min", "max"}, "Pad": {"value"},
                       "Imputer": {"replaced_value_float", "imputed_value_floats"}}
"""FLOAT attributes that may be infinite or NaN (a Constant's value, Clip's bounds, Pad's value, the value an
Imputer replaces: NaN for a missing value, as scikit-learn's SimpleImputer exports); every other
must be finite: runtimes differ on an Elu of alpha=inf (onnxruntime: inf * (exp(x) - 1) where x < 0; TVM: NaN
everywhere)."""


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _elem_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


def describe_node(node: onnx.NodeProto) -> str:
    """``node 'conv1' (op Conv)``, with the domain when it is not ONNX's default one."""
    domain = _domain(node.domain)
    op = f"{domain}.{node.op_type}" if domain else node.op_type
    return f"node {node.name!r} (op {op})" if node.name else f"an unnamed {op} node"


def subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graphs in a node's attributes (If's branches, Loop's and Scan's bodies), with the attribute's name."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            for sub in attr.graphs:
                yield attr.name, sub


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """The names a graph reads from its outer scope."""
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    free: set[str] = set()
    for node in graph.node:
        free.update(name for name in _reads(node) if name not in defined)
        defined.update(node.output)
    free.update(vi.name for vi in graph.output if vi.name not in defined)
    return free - {""}


def _reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs and what its subgraphs take from the outer scope."""
    names = [name for name in node.input if name]
    for _, sub in subgraphs(node):
        names += sorted(_free_names(sub))
    return names


# ----------------------------------------------------------------------------------------------------
# Topological order
# ----------------------------------------------------------------------------------------------------


def _producers(graph: onnx.GraphProto) -> dict[str, int]:
    producers: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name:
                producers.setdefault(name, index)
    return producers


def _is_sorted(graph: onnx.GraphProto) -> bool:
    producers = _producers(graph)
    for index, node in enumerate(graph.node):
        if any(producers.get(name, -1) >= index for name in _reads(node)):
            return False
        if not all(_is_sorted(sub) for _, sub in subgraphs(node)):
            return False
    return True


def is_sorted(model: onnx.ModelProto) -> bool:
    """Whether every graph's nodes come after the nodes producing what they read, as ONNX requires."""
    return _is_sorted(model.graph)


def _cycle(graph: onnx.GraphProto, left: set[int], deps: list[set[int]]) -> str:
    """A cycle among the nodes ``left``, described from one node to the next."""
    path = [min(left)]
    while True:
        following = min(deps[path[-1]] & left)
        if following in path:
            path = path[path.index(following):] + [following]
            break
        path.append(following)
    producers = _producers(graph)
    steps = []
    for reader, producer in zip(path, path[1:]):
        value = next(name for name in _reads(graph.node[reader]) if producers.get(name) == producer)
        steps.append(f"{describe_node(graph.node[reader])} reads {value!r} of {describe_node(graph.node[producer])}")
    return ", which ".join(steps)


def _sort_graph(graph: onnx.GraphProto, where: str) -> None:
    producers = _producers(graph)
    deps = [{producers[name] for name in _reads(node) if name in producers} for node in graph.node]
    for node in graph.node:
        for attr, sub in subgraphs(node):
            _sort_graph(sub, f"{where}{describe_node(node)}, attribute {attr!r}: ")
    if _is_sorted_by(deps):
        return
    users: list[list[int]] = [[] for _ in graph.node]
    waiting = [len(d) for d in deps]
    for index, d in enumerate(deps):
        for dep in d:
            users[dep].append(index)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(graph.node):
        left = set(range(len(graph.node))) - set(order)
        raise InvalidModelError(f"{where}the graph has a cycle: {_cycle(graph, left, deps)}")
    nodes = [graph.node[i] for i in order]
    copies = [onnx.NodeProto() for _ in nodes]
    for fresh, node in zip(copies, nodes):
        fresh.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def _is_sorted_by(deps: list[set[int]]) -> bool:
    return all(dep < index for index, d in enumerate(deps) for dep in d)


def sort_nodes(model: onnx.ModelProto) -> None:
    """Put every graph's nodes in topological order, in place (the order among independent nodes kept).

    Raises:
        InvalidModelError: The nodes form a cycle; the message follows it from node to node.
    """
    _sort_graph(model.graph, "")


# ----------------------------------------------------------------------------------------------------
# Tensors and value types
# ----------------------------------------------------------------------------------------------------


def _typed_data_length(tensor: TensorProto, elements: int) -> tuple[str, int, int]:
    """``(field, length, expected length)`` of a tensor's typed data field (``float_data``...)."""
    field = helper.tensor_dtype_to_field(tensor.data_type)
    length = len(getattr(tensor, field))
    if tensor.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        expected = 2 * elements
    elif tensor.data_type in _SUB_BYTE_BITS:
        expected = math.ceil(elements * _SUB_BYTE_BITS[tensor.data_type] / 8)
    else:
        expected = elements
    return field, length, expected


def check_tensor(tensor: TensorProto, what: str) -> None:
    """A tensor's element type is known, its dims are >= 0 and its data fills them.

    Args:
        tensor: An initializer or a Constant node's value.
        what: How errors name it, e.g. ``"initializer 'w1'"``.

    Raises:
        InvalidModelError: Naming the tensor, its dims and what its data holds.
    """
    if tensor.data_type not in _ELEM_TYPES:
        raise InvalidModelError(f"{what} has data_type {tensor.data_type} ({_elem_name(tensor.data_type)}), "
                                "which is not an ONNX element type")
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise InvalidModelError(f"{what} has a negative dimension: dims {dims}")
    if tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        raise InvalidModelError(f"{what} keeps its data in an external file ({location!r}) that was not loaded; "
                                "give from_onnx the .onnx file's path, beside its data file")
    if tensor.data_type in _UNKNOWN_PACKING:
        return
    elements = math.prod(dims)
    name = _elem_name(tensor.data_type)
    if tensor.HasField("raw_data"):
        if tensor.data_type == TensorProto.STRING:
            raise InvalidModelError(f"{what} is a STRING tensor with raw_data; strings go in string_data")
        bits = _SUB_BYTE_BITS.get(tensor.data_type, 8 * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize)
        expected = math.ceil(elements * bits / 8)
        if len(tensor.raw_data) != expected:
            raise InvalidModelError(f"{what} has dims {dims} of {name}: {expected} bytes of raw_data, "
                                    f"but it holds {len(tensor.raw_data)}")
        return
    field, length, expected = _typed_data_length(tensor, elements)
    if length != expected:
        raise InvalidModelError(f"{what} has dims {dims} of {name}: {expected} values in {field}, "
                                f"but it holds {length}")


def _check_value(value: onnx.ValueInfoProto, what: str, typed: bool) -> None:
    """A graph input's or output's element type is an ONNX one (or, where ``typed`` is False, unset), dims >= 0."""
    if not value.type.HasField("tensor_type"):
        return
    tensor_type = value.type.tensor_type
    elem = tensor_type.elem_type
    if elem != TensorProto.UNDEFINED and elem not in _ELEM_TYPES:
        raise InvalidModelError(f"{what} {value.name!r} has elem_type {elem}, which is not an ONNX element type")
    if typed and elem == TensorProto.UNDEFINED:
        raise InvalidModelError(f"{what} {value.name!r} has no element type (elem_type 0); give it with "
                                f"from_onnx(dtype={{{value.name!r}: ...}})")
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value < 0:
            raise InvalidModelError(f"{what} {value.name!r} has a negative dimension: dims[{axis}] = {dim.dim_value}")


def _value_types(graph: onnx.GraphProto, where: str) -> Iterator[tuple[str, onnx.ValueInfoProto]]:
    for what, values in (("graph input", graph.input), ("graph output", graph.output),
                         ("value", graph.value_info)):
        for value in values:
            yield f"{where}{what}", value
    for node in graph.node:
        for attr_name, sub in subgraphs(node):
            yield from _value_types(sub, f"{where}{describe_node(node)}, attribute {attr_name!r}: ")


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from _graphs(sub)


def exporter_quirks(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has a deviation from the spec that ``onnx.checker`` accepts and :func:`repair_quirks`
    repairs (onnxruntime accepts the negative dims too; it refuses a graph with a node name twice)."""
    for _, value in _value_types(model.graph, ""):
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in value.type.tensor_type.shape.dim):
            return True
    for graph in _graphs(model.graph):
        names = [node.name for node in graph.node if node.name]
        if len(names) != len(set(names)):
            return True
    return False


def _unspelled_defaults(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """STFT nodes without ``onesided``: the spec's default is 1 (onnxruntime computes so), and ONNX 1.23's shape
    inference takes 0, inferring twice the bins; the output check then refused every such model."""
    return [node for graph in _graphs(model.graph) for node in graph.node
            if node.op_type == "STFT" and node.domain in ("", "ai.onnx")
            and not any(attr.name == "onesided" for attr in node.attribute)]


def needs_defaults(model: onnx.ModelProto) -> bool:
    return bool(_unspelled_defaults(model))


def spell_out_defaults(model: onnx.ModelProto) -> None:
    """Write the attributes whose spec default ONNX's shape inference gets wrong (see :func:`_unspelled_defaults`)
    into ``model``, a copy the caller owns; nothing the model computes changes."""
    for node in _unspelled_defaults(model):
        node.attribute.append(helper.make_attribute("onesided", 1))


def repair_quirks(model: onnx.ModelProto) -> list[str]:
    """Read ``model`` (a copy the caller owns) leniently; what was repaired, one line each.

    * A negative dim in a value type (Paddle2ONNX writes ``-1`` for a dynamic
      one) becomes a dynamic dim.
    * A node name given twice in a graph (spox names every anonymous node
      ``F0::anon``) is made unique: the second becomes ``<name>_1``, and so on.
    """
    repaired: list[str] = []
    for what, value in _value_types(model.graph, ""):
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                repaired.append(f"{what} {value.name!r}: dims[{axis}] = {dim.dim_value} read as a dynamic dim")
                dim.Clear()
    taken = {node.name for graph in _graphs(model.graph) for node in graph.node}
    for graph in _graphs(model.graph):
        seen: set[str] = set()
        for node in graph.node:
            if not node.name:
                continue
            if node.name in seen:
                index = 1
                while f"{node.name}_{index}" in taken:
                    index += 1
                renamed = f"{node.name}_{index}"
                repaired.append(f"a second node named {node.name!r} (op {node.op_type}) renamed {renamed!r}")
                node.name = renamed
                taken.add(renamed)
            seen.add(node.name)
    return repaired


def _check_attribute(attr: AttributeProto, label: str) -> None:
    """Any node's attribute (whatever its domain) has a type, and its text is UTF-8."""
    if attr.type == AttributeProto.UNDEFINED or attr.type not in AttributeProto.AttributeType.values():
        raise InvalidModelError(f"{label}: attribute {attr.name!r} has no type (type {attr.type})")
    texts = [attr.s] if attr.type == AttributeProto.STRING else list(attr.strings)
    for text in texts:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidModelError(f"{label}: attribute {attr.name!r} is not UTF-8 text: {text[:60]!r}") from None


def _check_default(tensor: TensorProto, value: onnx.ValueInfoProto, where: str) -> None:
    """An initializer that is also a graph input (its default value) has the input's element type and dims."""
    if not value.type.HasField("tensor_type"):
        return
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type not in (TensorProto.UNDEFINED, tensor.data_type):
        raise InvalidModelError(f"{where}initializer {tensor.name!r} is {_elem_name(tensor.data_type)}, and the "
                                f"graph input of that name declares {_elem_name(tensor_type.elem_type)}")
    if not tensor_type.HasField("shape"):
        return
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if len(dims) != len(tensor.dims) or any(d is not None and d != t for d, t in zip(dims, tensor.dims)):
        shown = [d if d is not None else "?" for d in dims]
        raise InvalidModelError(f"{where}initializer {tensor.name!r} has dims {list(tensor.dims)}, and the graph "
                                f"input of that name declares {shown}")


# ----------------------------------------------------------------------------------------------------
# Model, graphs, nodes
# ----------------------------------------------------------------------------------------------------


def _opsets(model: onnx.ModelProto, source: str) -> dict[str, int]:
    """Domain -> imported version, each domain once and at a version >= 1."""
    opsets: dict[str, int] = {}
    for entry in model.opset_import:
        domain = _domain(entry.domain)
        shown = repr(entry.domain)
        if domain in opsets and opsets[domain] != entry.version:
            # The same version twice is accepted (skl2onnx writes the domain '' twice at one version); two versions
            # are ambiguous (onnxruntime reads the last, and rejects old ones such a listing can bring in).
            raise InvalidModelError(f"{source}: opset_import lists the domain {shown} twice "
                                    f"(versions {opsets[domain]} and {entry.version})")
        if entry.version < 1:
            raise InvalidModelError(f"{source}: opset_import gives the domain {shown} version {entry.version}; "
                                    "opset versions start at 1")
        opsets[domain] = int(entry.version)
    newest = defs.onnx_opset_version()
    if opsets.get("", 0) > newest:
        raise InvalidModelError(f"{source}: opset_import asks for opset {opsets['']} of the default ONNX domain; "
                                f"the newest this Forge knows (onnx {onnx.__version__}) is {newest}")
    return opsets


def _check_schema(node: onnx.NodeProto, opsets: Mapping[str, int], where: str) -> None:
    """A node of ONNX's domains against its operator's schema at the imported opset."""
    domain = _domain(node.domain)
    if domain not in ONNX_DOMAINS or not defs.has(node.op_type, domain):
        return
    label = f"{where}{describe_node(node)}"
    version = opsets[domain]
    try:
        schema = defs.get_schema(node.op_type, version, domain)
    except defs.SchemaError:
        first = min(s.since_version for s in defs.get_all_schemas_with_history()
                    if s.name == node.op_type and s.domain == domain)
        raise InvalidModelError(f"{label}: {node.op_type} is not in opset {version} of domain {node.domain!r}; "
                                f"it first appears in opset {first}") from None
    name = f"{node.op_type}-{schema.since_version}"
    if schema.deprecated:
        raise InvalidModelError(f"{label}: {node.op_type} is deprecated in opset {version} "
                                f"(since opset {schema.since_version})")
    if not schema.min_input <= len(node.input) <= schema.max_input:
        raise InvalidModelError(f"{label} has {len(node.input)} inputs; {name} takes "
                                f"{_count_range(schema.min_input, schema.max_input)}")
    for slot, value in enumerate(node.input):
        formal = schema.inputs[min(slot, len(schema.inputs) - 1)] if schema.inputs else None
        if not value and formal is not None and formal.option != defs.OpSchema.FormalParameterOption.Optional:
            raise InvalidModelError(f"{label}: input {slot} ({formal.name}) is required, and its name is empty")
    if not schema.min_output <= len(node.output) <= schema.max_output:
        raise InvalidModelError(f"{label} has {len(node.output)} outputs; {name} gives "
                                f"{_count_range(schema.min_output, schema.max_output)}")
    given = {attr.name for attr in node.attribute}
    for attr in node.attribute:
        spec = schema.attributes.get(attr.name)
        if spec is None:
            raise InvalidModelError(f"{label} has the attribute {attr.name!r}, which {name} does not have"
                                    + (f"; it has {', '.join(sorted(schema.attributes))}" if schema.attributes
                                       else ""))
        if attr.type != int(spec.type.value):
            got = AttributeProto.AttributeType.Name(attr.type) if attr.type in AttributeProto.AttributeType.values() \
                else str(attr.type)
            raise InvalidModelError(f"{label}: attribute {attr.name!r} is of type {got}; {name} takes "
                                    f"{spec.type.name}")
        if attr.name in _ELEM_TYPE_ATTRS and attr.type == AttributeProto.INT and attr.i not in _ELEM_TYPES \
                and not (attr.name == "output_dtype" and attr.i == TensorProto.UNDEFINED):
            raise InvalidModelError(f"{label}: attribute {attr.name!r} is {attr.i}, which is not an ONNX element "
                                    "type")
        if attr.name in _FLAGS and attr.type == AttributeProto.INT and attr.i not in (0, 1):
            raise InvalidModelError(f"{label}: attribute {attr.name!r} is {attr.i}; it is a flag, 0 or 1")
        if attr.type in (AttributeProto.FLOAT, AttributeProto.FLOATS) and not _may_be_non_finite(node.op_type,
                                                                                                   attr.name):
            values = [attr.f] if attr.type == AttributeProto.FLOAT else list(attr.floats)
            if not all(math.isfinite(v) for v in values):
                shown = values[0] if attr.type == AttributeProto.FLOAT else values
                raise InvalidModelError(f"{label}: attribute {attr.name!r} is {shown}; {name} takes finite values")
    missing = sorted(a for a, spec in schema.attributes.items() if spec.required and a not in given)
    if missing:
        raise InvalidModelError(f"{label} lacks the required attribute{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(map(repr, missing))} of {name}")


def _may_be_non_finite(op_type: str, attribute: str) -> bool:
    allowed = _NON_FINITE_ALLOWED.get(op_type, set())
    return allowed is None or attribute in allowed


def _count_range(low: int, high: int) -> str:
    if low == high:
        return str(low)
    return f"{low} or more" if high >= 2**31 - 1 else f"{low} to {high}"


def _check_graph(graph: onnx.GraphProto, outer: frozenset[str], opsets: Mapping[str, int], where: str,
                 main: bool) -> None:
    """One graph (nodes in topological order by now), then its subgraphs with this one as their outer scope."""
    inputs: set[str] = set()
    defaults = {t.name for t in graph.initializer}
    for value in graph.input:
        if value.name in inputs:
            raise InvalidModelError(f"{where}the graph input {value.name!r} is declared twice")
        inputs.add(value.name)
        if main:
            _check_value(value, f"{where}graph input", typed=value.name not in defaults)
    initializers: set[str] = set()
    declared = {value.name: value for value in graph.input}
    for tensor in graph.initializer:
        if tensor.name in initializers:
            raise InvalidModelError(f"{where}the initializer {tensor.name!r} is given twice")
        initializers.add(tensor.name)
        check_tensor(tensor, f"{where}initializer {tensor.name!r}")
        if tensor.name in declared:
            _check_default(tensor, declared[tensor.name], where)
    for sparse in graph.sparse_initializer:
        if sparse.values.name in initializers:
            raise InvalidModelError(f"{where}the initializer {sparse.values.name!r} is given twice")
        initializers.add(sparse.values.name)
    defined = inputs | initializers
    node_names: set[str] = set()
    for node in graph.node:
        label = f"{where}{describe_node(node)}"
        if not node.op_type:
            outputs = ", ".join(repr(name) for name in node.output) or "none"
            raise InvalidModelError(f"{where}node {node.name!r} (outputs {outputs}) has no op_type")
        if node.name in node_names:
            raise InvalidModelError(f"{where}two nodes are named {node.name!r}; node names are unique in a graph")
        node_names.add(node.name)
        for slot, name in enumerate(node.input):
            if name and name not in defined and name not in outer:
                raise InvalidModelError(f"{label}: input {slot} is {name!r}, which no node, graph input or "
                                        "initializer defines")
        if _domain(node.domain) not in opsets:
            raise InvalidModelError(f"{label}: the model imports no opset of its domain {node.domain!r} "
                                    "(opset_import)")
        for attr in node.attribute:
            _check_attribute(attr, label)
        _check_schema(node, opsets, where)
        for attr in node.attribute:
            if attr.type == AttributeProto.TENSOR:
                check_tensor(attr.t, f"{label}: attribute {attr.name!r}")
        for attr_name, sub in subgraphs(node):
            _check_graph(sub, outer | defined, opsets, f"{label}, attribute {attr_name!r}: ", main=False)
        for name in node.output:
            if not name:
                continue
            if name in defined or name in outer:
                raise InvalidModelError(f"{label}: output {name!r} is already defined (by a graph input, an "
                                        "initializer or another node); ONNX values are assigned once")
            defined.add(name)
    for value in graph.output:
        if not value.name or (value.name not in defined and value.name not in outer):
            raise InvalidModelError(f"{where}the graph output {value.name!r} is not produced by any node, graph "
                                    "input or initializer")
        if main:
            _check_value(value, f"{where}graph output", typed=False)


def _inference_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model for type inference: large initializers as graph inputs, no declared output or value shapes."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    graph, source = light.graph, model.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    declared = {vi.name for vi in source.input}
    for tensor in source.initializer:
        if math.prod(tensor.dims) <= _INFERENCE_INLINE_LIMIT:
            graph.initializer.append(tensor)
        elif tensor.name not in declared:
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for value in graph.input:
        # A long 1-D integer tensor may be a shape operand (Expand's, Reshape's): ONNX's inference would build an
        # output of that rank, dim by dim (2**40 of them: it never returns). Its length is left unknown.
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []
        if value.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.INT32) and len(dims) == 1 \
                and dims[0].dim_value > _SHAPE_LENGTH_LIMIT:
            dims[0].dim_param = f"{value.name}__length"
    for target, values in ((graph.output, source.output), (graph.value_info, source.value_info)):
        for value in values:
            kept = target.add()
            kept.CopyFrom(value)
            if kept.type.HasField("tensor_type"):
                kept.type.tensor_type.ClearField("shape")
    return light


def tensor_typed_io(model: onnx.ModelProto) -> bool:
    """Whether every graph input and output is a tensor (or untyped): not a sequence, an optional or a map."""
    return all(value.type.WhichOneof("value") in (None, "tensor_type")
               for value in [*model.graph.input, *model.graph.output])


_NESTED = re.compile(r"\(op_type:([\w.]+)[^)]*\): \[\w+\] Inference error\(s\): \(op_type:")


def _inside_function(detail: str, opsets: Mapping[str, int]) -> bool:
    """Whether an inference error is inside the function body ONNX expands an operator into (MVN's Constant
    with an attribute reference fails ONNX's own strict inference)."""
    match = _NESTED.search(detail)
    if match is None or not defs.has(match.group(1)):
        return False
    try:
        schema = defs.get_schema(match.group(1), opsets.get("", 1), "")
    except defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


Shape = tuple[int | None, ...]


def _static_shape(value: onnx.ValueInfoProto) -> Shape | None:
    """A value's dims (None for a dim not known), or None when not even its rank is known."""
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim)


def _check_types(model: onnx.ModelProto, opsets: Mapping[str, int], source: str,
                 shapes_given: bool = False) -> dict[str, Shape]:
    """ONNX's strict type and shape inference; a value inferred with a negative dim is an error too.

    Returns:
        The graph outputs' inferred shapes (where the rank is known).
    """
    light = _inference_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        detail = " ".join(str(exc).split())
        if _inside_function(detail, opsets):
            logger.debug("type inference error inside a function body, not the model's: %s", detail)
            return {}
        if not shapes_given:
            raise InvalidModelError(f"{source}: ONNX type and shape inference rejects the model: {detail}") from exc
        try:
            # The model's dims made static by the user's shape=: ONNX's strict inference then meets what it
            # cannot follow through computed dims (onnx-asr's preprocessors at 16000 samples: an STFT window,
            # MatMuls over computed dims), where onnxruntime, which never sees static dims at load, runs the
            # model. Without strict mode it skips those and still checks the types.
            inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=False)
        except Exception:  # noqa: BLE001 - a type error: onnxruntime refuses the model too
            raise InvalidModelError(f"{source}: ONNX type and shape inference rejects the model: {detail}") from exc
        warnings.warn(f"{source}: with the given shapes, ONNX's strict shape inference disagrees with the model "
                      f"({detail}); onnxruntime runs it, and Forge reads it on (its converters check the shapes "
                      "they take)", ModelQuirkWarning, stacklevel=4)
    except Exception as exc:  # noqa: BLE001 - the inference's own limits (size...) do not make the model invalid
        logger.debug("type inference skipped: %s: %s", type(exc).__name__, exc)
        return {}
    producers = {name: node for node in model.graph.node for name in node.output if name}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        shape = _static_shape(value)
        if shape is not None and any(d is not None and d < 0 for d in shape) and value.name in producers:
            dims = [d if d is not None else "?" for d in shape]
            raise InvalidModelError(f"{describe_node(producers[value.name])}: its output {value.name!r} would have "
                                    f"dims {dims} (ONNX's shape inference): its attributes do not fit its inputs")
    return {value.name: shape for value in inferred.graph.output if (shape := _static_shape(value)) is not None}


def check_model(model: onnx.ModelProto, source: str, infer_types: bool = True,
                shapes_given: bool = False) -> dict[str, Shape]:
    """Check a model as described in the module's docstring; its nodes must be named and sorted by now.

    Args:
        model: The model, after Forge named its nodes and applied the user's shapes and dtypes.
        source: How errors about the whole model name it (the file, or "the given ModelProto").
        infer_types: Whether to run ONNX's type inference (not where Forge retyped sequence or optional
            graph inputs as tensors, see :func:`tensor_typed_io`).
        shapes_given: Whether the user's ``shape=`` made dims static: a disagreement of ONNX's strict shape
            inference is then a warning (see :func:`_check_types`).

    Returns:
        The shapes ONNX's shape inference gives the graph outputs (where it knows their rank), for
        :func:`check_output_shapes`.

    Raises:
        InvalidModelError: Naming the node, value or field at fault.
    """
    if model.ir_version > onnx.IR_VERSION:
        raise InvalidModelError(f"{source} has ONNX IR version {model.ir_version}; the newest this Forge reads "
                                f"(onnx {onnx.__version__}) is {onnx.IR_VERSION}")
    opsets = _opsets(model, source)
    _check_graph(model.graph, frozenset(), opsets, "", main=True)
    return _check_types(model, opsets, source, shapes_given) if infer_types else {}


def check_output_shapes(model: onnx.ModelProto, inferred: Mapping[str, Shape],
                        converted: Iterable[tuple[str, tuple[int, ...] | None]]) -> None:
    """The converted module's output shapes agree with ONNX's shape inference wherever both are static.

    TVM and ONNX differ on edge cases that ONNX leaves loose (a pooling window larger than its padded
    input: TVM gives no output element, ONNX and onnxruntime one); the module would compute something
    else than the model's reference.

    Args:
        model: The checked model.
        inferred: What :func:`check_model` returned.
        converted: ``(name, shape)`` of each output of the converted module, ``-1`` for a dynamic dim.

    Raises:
        InvalidModelError: Naming the output, the node producing it and both shapes.
    """
    producers = {name: node for node in model.graph.node for name in node.output if name}
    for name, shape in converted:
        expected = inferred.get(name)
        if expected is None or shape is None or None in expected or any(d < 0 for d in shape):
            continue
        if tuple(shape) != tuple(expected):
            node = f"{describe_node(producers[name])}: " if name in producers else ""
            raise InvalidModelError(f"{node}output {name!r} converts to shape {tuple(shape)}, where ONNX's shape "
                                    f"inference gives {tuple(expected)}: an attribute or input outside what TVM "
                                    "and ONNX agree on")
