"""Folding a node's result to a constant while the graph is imported.

TVM's converters need some operands as constants (a Reshape's shape, a Pad's
pads...). In exported graphs those are often computed from other constants
(Shape -> Gather -> Concat). Forge evaluates a node whose inputs are all
constants right after converting it, so the next converter sees a constant.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

logger = logging.getLogger("forge.onnx")

# Folding materializes the result; a broadcast of a scalar into a huge tensor stays symbolic.
MAX_FOLDED_ELEMENTS = 1 << 22


def _constant_args(bb: relax.BlockBuilder, expr: relax.Expr, depth: int = 0) -> relax.Expr | None:
    """``expr`` rewritten over constants only, or None when it depends on a model input."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr
    if isinstance(expr, (tvm.ir.expr.Constant, relax.ShapeExpr, tvm.ir.StringImm)):
        return expr  # scalar values (IntImm, FloatImm), shapes, strings
    if isinstance(expr, relax.Tuple):
        fields = [_constant_args(bb, f, depth + 1) for f in expr.fields]
        return None if any(f is None for f in fields) else relax.Tuple(fields)
    if isinstance(expr, relax.Var) and depth < 64:
        bound = bb.lookup_binding(expr)
        return None if bound is None else _constant_args(bb, bound, depth + 1)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        args = [_constant_args(bb, a, depth + 1) for a in expr.args]
        if any(a is None for a in args):
            return None
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    return None


def static_shape_constant(shape: relax.ShapeExpr) -> relax.Expr:
    """A static shape value as an int64 constant tensor (which every operator takes); else unchanged.

    TVM's converters turn shape arithmetic on constants into shape values, which
    only a few operators accept ("cannot handle ShapeExpr inputs").
    """
    if not all(isinstance(v, tvm.tirx.IntImm) for v in shape.values):
        return shape
    return relax.const(np.array([int(v.value) for v in shape.values], dtype=np.int64), "int64")


def scalar_float_constant(value: tvm.tirx.FloatImm, inputs: list) -> relax.Expr:
    """A float scalar that TVM computed from shape values, as a 0-d constant tensor.

    TVM evaluates shape arithmetic (Shape -> Gather -> Cast -> Sqrt) to scalar
    values, which binary operators reject beside tensors; and its Pow gives such
    a value in float64 whatever the base's type. The constant takes the type of
    the base (the first float scalar input) when there is one.
    """
    dtype = next((str(i.ty.dtype) for i in inputs if isinstance(i, tvm.tirx.FloatImm)), str(value.ty.dtype))
    return relax.const(np.array(value.value, dtype=dtype), dtype)


def fold_if_constant(bb: relax.BlockBuilder, expr: relax.Expr) -> relax.Expr:
    """A constant equal to ``expr`` when it depends on constants only; else ``expr`` unchanged."""
    ty = getattr(expr, "ty", None)
    if not isinstance(expr, (relax.Var, relax.Call)) or not isinstance(ty, relax.TensorType):
        return expr
    shape = ty.shape
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(v, tvm.tirx.IntImm) for v in shape.values):
        return expr
    elements = 1
    for value in shape.values:
        elements *= int(value.value)
    if elements > MAX_FOLDED_ELEMENTS:
        return expr
    body = _constant_args(bb, expr)
    if body is None or isinstance(body, tvm.ir.GenericConst):
        return body if body is not None else expr
    try:
        mod = tvm.IRModule({"main": relax.Function([], body, ty)})
        # Relax's FoldConstant evaluates call_tir, so legalize the operator first.
        mod = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(mod))
        folded = mod["main"].body
    except Exception as exc:  # noqa: BLE001 - folding is an optimization; the node stays as converted
        logger.debug("could not fold %s: %s", expr, exc)
        return expr
    while isinstance(folded, relax.SeqExpr):
        folded = folded.body
    return folded if isinstance(folded, tvm.ir.GenericConst) else expr
