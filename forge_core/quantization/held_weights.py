"""Constant folding that keeps a quantized model's integer weights.

A QDQ model reads each quantized weight as ``dequantize(w_q, scale,
zero_point)`` with all three constant. Relax's ``FoldConstant`` evaluates that
call into a float32 constant, and the integer weight is gone: the integer
lowering (:mod:`forge_core.quantization.lowering`) can no longer compute the
operator as uint8 x int8. A model that arrives quantized (onnxruntime's
``quantize_static`` output) goes through constant folding on import, and
Forge's own quantized modules go through it after ``set_batch_size``.

:func:`fold_constants` folds everything else as ``FoldConstant`` does, and
leaves the ``dequantize`` of an integer constant in place where it is read as
an operator's weight: the weight of ``conv2d``, the right-hand side of
``matmul``, or that right-hand side transposed first (ONNX ``Gemm`` with
``transB``). The integer lowering reads those; it evaluates whichever it
cannot lower itself (:func:`fold_dequantized_constants`), so no weight is
dequantized at run time.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from forge_core.graph.index import _handle
from forge_core.ir.constant_arithmetic import fold_arithmetic, fold_constant
from forge_core.passes import map_bindings

_INTEGER_DTYPES = frozenset({"int8", "uint8", "int16", "int32"})


def op_name(call: relax.Expr) -> str:
    """The operator's full name (``relax.nn.conv2d``) of a call to one; ``""`` for anything else."""
    return str(call.op.name) if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else ""


def is_dequantized_constant(value: relax.Expr) -> bool:
    """``dequantize(c, scale, zero_point)`` with an integer constant ``c`` and constant parameters."""
    return (op_name(value) == "relax.dequantize"
            and all(isinstance(a, tvm.ir.GenericConst) for a in value.args)
            and str(value.args[0].ty.dtype) in _INTEGER_DTYPES)


def _readers(func: relax.Function) -> tuple[dict[int, relax.Var], dict[int, list[tuple[relax.Expr, int]]]]:
    """The variable bound to each call, and each variable's readers with the argument position it is read at
    (-1: not as a call's argument, e.g. in a tuple or as the function's result)."""
    var_of: dict[int, relax.Var] = {}
    readers: dict[int, list[tuple[relax.Expr, int]]] = {}

    def read(arg: relax.Expr, reader: relax.Expr, position: int) -> None:
        if isinstance(arg, relax.Var):
            readers.setdefault(_handle(arg), []).append((reader, position))
        elif isinstance(arg, relax.Tuple):
            for field in arg.fields:
                read(field, reader, -1)

    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            var_of[_handle(value)] = binding.var
            if isinstance(value, relax.Call):
                for position, arg in enumerate(value.args):
                    read(arg, value, position)
            else:
                read(value, value, -1)
    read(func.body.body, func.body.body, -1)
    return var_of, readers


def held_weights(func: relax.Function) -> list[relax.Var]:
    """The bindings of ``func`` that :func:`fold_constants` keeps: dequantized integer constants read as weights."""
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr) or (
            func.attrs is not None and ("Codegen" in func.attrs or "Composite" in func.attrs)):
        return []  # a partition's signature is its callers': it keeps its parameters
    var_of, readers = _readers(func)

    def read_as_weight(var: relax.Var, transposed_ok: bool) -> bool:
        uses = readers.get(_handle(var), [])
        for reader, position in uses:
            name = op_name(reader)
            if name in ("relax.nn.conv2d", "relax.matmul") and position == 1:
                continue
            if transposed_ok and name == "relax.permute_dims" and _handle(reader) in var_of \
                    and read_as_weight(var_of[_handle(reader)], False):
                continue
            return False
        return bool(uses)

    return [b.var for block in func.body.blocks for b in block.bindings
            if isinstance(b, relax.VarBinding) and is_dequantized_constant(b.value) and read_as_weight(b.var, True)]


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Relax's ``FoldConstant``, except the quantized weights of :func:`held_weights` stay ``dequantize(w_q)``.

    Each held weight's integer constant becomes a parameter of its function
    while ``FoldConstant`` runs (an input is not folded), and is bound back after.
    """
    held: dict[tvm.ir.GlobalVar, dict[int, tuple[relax.Var, tvm.runtime.Tensor]]] = {}
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        weights = held_weights(func) if isinstance(func, relax.Function) else []
        if not weights:
            continue
        chosen = {_handle(v) for v in weights}
        stand_ins: dict[int, tuple[relax.Var, tvm.runtime.Tensor]] = {}

        def swap(binding: relax.Binding) -> relax.Binding:
            if not isinstance(binding, relax.VarBinding) or _handle(binding.var) not in chosen:
                return binding
            call = binding.value
            constant = call.args[0]
            stand_in = relax.Var(f"{binding.var.name}_held", constant.ty)
            stand_ins[_handle(stand_in)] = (stand_in, constant.value)
            value = relax.Call(call.op, [stand_in, *call.args[1:]], call.attrs)
            return relax.VarBinding(binding.var, value)

        body = map_bindings(func.body, swap)
        params = [*func.params, *(var for var, _ in stand_ins.values())]
        updated[gv] = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)
        held[gv] = stand_ins
    folded = fold_constant(fold_arithmetic(updated))
    for gv, stand_ins in held.items():
        func = folded[gv.name_hint]
        # Bound by variable: the names are only hints.
        bound = {p: stand_ins[_handle(p)][1] for p in func.params if _handle(p) in stand_ins}
        folded[gv.name_hint] = func.bind_params(bound)
    return folded


def fold_dequantized_constants(values: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int,
                               dtype: str = "float32") -> np.ndarray:
    """``dequantize(values, scale, zero_point)`` evaluated: ``(values - zero_point) * scale`` along ``axis``."""
    shape = [-1 if d == axis % values.ndim else 1 for d in range(values.ndim)]
    scale = scale.reshape(shape) if scale.ndim == 1 else scale
    zero_point = zero_point.reshape(shape) if zero_point.ndim == 1 else zero_point
    centered = values.astype(np.int64) - zero_point.astype(np.int64)
    return (centered.astype(np.float32) * scale.astype(np.float32)).astype(dtype)
