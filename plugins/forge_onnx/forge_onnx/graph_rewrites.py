"""ONNX-level rewrites applied to (a copy of) the model before TVM's importer sees it.

* ``Sum`` of n inputs becomes a chain of n-1 ``Add`` nodes (one ``Identity``
  for n = 1): TVM's importer turns ``Sum`` into broadcast + stack + reduce,
  which does not fuse into the convolution before it (ResNet's residual adds).
"""

from __future__ import annotations

import onnx
from onnx import helper


def needs_rewrite(model: onnx.ModelProto) -> bool:
    return any(node.op_type == "Sum" and node.domain in ("", "ai.onnx") for node in model.graph.node)


def _sum_as_adds(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    inputs, output = list(node.input), node.output[0]
    if len(inputs) == 1:
        return [helper.make_node("Identity", inputs, [output], name=node.name)]
    nodes = []
    running = inputs[0]
    for index, operand in enumerate(inputs[1:], start=1):
        last = index == len(inputs) - 1
        result = output if last else f"{output}__sum_partial_{index}"
        nodes.append(helper.make_node("Add", [running, operand], [result], name=f"{node.name}__add_{index}"
                                      if not last else node.name))
        running = result
    return nodes


def rewrite_sums(model: onnx.ModelProto) -> None:
    """Replace every ``Sum`` node of the main graph in place (see the module docstring)."""
    rewritten: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type == "Sum" and node.domain in ("", "ai.onnx"):
            rewritten.extend(_sum_as_adds(node))
        else:
            rewritten.append(node)
    del model.graph.node[:]
    model.graph.node.extend(rewritten)
