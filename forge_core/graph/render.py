"""Pictures of a :class:`forge.Graph` with Graphviz: operators, shapes, and each weight's size.

:func:`to_dot` needs only the ``graphviz`` Python package; :func:`render` also
runs Graphviz's ``dot`` program (Debian's ``graphviz`` package, which
``./scripts/setup`` installs).

Each graph node is one DOT node, with an id from its topological position
(``n0``, ``n1``...: node names hold ``/``, ``:`` and ``.``) and its name in the
label:

* a call is a box: its operator in bold, its name (shortened when long; the
  whole name is the tooltip), and its output's shape and data type;
* an input is a green ellipse: name, shape and data type;
* a constant (a weight) is a small note, kept apart from the data flow in gray:
  name, shape and size in bytes;
* the output is an orange double octagon.

Edges run from each operand to its consumer (one per operand, so ``x * x``
draws two); edges from constants are thin and gray.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import TYPE_CHECKING

import tvm

from forge_core.errors import ForgeError
from forge_core.ir.weights import format_bytes
from forge_core.runtime.signature import DYNAMIC_DIM

if TYPE_CHECKING:
    import graphviz

    from forge_core.graph.graph import Graph
    from forge_core.graph.node import Node

#: Names longer than this are shortened in the label, keeping both ends.
MAX_NAME_LENGTH = 32

#: Graphs with more nodes than this get bounded network-simplex and crossing
#: minimisation passes: ``dot`` (2.43) then lays out densenet121's 1691 nodes in
#: about 16 s, where its defaults take over 10 minutes. (Lower limits are not
#: faster, and ``nslimit=0.1`` crashed it.)
LARGE_GRAPH = 400

FONT = "Helvetica"

_STYLE: dict[str, dict[str, str]] = {
    "call": {"shape": "box", "style": "rounded,filled", "fillcolor": "#dbe8f7", "color": "#4a6f9c"},
    "input": {"shape": "ellipse", "style": "filled", "fillcolor": "#c9ecc4", "color": "#3f7f38"},
    "constant": {"shape": "note", "style": "filled", "fillcolor": "#f4f4f4", "color": "#9a9a9a",
                 "fontsize": "9", "fontcolor": "#555555", "margin": "0.05,0.02", "height": "0.3"},
    "output": {"shape": "doubleoctagon", "style": "filled", "fillcolor": "#fbd9b0", "color": "#b36b12"},
}
_CONSTANT_EDGE = {"color": "#b0b0b0", "arrowsize": "0.5", "penwidth": "0.7"}

INSTALL_HINT = ("Drawing a graph needs Graphviz's `dot` program: install Graphviz (on Debian or Ubuntu "
                "`apt-get install graphviz`; `./scripts/setup` installs it), or use Graph.to_dot() for the "
                "DOT source")


def shorten(name: str, limit: int = MAX_NAME_LENGTH) -> str:
    """``name``, or its start and end around ``…`` when longer than ``limit`` characters."""
    if len(name) <= limit:
        return name
    tail = (limit - 1) * 2 // 3  # the end of a name tells most: "/layer3/layer3.1/conv2/Conv"
    return name[:limit - 1 - tail] + "…" + name[-tail:]


def describe_type(node: Node) -> str:
    """``"1x64x56x56 float32"``; ``?`` for a dynamic dimension, ``scalar`` for rank 0, ``tuple`` for a tuple."""
    shape, dtype = node.shape, node.dtype
    if shape is None:
        return "tuple" if dtype is None else dtype
    dims = "x".join("?" if d == DYNAMIC_DIM else str(d) for d in shape) if shape else "scalar"
    return f"{dims} {dtype}" if dtype else dims


def nbytes(node: Node) -> int | None:
    """The bytes a tensor node's value takes; None when its shape is dynamic or it is not a tensor."""
    size, dtype = node.size, node.dtype
    if size is None or dtype is None:
        return None
    try:
        dt = tvm.DataType(dtype)
    except Exception:  # noqa: BLE001 - a data type TVM cannot parse has no known size
        return None
    return (size * int(dt.bits) * int(dt.lanes) + 7) // 8


def _html_label(*lines: tuple[str, str]) -> str:
    """A Graphviz HTML-like label, one line per ``(text, style)``; style is ``""``, ``"bold"`` or ``"small"``."""
    parts = []
    for text, style in lines:
        text = html.escape(text, quote=True)
        if style == "bold":
            text = f"<B>{text}</B>"
        elif style == "small":
            text = f'<FONT POINT-SIZE="9" COLOR="#555555">{text}</FONT>'
        parts.append(text)
    return "<" + "<BR/>".join(parts) + ">"


def _label(node: Node) -> str:
    kind = node.type
    name = shorten(node.name)
    if kind == "call":
        return _html_label((node.op_name, "bold"), (name, "small"), (describe_type(node), ""))
    if kind == "constant":
        size = nbytes(node)
        return _html_label((name, ""), (describe_type(node), ""),
                           (format_bytes(size) if size is not None else "? B", "bold"))
    if kind == "input":
        return _html_label(("input", "small"), (name, "bold"), (describe_type(node), ""))
    return _html_label(("output", "small"), (name, "bold"), (describe_type(node), ""))


def _tooltip(node: Node) -> str:
    import graphviz

    text = f"{node.name} ({node.op_name if node.type == 'call' else node.type}): {describe_type(node)}"
    if node.type == "call":
        attrs = ", ".join(f"{k}={shorten(str(v), 80)}" for k, v in node.attrs.items())
        if attrs:
            text += f"\n{attrs}"
    return graphviz.escape(text)


def to_digraph(graph: Graph) -> graphviz.Digraph:
    """The graph as a :class:`graphviz.Digraph` (see the module's docstring for what it shows)."""
    import graphviz

    nodes = graph.nodes
    constants = [n for n in nodes if n.type == "constant"]
    weights = sum(nbytes(n) or 0 for n in constants)
    title = (f"{graph.name}: {sum(1 for n in nodes if n.type == 'call')} calls, "
             f"{len(constants)} constants ({format_bytes(weights)})")
    graph_attr = {"rankdir": "TB", "fontname": FONT, "fontsize": "12", "labelloc": "t",
                  "label": graphviz.escape(title), "nodesep": "0.25", "ranksep": "0.35"}
    if len(nodes) > LARGE_GRAPH:
        graph_attr.update(nslimit="1", nslimit1="1", mclimit="0.3", searchsize="10")
    dot = graphviz.Digraph(name=graphviz.escape(graph.name), graph_attr=graph_attr,
                           node_attr={"fontname": FONT, "fontsize": "11", "margin": "0.12,0.04"},
                           edge_attr={"color": "#555555", "arrowsize": "0.7"})
    ids: dict[str, str] = {}
    for i, node in enumerate(nodes):
        ids[node.name] = node_id = f"n{i}"
        dot.node(node_id, label=_label(node), tooltip=_tooltip(node), **_STYLE[node.type])
    for node in nodes:
        for source in node._record.pred:  # names in argument order, without a Node per operand
            attrs = _CONSTANT_EDGE if graph[source].type == "constant" else {}
            dot.edge(ids[source], ids[node.name], **attrs)
    return dot


def to_dot(graph: Graph) -> str:
    """The graph in Graphviz's DOT language (what :meth:`forge.Graph.to_dot` returns)."""
    return to_digraph(graph).source


def _format_of(path: Path, format: str | None) -> str:  # noqa: A002 - graphviz's name
    import graphviz

    fmt = (format or path.suffix.removeprefix(".")).lower()
    if not fmt:
        raise ForgeError(f"Cannot tell the picture format of {str(path)!r} without a suffix: "
                         "name it .svg, .png or .pdf, or pass format=")
    if fmt not in graphviz.FORMATS:
        raise ForgeError(f"Graphviz cannot write {fmt!r} pictures ({str(path)!r}); use svg, png or pdf")
    return fmt


def render(graph: Graph, path: str | os.PathLike[str], format: str | None = None) -> str:  # noqa: A002
    """Draw ``graph`` to ``path`` with Graphviz's ``dot`` (see :meth:`forge.Graph.render`).

    The format comes from the suffix (``.svg``, ``.png``, ``.pdf``...) unless
    ``format`` is given. The file is replaced atomically: a reader sees the old
    picture or the new one, never a part.

    Returns:
        ``str(path)``.

    Raises:
        ForgeError: Graphviz's ``dot`` is not installed, it failed, or the
            format is unknown.
        FileAccessError: ``path`` cannot be written (it is a directory, its
            directory is read-only, the disk is full); nothing is left behind.
    """
    import graphviz

    path = Path(path)
    fmt = _format_of(path, format)
    source = to_dot(graph)
    try:
        data = graphviz.Source(source).pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise ForgeError(f"Cannot draw graph {graph.name!r} to {str(path)!r}: {INSTALL_HINT}") from None
    except graphviz.CalledProcessError as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise ForgeError(f"Graphviz failed to draw graph {graph.name!r} to {str(path)!r}: "
                         f"{(stderr or '').strip() or exc}") from None
    _write_atomically(path, data)
    return str(path)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it, then :func:`os.replace`
    (:func:`forge_core.files.write_file`: nothing left behind on failure; ``FileAccessError`` names ``path``)."""
    from forge_core.files import write_file

    write_file(path, data)


__all__ = ["format_bytes", "render", "shorten", "to_digraph", "to_dot"]
