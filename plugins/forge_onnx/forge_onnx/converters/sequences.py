"""SequenceInsert at a negative position, as ONNX defines it.

ONNX counts a negative position from the back: ``n + position`` for a
sequence of ``n`` tensors, so that -1 inserts before the last tensor. TVM's
converter takes ``n + position + 1``, appending at -1, and a model reading the
sequence afterwards computed with the wrong tensor (found by the malformed-model
fuzz corpus on the onnx wheel's ``test_sequence_model3``).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from forge_core.errors import InvalidModelError, UnsupportedFeatureError
from forge_onnx.converters import ConverterContext


def sequence_insert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                    context: ConverterContext) -> relax.Expr:
    """SequenceInsert: the tensor goes to ``position`` (from the back when negative), at the end without one."""
    sequence, tensor = inputs[0], inputs[1]
    length = len(sequence)
    position = inputs[2] if len(inputs) > 2 else None
    if position is None:
        index = length
    elif isinstance(position, tvm.ir.GenericConst):
        index = int(position.value.numpy())
        index = length + index if index < 0 else index
    else:
        raise UnsupportedFeatureError("SequenceInsert's position must be a constant")
    if not 0 <= index <= length:
        raise InvalidModelError(f"SequenceInsert position out of the range [-{length}, {length}] of the sequence")
    items = list(sequence)
    items.insert(index, tensor)
    return relax.Tuple(items)


CONVERTERS = {"SequenceInsert": sequence_insert}
