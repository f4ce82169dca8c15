"""Which ONNX operators the importer can convert, checked before conversion starts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import onnx
from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

from forge_core.errors import UnsupportedOperatorError

# Handled by the importer itself rather than through its converter table.
_BUILT_INTO_IMPORTER = {"If", "Constant", "Loop", "Scan"}
# onnxruntime's com.microsoft operators that share their name with an ONNX operator of TVM's table, which
# converts them too. Any other ONNX operator placed in that domain does not exist there.
_MICROSOFT_NAMESAKES = frozenset({"Attention", "Gelu", "QuantizeLinear", "DequantizeLinear", "Range", "Trilu",
                                  "GridSample", "Unique", "Pad", "GatherND"})


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the subgraphs in its attributes (If, Loop, Scan)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_nodes(sub)


def supported_operators() -> set[tuple[str, str]]:
    """``(domain, op_type)`` pairs converted: TVM's table (any domain) and the registered converters."""
    from forge_core.plugin_manager import get_plugin_manager

    registered = set(get_plugin_manager().converters("onnx"))
    tvm_ops = {("*", op) for op in set(_get_convert_map()) | _BUILT_INTO_IMPORTER}
    return registered | tvm_ops


def _microsoft(op_type: str) -> bool:
    """Whether TVM's converter of ``op_type`` converts the com.microsoft operator of that name."""
    return op_type in _MICROSOFT_NAMESAKES or not onnx.defs.has(op_type)


def _display_name(node: onnx.NodeProto) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def check_operators(model: onnx.ModelProto) -> None:
    """Raise one :class:`UnsupportedOperatorError` listing every unsupported op, with counts."""
    known = supported_operators()
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for node in iter_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) in known:
            continue
        if ("*", node.op_type) in known and (domain == "" or domain == "com.microsoft" and _microsoft(node.op_type)):
            continue
        name = _display_name(node)
        counts[name] += 1
        examples.setdefault(name, node.name or f"<unnamed {node.op_type}>")
    if counts:
        domains = sorted({name.rsplit(".", 1)[0] for name in counts if "." in name})
        detail = (
            "A plugin can supply a converter for each of them: a package on the 'forge' entry-point group whose "
            "register_converters hook calls register(\"onnx\", op_type, converter, domain=...) (the README's "
            "Plugins section; `forge plugins` lists the installed ones)."
        )
        if "ai.onnx.ml" in domains:
            detail += (" ai.onnx.ml operators come from scikit-learn exports (skl2onnx, onnxmltools): Forge converts "
                       "the linear models, tree ensembles and preprocessing ones (the README's ONNX-ML section), "
                       "not these yet.")
        raise UnsupportedOperatorError(
            "onnx", {op: (count, examples[op]) for op, count in counts.items()}, detail
        )
