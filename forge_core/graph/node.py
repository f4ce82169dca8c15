"""``forge.Node``: one value of a graph, as the graph API shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from forge_core.graph.index import NodeRecord, tensor_shape

if TYPE_CHECKING:
    from forge_core.graph.graph import Graph


class Node:
    """A value in a :class:`Graph`: a model input, a constant, an operator call, or the output.

    A node is a live view: it reads its graph as the graph is now, so a node
    obtained before an edit still works after it (until it is removed).

    Attributes:
        name: Unique within the graph. Calls are named after their binding (the
            ONNX loader names each after its ONNX node), constants after their
            first consumer and argument (``"conv1.weight"``), the output after
            the graph.
        type: ``"input"``, ``"constant"``, ``"call"`` or ``"output"``.
    """

    __slots__ = ("_graph", "_name")

    def __init__(self, graph: Graph, name: str) -> None:
        self._graph = graph
        self._name = name

    @property
    def _record(self) -> NodeRecord:
        return self._graph._record(self._name)

    @property
    def name(self) -> str:
        """The node's name, unique within its graph."""
        return self._name

    @property
    def type(self) -> str:
        """``"input"``, ``"constant"``, ``"call"`` or ``"output"``."""
        return self._record.type

    @property
    def op_name(self) -> str:
        """The operator of a call (``"nn.conv2d"``, ``"add"``, a subgraph's name); else the node's type."""
        return self._record.op_name

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The value's shape, ``-1`` for a dynamic dimension; None for a tuple or an unknown rank."""
        return tensor_shape(self._record.ty)

    @property
    def dtype(self) -> str | None:
        """The value's data type; None for a tuple."""
        ty = self._record.ty
        return str(ty.dtype) if hasattr(ty, "dtype") and getattr(ty, "ndim", None) is not None else None

    @property
    def size(self) -> int | None:
        """The number of elements; None when the shape is dynamic or not a tensor's."""
        shape = self.shape
        if shape is None or any(d < 0 for d in shape):
            return None
        return int(np.prod(shape, dtype=np.int64))

    @property
    def attrs(self) -> dict[str, Any]:
        """The call's operator attributes and non-tensor arguments, as plain Python (a copy)."""
        return dict(self._record.attrs)

    @property
    def pred(self) -> list[Node]:
        """The nodes this one consumes, in argument order (a tuple argument flattened)."""
        return [Node(self._graph, name) for name in self._record.pred]

    @property
    def succ(self) -> list[Node]:
        """The nodes that consume this one, each once, in topological order."""
        return [Node(self._graph, name) for name in self._graph._index.succ(self._name)]

    @property
    def data(self) -> np.ndarray:
        """A constant's value (a copy). Setting it edits the module.

        The new value must have the node's shape and data type; the module's
        inference function, ``fingerprint`` and compiled artifacts change with
        it, its ``hash()`` does not.

        Raises:
            TypeError: The node is not a constant.
            ValueError: Setting a value of another shape or data type.
        """
        return self._graph._constant_value(self._name)

    @data.setter
    def data(self, value: Any) -> None:
        self._graph._set_constant_value(self._name, value)

    def set_name(self, name: str) -> None:
        """Rename the node; the module's IR is renamed with it.

        Renaming an inline constant moves it into the module's ``params`` under
        the new name, where named weights live.

        Raises:
            ValueError: The name is empty or taken, or the node is the output
                (it is named after its graph).
        """
        self._graph._rename(self._name, name)
        self._name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and other._graph == self._graph and other._name == self._name

    def __hash__(self) -> int:
        return hash((self._graph.name, self._name))

    def __repr__(self) -> str:
        shape = self.shape
        return (f"<forge.Node {self._name!r} {self.type} {self.op_name}"
                f"{'' if shape is None else ' ' + 'x'.join(map(str, shape))}"
                f"{'' if self.dtype is None else ' ' + self.dtype}>")
