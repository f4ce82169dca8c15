"""Operands whose symbolic dims Relax cannot prove equal, matched to one another and checked at run time.

A detector with dynamic height and width adds a lateral feature map
``(b, 96, (h - 1) // 16 + 1, ...)`` to an upsampled deeper one
``(b, 96, 2 * ((h - 1) // 32 + 1), ...)``. ONNX requires those dims to be
equal (or one of them 1), and so does the framework the model came from, but
whether they are depends on ``h``: Relax's shape inference gives up, the sum
has only a rank, and nothing after it can be lowered. onnxruntime checks the
dims when it runs. Forge does the same: before the operator is converted, each
operand is match-cast to the dims of the others (``R.match_cast``, a check at
run time that fails with the dims it expected), so the result has a shape
that later operators can use. An input size for which the graph's dims differ
is then an error, as in the framework, never a wrong broadcast.

Only dims that Relax cannot relate are matched: static dims, dims proven
equal and dims that are statically 1 (a broadcast) are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relax, tirx

from forge_onnx.converters.shapes import static_or_symbolic_dims
from forge_onnx.symbolic_values import dims_analyzer

# Operators whose tensor operands broadcast against one another (multidirectional broadcasting).
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "And", "Or", "Xor", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "Where", "PRelu", "BitShift", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor",
})
# Operators whose operands have equal dims on every axis but one (attribute ``axis``).
JOINING = frozenset({"Concat"})


def _dims(value: Any) -> list[tvm.ir.PrimExpr] | None:
    return static_or_symbolic_dims(value) if isinstance(value, relax.Expr) else None


def _is_one(dim: tvm.ir.PrimExpr) -> bool:
    return isinstance(dim, tirx.IntImm) and int(dim.value) == 1


def _matched(bb: relax.BlockBuilder, value: relax.Expr, dims: list[tvm.ir.PrimExpr],
             wanted: dict[int, tvm.ir.PrimExpr]) -> relax.Expr:
    if not wanted:
        return value
    new_dims = [wanted.get(axis, dim) for axis, dim in enumerate(dims)]
    bound = value if isinstance(value, relax.Var) else bb.emit(value)
    return bb.match_cast(bound, relax.TensorType(new_dims, value.ty.dtype))


def _unify(bb: relax.BlockBuilder, operands: Sequence[Any], skip_axis: int | None, broadcast: bool) -> list[Any]:
    shaped = {i: d for i, d in ((i, _dims(v)) for i, v in enumerate(operands)) if d is not None}
    if len(shaped) < 2:
        return list(operands)
    rank = max(len(d) for d in shaped.values())
    if not broadcast and any(len(d) != rank for d in shaped.values()):
        return list(operands)  # ranks differ: the converter's own error names it
    analyzer = dims_analyzer(*[dim for d in shaped.values() for dim in d])
    wanted: dict[int, dict[int, tvm.ir.PrimExpr]] = {i: {} for i in shaped}
    for back in range(1, rank + 1):  # numpy's alignment: from the last axis
        if rank - back == skip_axis:
            continue
        present = [(i, d[len(d) - back]) for i, d in shaped.items() if len(d) >= back]
        sized = [(i, dim) for i, dim in present if not (broadcast and _is_one(dim))]
        if len(sized) < 2:
            continue
        static = [dim for _, dim in sized if isinstance(dim, tirx.IntImm)]
        canonical = static[0] if static else sized[0][1]
        for i, dim in sized:
            if isinstance(dim, tirx.IntImm) or analyzer.can_prove_equal(dim, canonical):
                continue  # static (a mismatch is the converter's error), or the same dim
            wanted[i][len(shaped[i]) - back] = canonical
    result = list(operands)
    for i, d in shaped.items():
        result[i] = _matched(bb, operands[i], d, wanted[i])
    return result


def match_operand_dims(bb: relax.BlockBuilder, op_type: str, inputs: Sequence[Any],
                       attrs: dict[str, Any]) -> Sequence[Any]:
    """``inputs`` with the symbolic dims of a broadcasting or joining operator's operands matched at run time.

    ``inputs`` itself when nothing changes; else a copy of the same type (TVM's converters take a list that
    answers None past its end).
    """
    if op_type in BROADCASTING:
        result = _unify(bb, inputs, None, broadcast=True)
    elif op_type in JOINING:
        ranks = {len(d) for d in (_dims(v) for v in inputs) if d is not None}
        if len(ranks) != 1:
            return inputs
        rank = ranks.pop()
        axis = int(attrs.get("axis", 0))
        result = _unify(bb, inputs, axis + rank if axis < 0 else axis, broadcast=False)
    else:
        return inputs
    if all(a is b for a, b in zip(result, inputs)):
        return inputs
    return type(inputs)(result) if isinstance(inputs, list) else result
