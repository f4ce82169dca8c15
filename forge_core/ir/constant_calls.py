"""Constant ``call_tir`` calls evaluated at compile time, their PrimFuncs built in one library.

Relax's ``FoldConstant`` evaluates a ``call_tir`` whose arguments are all
constants by building its PrimFunc alone with LLVM (40 to 120 ms a function,
most of it LLVM's set-up) and running it. The weight-repacking stages of the
schedule rules are such calls, one per convolution or dense layer: Inception-v1
spent 4 of its 17 s of compile there.

:func:`fold_constant_calls` gathers every such call of the module, builds
their PrimFuncs together, once, for the host CPU, runs each call and binds its
result as a constant. A call whose result is itself the argument of another
is evaluated in the next round. Calls it does not take (symbolic shapes, extra
shape arguments, a library that does not build for the host) are left for
``FoldConstant``, which evaluates them as before.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, tirx

from forge_core.graph.index import _handle
from forge_core.passes import map_bindings, replace_functions

logger = logging.getLogger("forge.fold")

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _static_tensor_types(ty: object) -> list[tuple[tuple[int, ...], str]] | None:
    """Each output's shape and dtype for a tensor or tuple-of-tensors type with static shapes, else None."""
    types = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
    found = []
    for t in types:
        if not isinstance(t, relax.TensorType) or not isinstance(t.shape, relax.ShapeExpr):
            return None
        dims = list(t.shape.values)
        if not all(isinstance(d, tirx.IntImm) for d in dims):
            return None
        found.append((tuple(int(d) for d in dims), str(t.dtype)))
    return found


class _Call:
    """One foldable call: its binding, callee, arguments (constants, or earlier calls' variables), results."""

    def __init__(self, binding: relax.VarBinding, callee: tvm.ir.GlobalVar, args: list[relax.Expr],
                 outputs: list[tuple[tuple[int, ...], str]]) -> None:
        self.binding, self.callee, self.args, self.outputs = binding, callee, args, outputs


def _is_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)


def _foldable(mod: tvm.IRModule, func: relax.Function) -> tuple[list[_Call], dict[int, tvm.runtime.Tensor]]:
    """The calls of ``func`` to evaluate, in binding order (each argument is a constant, a variable bound
    to one, or the result of an earlier call of the list), and the variables bound to constants."""
    calls = []
    bound: dict[int, tvm.runtime.Tensor] = {}
    results: set[int] = set()  # the variables of the listed calls with a tensor result
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            if _is_constant(value):
                bound[_handle(binding.var)] = value.value
                continue
            if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR) and len(value.args) == 2):
                continue
            callee, arguments = value.args
            if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(mod[callee], tirx.PrimFunc):
                continue
            if not isinstance(arguments, relax.Tuple) or not all(
                    _is_constant(a) or (isinstance(a, relax.Var) and (_handle(a) in bound or _handle(a) in results))
                    for a in arguments.fields):
                continue
            outputs = _static_tensor_types(binding.var.ty)
            if outputs is None:
                continue
            calls.append(_Call(binding, callee, list(arguments.fields), outputs))
            if not isinstance(binding.var.ty, relax.TupleType):
                results.add(_handle(binding.var))
    return calls, bound


def _build(mod: tvm.IRModule, callees: set[tvm.ir.GlobalVar]) -> tvm.runtime.Module | None:
    """One library holding every callee, for the host CPU (as ``FoldConstant`` builds them); None if it fails."""
    funcs = {gv.name_hint: mod[gv].with_attr("global_symbol", gv.name_hint) for gv in callees}
    try:
        return tvm.tirx.build(tvm.IRModule(funcs), target=tvm.target.Target({"kind": "llvm", "opt-level": 1}))
    except Exception as exc:  # noqa: BLE001 - FoldConstant then takes these calls one by one, as before
        logger.debug("building %d constant calls together failed (%s); FoldConstant takes them", len(funcs), exc)
        return None


def _rebind(func: relax.Function, values: dict[int, relax.Expr]) -> relax.Function:
    body = map_bindings(func.body, lambda b: relax.VarBinding(b.var, values[_handle(b.var)])
                        if _handle(b.var) in values else b)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)


def fold_constant_calls(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``call_tir`` on constant arguments (and static results) bound to its value.

    The bindings stay, bound to constants; ``FoldConstant`` then propagates them into their
    readers, and ``DeadCodeElimination`` drops what is dead.
    """
    funcs = {gv: f for gv, f in mod.functions.items()
             if isinstance(f, relax.Function) and isinstance(f.body, relax.SeqExpr)}
    plans = {gv: _foldable(mod, f) for gv, f in funcs.items()}
    calls = {gv: found for gv, (found, _) in plans.items() if found}
    if not calls:
        return mod
    library = _build(mod, {call.callee for found in calls.values() for call in found})
    if library is None:
        return mod
    updated = {}
    for gv, found in calls.items():
        values: dict[int, relax.Expr] = {}
        known = dict(plans[gv][1])
        for call in found:
            args = [arg.value if isinstance(arg, tvm.ir.GenericConst) else known[_handle(arg)] for arg in call.args]
            outputs = [tvm.runtime.empty(shape, dtype, tvm.cpu()) for shape, dtype in call.outputs]
            library[call.callee.name_hint](*args, *outputs)
            constants = [relax.const(out) for out in outputs]
            if isinstance(call.binding.var.ty, relax.TupleType):
                values[_handle(call.binding.var)] = relax.Tuple(constants)
            else:
                values[_handle(call.binding.var)] = constants[0]
                known[_handle(call.binding.var)] = outputs[0]
        updated[gv] = _rebind(funcs[gv], values)
    logger.debug("folded %d constant calls", sum(len(found) for found in calls.values()))
    return replace_functions(mod, updated)
