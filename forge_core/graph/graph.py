"""``forge.Graph``: one function of an IRModule as nodes and edges that users read and edit."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm

from forge_core.errors import GraphLookupError, OptionError, OptionTypeError
from forge_core.graph import edit
from forge_core.graph.index import GraphIndex, NodeRecord, build_index
from forge_core.graph.node import Node

if TYPE_CHECKING:
    import networkx as nx

    from forge_core.ir.parts import EditableModule

_ROOT = ("forge.graph.root",)  # a node key no graph uses, for traversals from several sources


class Graph:
    """A computational graph of an :class:`forge.IRModule`: ``ir.main``, or ``ir.graphs[name]``.

    Nodes come in topological order (``iter(graph)``, ``graph.nodes``), and
    edits made through them (:attr:`Node.data`, :meth:`Node.set_name`) change
    the module the graph belongs to. The graph always shows the module as it is
    now; :meth:`copy` gives one that is independent of it.

    Example:
        >>> convs = ir.main.select(op="nn.conv2d")
        >>> w = convs[0].pred[1]            # the weight, a constant node
        >>> w.data = w.data * 0.5           # edits ir in place
        >>> nx_graph = ir.main.to_networkx()
    """

    def __init__(self, owner: EditableModule, name: str) -> None:
        self._owner = owner
        self._name = name
        self._cache: tuple[int, GraphIndex] | None = None

    # -- the index, rebuilt when the module changes ---------------------------------

    @property
    def _index(self) -> GraphIndex:
        version = self._owner.version
        if self._cache is None or self._cache[0] != version:
            mod = self._owner.mod
            if self._name not in [gv.name_hint for gv in mod.functions]:
                raise GraphLookupError(f"The module no longer has a graph named {self._name!r}")
            params = self._owner.params if self._name == "main" else {}
            self._cache = (version, build_index(self._name, mod[self._name], params))
        return self._cache[1]

    def _record(self, name: str) -> NodeRecord:
        records = self._index.records
        if name not in records:
            raise GraphLookupError(self._missing(name))
        return records[name]

    def _missing(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._index.records), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"Graph {self._name!r} has no node named {name!r}{hint}"

    # -- reading ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The graph's name: ``"main"``, or a subgraph's function name."""
        return self._name

    @property
    def nodes(self) -> list[Node]:
        """Every node, in topological order: inputs first, the output last."""
        return [Node(self, name) for name in self._index.records]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self._index.records)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._index.records

    def __getitem__(self, name: str) -> Node:
        return self.find(name)

    @property
    def inputs(self) -> list[Node]:
        """The graph's input nodes, in parameter order (weights held in ``params`` excluded)."""
        return [Node(self, r.name) for r in self._index.records.values() if r.type == "input"]

    @property
    def output(self) -> Node:
        """The graph's output node (its predecessors are the returned values)."""
        return Node(self, next(r.name for r in self._index.records.values() if r.type == "output"))

    def find(self, name: str) -> Node:
        """The node named ``name``.

        Raises:
            KeyError: No such node; the message suggests close names.
        """
        self._record(name)
        return Node(self, name)

    def select(self, op: str | None = None, predicate: Callable[[Node], bool] | None = None,
               type: str | None = None) -> list[Node]:  # noqa: A002 - the Node attribute's name
        """The nodes matching every filter given, in topological order.

        Args:
            op: An operator name, e.g. ``"nn.conv2d"`` (``"relax.nn.conv2d"`` also matches).
            predicate: A function of a node that returns True to keep it.
            type: ``"input"``, ``"constant"``, ``"call"`` or ``"output"``.
        """
        if op is not None:
            op = op.removeprefix("relax.")
        found = []
        for record in self._index.records.values():
            if op is not None and record.op_name != op:
                continue
            if type is not None and record.type != type:
                continue
            node = Node(self, record.name)
            if predicate is not None and not predicate(node):
                continue
            found.append(node)
        return found

    def dfs(self, reverse: bool = False) -> Iterator[Node]:
        """Depth-first, pre-order: from the inputs (then constants) along consumers, or from the output along
        operands when ``reverse`` is True. Each node once; nodes unreachable that way are not visited."""
        import networkx as nx

        for name in nx.dfs_preorder_nodes(self._traversal(reverse), _ROOT):
            if name != _ROOT:
                yield Node(self, name)

    def bfs(self, reverse: bool = False) -> Iterator[Node]:
        """Breadth-first, like :meth:`dfs`: by distance from the inputs, or from the output when ``reverse``."""
        import networkx as nx

        for _, name in nx.bfs_edges(self._traversal(reverse), _ROOT):
            yield Node(self, name)

    def _traversal(self, reverse: bool) -> nx.DiGraph:
        """The edges to follow (a copy), with a root node leading to the sources in order."""
        import networkx as nx

        index = self._index
        graph = nx.DiGraph(index.graph.reverse(copy=False) if reverse else index.graph)
        if reverse:
            sources = [self.output.name]
        else:
            sources = [r.name for r in index.records.values() if r.type == "input"]
            sources += [r.name for r in index.records.values() if r.type == "constant"]
        graph.add_node(_ROOT)
        graph.add_edges_from((_ROOT, s) for s in sources)
        return graph

    def to_networkx(self) -> nx.MultiDiGraph:
        """A networkx copy: nodes keyed by name with ``type``, ``op_name``, ``shape`` and ``dtype``; one edge per
        operand, keyed by its argument position (``index``)."""
        return self._index.graph.copy()

    # -- a picture ----------------------------------------------------------------

    def to_dot(self) -> str:
        """The graph in Graphviz's DOT language: operators, shapes, and each weight's size."""
        from forge_core.graph.render import to_dot

        return to_dot(self)

    def render(self, path: str | Any, format: str | None = None) -> str:  # noqa: A002 - graphviz's name
        """Draw the graph with Graphviz to ``path`` (SVG, PNG or PDF, from the suffix unless ``format``).

        Returns:
            The path written.
        """
        from forge_core.graph.render import render

        return render(self, path, format)

    # -- whole-graph views --------------------------------------------------------

    def _function_module(self) -> tuple[tvm.IRModule, dict[str, Any]]:
        """This graph's function as ``main`` of a module (other functions kept), and its params."""
        mod = self._owner.mod
        if self._name == "main":
            return mod, dict(self._owner.params)
        single = edit.with_function(mod, "main", mod[self._name])
        return single, {}

    @property
    def fingerprint(self) -> str:
        """Hex SHA-256 of this graph's structure and data (its function and the weights it uses)."""
        from forge_core.ir import identity

        mod, params = self._function_module()
        return identity.fingerprint(tvm.IRModule({"main": mod["main"]}), params)

    def copy(self) -> Graph:
        """A graph over a copy of the module: edits to it leave this graph's module unchanged."""
        return self._owner.copy().graphs[self._name]

    def get_inference_function(self, target: str = "llvm") -> Callable[..., np.ndarray | list[np.ndarray]]:
        """A Python callable running this graph alone on numpy arrays, like
        :meth:`forge.IRModule.get_inference_function` (for a subgraph: its inputs in parameter order)."""
        mod, params = self._function_module()
        return self._owner.from_parts(mod, params, state=self._owner._state).get_inference_function(target)

    # -- edits (through the owning module) ---------------------------------------------

    def _constant_value(self, name: str) -> np.ndarray:
        record = self._record(name)
        if record.type != "constant":
            raise OptionTypeError(f"Node {name!r} is {'an' if record.type == 'input' else 'a'} {record.type}, "
                                  "not a constant: only constants hold data")
        if record.param is not None:
            return self._owner.params[record.param].numpy()
        return record.expr.value.numpy()

    def _set_constant_value(self, name: str, value: Any) -> None:
        current = self._constant_value(name)
        array = np.asarray(value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value)
        if array.shape != current.shape:
            raise OptionError(f"Node {name!r} holds shape {current.shape}; the new value has shape {array.shape}")
        if array.dtype != current.dtype:
            raise OptionError(f"Node {name!r} holds dtype {current.dtype}; the new value has dtype {array.dtype} "
                              f"(convert it with .astype('{current.dtype}'))")
        record = self._record(name)
        if record.param is not None:
            params = dict(self._owner.params)
            params[record.param] = tvm.runtime.tensor(np.ascontiguousarray(array.copy()))
            self._owner._commit(params=params)
        else:
            new = edit.as_constant(array, record.expr.value)
            self._owner._commit(mod=edit.replace_constant(self._owner.mod, self._name, record.expr, new))

    def _rename(self, old: str, new: str) -> None:
        record = self._record(old)
        if not isinstance(new, str) or not new:
            raise OptionError(f"A node name must be a non-empty string, given {new!r}")
        if new == old:
            return
        if new in self._index.records:
            raise OptionError(f"Graph {self._name!r} already has a node named {new!r}")
        mod = self._owner.mod
        if record.type == "output":
            raise OptionError(f"Node {old!r} is the output of graph {self._name!r} and is named after it")
        if record.type == "input" or record.param is not None:
            params = None if record.param is None else \
                {new if k == record.param else k: v for k, v in self._owner.params.items()}
            self._owner._commit(mod=edit.rename_parameter(mod, self._name, record.expr.name, new), params=params)
        elif record.type == "constant" and isinstance(record.expr, tvm.ir.GenericConst):
            if self._name != "main":
                raise OptionError(f"Constant {old!r} of subgraph {self._name!r} has no name to change: "
                                  "only main's weights can be named (in params)")
            params = dict(self._owner.params)
            params[new] = record.expr.value
            self._owner._commit(mod=edit.lift_constant(mod, self._name, record.expr, new), params=params)
        else:
            self._owner._commit(mod=edit.rename_binding(mod, self._name, record.expr.name, new))

    # -- display ---------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and other._owner is self._owner and other._name == self._name

    def __hash__(self) -> int:
        return hash((id(self._owner), self._name))

    def __repr__(self) -> str:
        records = self._index.records.values()
        calls = sum(1 for r in records if r.type == "call")
        return (f"<forge.Graph {self._name!r}: {sum(1 for r in records if r.type == 'input')} input(s), "
                f"{calls} call(s), {sum(1 for r in records if r.type == 'constant')} constant(s)>")
