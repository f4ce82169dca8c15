"""Reading a Relax function as a graph of nodes: inputs, constants, calls and one output.

A node is a value the function computes or receives:

* ``input``: a parameter of the function that is not a weight;
* ``constant``: a constant tensor in the IR, or a parameter whose value is in
  ``IRModule.params``;
* ``call``: a binding, ``name = op(args...)``, named after its variable (the
  ONNX loader names each binding after its ONNX node);
* ``output``: the value the function returns, named after the graph.

Edges run from each operand to its consumer, keyed by the operand's position;
a binding that only renames another variable is the same node as its source.
Names are unique within a graph: a repeated binding name gets ``_1``, ``_2``...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax

from forge_core.ir.introspection import operator_name
from forge_core.runtime.signature import DYNAMIC_DIM

if TYPE_CHECKING:
    import networkx as nx

NODE_TYPES = ("input", "constant", "call", "output")


@dataclass
class NodeRecord:
    """What the index knows of one node (see :class:`forge_core.graph.Node` for the public view)."""

    name: str
    type: str
    op_name: str
    ty: Any
    expr: Any  # the Var (input, param-held constant, call), the GenericConst, or the returned expression
    attrs: dict[str, Any] = field(default_factory=dict)
    pred: list[str] = field(default_factory=list)
    param: str | None = None  # for a constant held in params: its key


@dataclass
class GraphIndex:
    """The nodes of one function in topological order, and their edges as a networkx graph."""

    function: str
    records: dict[str, NodeRecord]
    graph: nx.MultiDiGraph
    by_var: dict[int, str]

    def succ(self, name: str) -> list[str]:
        """Consumers of ``name``, each once, in topological order."""
        return sorted(set(self.graph.successors(name)), key=self.position.__getitem__)

    def __post_init__(self) -> None:
        self.position = {name: i for i, name in enumerate(self.records)}  # each node's topological position


def _handle(obj: Any) -> int:
    return int(obj.__chandle__())


def _is_prim_expr(value: Any) -> bool:
    """A TIR expression (a symbolic dim ``n``, ``n * 2``): TVM 0.27 has no PrimExpr class; its type is a PrimType."""
    return isinstance(value, tvm.ir.Expr) and isinstance(getattr(value, "ty", None), tvm.ir.PrimType)


def python_value(value: Any) -> Any:
    """A TVM attribute or argument value as plain Python (ints, floats, strings, lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tvm.tirx.IntImm):
        return int(value.value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value.value)
    if isinstance(value, relax.ShapeExpr):
        return tuple(python_value(v) for v in value.values)
    if isinstance(value, relax.Tuple):
        return tuple(python_value(v) for v in value.fields)
    if isinstance(value, tvm.ir.GenericConst) and _numel(value.value.shape) <= 1:
        return value.value.numpy().item()
    if type(value).__name__ == "dtype":
        return str(value)
    if isinstance(value, (list, tuple)) or type(value).__name__ in ("Array",):
        return [python_value(v) for v in value]
    if type(value).__name__ == "Map":
        return {str(k): python_value(v) for k, v in value.items()}
    if isinstance(value, tvm.ir.GlobalVar):
        return value.name_hint
    if _is_prim_expr(value) or type(value).__name__ in ("StringImm", "DataTypeImm"):
        inner = getattr(value, "value", None)
        return inner if isinstance(inner, str) else str(value)
    if hasattr(value, "__tvm_ffi_type_info__") and not isinstance(value, relax.Expr):
        try:
            return {f.name: python_value(getattr(value, f.name))
                    for f in type(value).__tvm_ffi_type_info__.fields}
        except Exception:  # noqa: BLE001 - an object without readable fields prints as text
            return str(value)
    return str(value)


def _numel(shape: Any) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def call_attrs(call: relax.Call) -> dict[str, Any]:
    """The call's operator attributes as plain Python."""
    if call.attrs is None:
        return {}
    try:
        fields = type(call.attrs).__tvm_ffi_type_info__.fields
    except AttributeError:
        return {}
    return {f.name: python_value(getattr(call.attrs, f.name)) for f in fields}


def is_tensor_operand(expr: Any) -> bool:
    """True for what becomes an edge: variables, tensor constants, and tuples of them."""
    if isinstance(expr, (relax.Var, tvm.ir.GenericConst)):
        return not isinstance(expr, tvm.ir.GenericConst) or _numel(expr.value.shape) > 1
    if isinstance(expr, relax.Tuple):
        return any(is_tensor_operand(f) for f in expr.fields)
    return False


def tensor_shape(ty: Any) -> tuple[int, ...] | None:
    """A tensor type's shape with dynamic dims as -1; None for tuples and unknown ranks."""
    if not isinstance(ty, relax.TensorType):
        return None
    if isinstance(ty.shape, relax.ShapeExpr):
        return tuple(int(v.value) if isinstance(v, tvm.tirx.IntImm) else DYNAMIC_DIM for v in ty.shape.values)
    if ty.ndim >= 0:
        return (DYNAMIC_DIM,) * ty.ndim
    return None


class _Builder:
    def __init__(self, func_name: str, func: relax.Function, params: Mapping[str, Any]) -> None:
        self.func_name = func_name
        self.func = func
        self.params = params
        self.records: dict[str, NodeRecord] = {}
        self.by_var: dict[int, str] = {}
        self.constants: dict[int, str] = {}
        import networkx as nx  # when a graph is first read, not with `import forge`

        self.graph = nx.MultiDiGraph()

    def unique(self, name: str) -> str:
        name = name or "node"
        if name not in self.records:
            return name
        k = 1
        while f"{name}_{k}" in self.records:
            k += 1
        return f"{name}_{k}"

    def add(self, record: NodeRecord) -> str:
        self.records[record.name] = record
        self.graph.add_node(record.name, type=record.type, op_name=record.op_name,
                            shape=tensor_shape(record.ty), dtype=_dtype(record.ty))
        for index, source in enumerate(record.pred):
            self.graph.add_edge(source, record.name, key=index, index=index)
        return record.name

    def operands(self, expr: Any, consumer: str, arg_name: str) -> list[str]:
        """Node names for a tensor operand, creating constant nodes on first use."""
        if isinstance(expr, relax.Var):
            name = self.by_var.get(_handle(expr))
            if name is None:  # a free variable (a closure's capture): show it as an input
                name = self.add(NodeRecord(self.unique(expr.name), "input", "input", expr.ty, expr))
                self.by_var[_handle(expr)] = name
            return [name]
        if isinstance(expr, tvm.ir.GenericConst):
            key = _handle(expr)
            if key not in self.constants:
                self.constants[key] = self.add(NodeRecord(
                    self.unique(f"{consumer}.{arg_name}"), "constant", "constant", expr.ty, expr))
            return [self.constants[key]]
        if isinstance(expr, relax.Tuple):
            names: list[str] = []
            for i, item in enumerate(expr.fields):
                names += self.operands(item, consumer, f"{arg_name}{i}")
            return names
        return []

    def call_node(self, name: str, value: Any, ty: Any, var: Any) -> None:
        """A node for ``name = value``: its operator, attributes and operands."""
        attrs: dict[str, Any] = {}
        operands: list[tuple[Any, str]] = []
        if isinstance(value, relax.Call):
            op = value.op
            args = list(value.args)
            if isinstance(op, tvm.ir.Op):
                op_name = operator_name(op)
                arg_names = [a.name for a in op.arguments] if len(op.arguments) else []
                if op_name in ("call_tir", "call_dps_packed", "call_tir_with_grad", "call_tir_inplace") and args:
                    attrs["func"] = python_value(args[0]) if not isinstance(args[0], relax.ExternFunc) \
                        else str(args[0].global_symbol)
                    args, arg_names = args[1:], arg_names[1:]
                attrs.update(call_attrs(value))
            elif isinstance(op, tvm.ir.GlobalVar):
                op_name, arg_names = op.name_hint, []
            elif isinstance(op, relax.ExternFunc):
                op_name, arg_names = str(op.global_symbol), []
            else:
                op_name, arg_names = "call", []
            for i, arg in enumerate(args):
                arg_name = arg_names[i] if i < len(arg_names) else f"arg{i}"
                if is_tensor_operand(arg):
                    operands.append((arg, arg_name))
                else:
                    attrs[arg_name] = python_value(arg)
        elif isinstance(value, relax.Tuple):
            op_name = "tuple"
            operands = [(f, f"field{i}") for i, f in enumerate(value.fields)]
        elif isinstance(value, relax.TupleGetItem):
            op_name = "tuple_get_item"
            attrs["index"] = int(value.index)
            operands = [(value.tuple_value, "tuple")]
        elif isinstance(value, relax.If):
            op_name = "if"
            operands = [(value.cond, "cond")]
        elif isinstance(value, relax.ShapeExpr):
            op_name, attrs = "shape", {"value": python_value(value)}
        else:
            op_name = type(value).__name__.lower()
        pred: list[str] = []
        for operand, arg_name in operands:
            pred += self.operands(operand, name, arg_name)
        self.add(NodeRecord(name, "call", op_name, ty, var, attrs, pred))
        self.by_var[_handle(var)] = name

    def build(self) -> GraphIndex:
        for var in self.func.params:
            held = var.name in self.params
            name = self.add(NodeRecord(self.unique(var.name), "constant" if held else "input",
                                       "constant" if held else "input", var.ty, var,
                                       param=var.name if held else None))
            self.by_var[_handle(var)] = name
        body = self.func.body
        blocks = body.blocks if isinstance(body, relax.SeqExpr) else []
        for block in blocks:
            for binding in block.bindings:
                var = binding.var
                if isinstance(binding, relax.MatchCast):
                    name = self.unique(var.name)
                    self.add(NodeRecord(name, "call", "match_cast", var.ty, var, {},
                                        self.operands(binding.value, name, "value")))
                    self.by_var[_handle(var)] = name
                    continue
                value = binding.value
                if isinstance(value, relax.Var) and _handle(value) in self.by_var:
                    self.by_var[_handle(var)] = self.by_var[_handle(value)]  # an alias is its source
                    continue
                if isinstance(value, tvm.ir.GenericConst):
                    name = self.unique(var.name)
                    self.constants[_handle(value)] = name
                    self.add(NodeRecord(name, "constant", "constant", value.ty, value))
                    self.by_var[_handle(var)] = name
                    continue
                self.call_node(self.unique(var.name), value, var.ty, var)
        result = body.body if isinstance(body, relax.SeqExpr) else body
        name = self.unique(self.func_name)
        self.add(NodeRecord(name, "output", "output", self.func.ret_ty, result, {},
                            self.operands(result, name, "value")))
        return GraphIndex(self.func_name, self.records, self.graph, self.by_var)


def _dtype(ty: Any) -> str | None:
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def build_index(func_name: str, func: relax.Function, params: Mapping[str, Any]) -> GraphIndex:
    """Index ``func``: ``params`` are the weights held outside the IR (only ``main`` has them)."""
    return _Builder(func_name, func, params).build()
