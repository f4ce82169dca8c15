"""The graph API: :class:`Graph` and :class:`Node` over an IRModule's functions."""

from forge_core.graph.graph import Graph
from forge_core.graph.node import Node

__all__ = ["Graph", "Node"]
