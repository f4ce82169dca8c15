"""Graph inputs that only feed operands TVM needs as constants (shapes, axes, pads, k, sizes...).

ONNX lets a model take a Reshape's shape or a ReduceSum's axes as a run-time
input; TVM's importer needs those values when it builds the graph. The ONNX
backend binds such inputs to their values at the first run and compiles one
specialization per distinct value (see ``forge_onnx.backend``).
"""

from __future__ import annotations

import onnx

# op_type -> indices of inputs whose values shape the graph
VALUE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Tile": (1,), "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3), "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "Resize": (1, 2, 3), "Upsample": (1,),
    "Split": (1,), "OneHot": (1, 2), "Range": (0, 1, 2), "CumSum": (1,), "Trilu": (1,), "CenterCropPad": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "NonMaxSuppression": (2, 3, 4), "Col2Im": (1, 2), "AffineGrid": (1,), "SplitToSequence": (1,),
    "MaxUnpool": (2,), "EyeLike": (), "RandomNormalLike": (), "Clip": (1, 2),
}


def value_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs (not initializers) consumed only at value operands of the main graph."""
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = {vi.name for vi in model.graph.input} - initializers
    uses: dict[str, list[bool]] = {name: [] for name in graph_inputs}
    for node in model.graph.node:
        operands = VALUE_OPERANDS.get(node.op_type, ())
        for index, name in enumerate(node.input):
            if name in uses:
                uses[name].append(index in operands)
    outputs = {vi.name for vi in model.graph.output}
    return {name for name, flags in uses.items() if flags and all(flags) and name not in outputs}
