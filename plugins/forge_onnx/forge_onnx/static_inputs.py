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
    "MaxUnpool": (2,), "Clip": (1, 2), "CumProd": (1,), "BlackmanWindow": (0,), "HannWindow": (0,),
    "HammingWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4), "DFT": (1, 2), "STFT": (1, 3),
}


# Integer arithmetic that carries a shape-like value on to another operator.
SHAPE_ARITHMETIC = {
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Concat", "Gather", "Slice", "Cast", "Squeeze",
    "Unsqueeze", "Identity", "Reshape", "Equal", "Less", "Greater", "Where", "Not", "ReduceProd", "ReduceSum",
    "Mod", "Floor", "Ceil", "Range",
}

_INTEGER_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
                  onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                  onnx.TensorProto.UINT64}


def value_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs whose every use is a value operand: directly, or for integer inputs through shape arithmetic."""
    initializers = {init.name for init in model.graph.initializer}
    integer = {vi.name for vi in model.graph.input if vi.type.tensor_type.elem_type in _INTEGER_TYPES}
    candidates = {vi.name for vi in model.graph.input if vi.name not in initializers}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    outputs = {vi.name for vi in model.graph.output}
    verdict: dict[str, bool] = {}

    def only_values(name: str, depth: int = 0, through_arithmetic: bool = True) -> bool:
        if name in verdict:
            return verdict[name]
        verdict[name] = False  # cycles and deep chains count as data
        uses = consumers.get(name, [])
        if name in outputs or not uses or depth > 32:
            return False
        result = True
        for node, index in uses:
            if index in VALUE_OPERANDS.get(node.op_type, ()):
                continue
            if through_arithmetic and node.op_type in SHAPE_ARITHMETIC and all(
                    only_values(out, depth + 1) for out in node.output):
                continue
            result = False
            break
        verdict[name] = result
        return result

    return {name for name in candidates if only_values(name, through_arithmetic=name in integer)}
