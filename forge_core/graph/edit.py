"""Edits of one Relax function that the graph API makes: a constant's value, a node's name."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from forge_core.ir.naming import rename_inputs
from forge_core.transforms.rebind import rebind


@mutator
class _ConstantReplacer(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, old: tvm.ir.GenericConst, new: relax.Expr) -> None:
        super().__init__(mod)
        self.old, self.new = old, new

    def visit_generic_const_(self, op: tvm.ir.GenericConst) -> relax.Expr:  # noqa: N802 (TVM's name)
        return self.new if op.same_as(self.old) else op


def with_function(mod: tvm.IRModule, name: str, func: relax.Function) -> tvm.IRModule:
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated[name] = func
    return updated


def replace_constant(mod: tvm.IRModule, func_name: str, old: tvm.ir.GenericConst, new: relax.Expr) -> tvm.IRModule:
    """``mod`` with the constant ``old`` of ``func_name`` replaced by ``new`` (a constant or a parameter)."""
    func = mod[func_name]
    body = _ConstantReplacer(mod, old, new).visit_expr(func.body)
    return with_function(mod, func_name, relax.Function(func.params, body, func.ret_ty, func.is_pure,
                                                        func.attrs, func.span))


def lift_constant(mod: tvm.IRModule, func_name: str, old: tvm.ir.GenericConst,
                  param_name: str) -> tvm.IRModule:
    """``mod`` with the constant ``old`` turned into a new last parameter ``param_name`` of ``func_name``."""
    param = relax.Var(param_name, old.ty)
    replaced = replace_constant(mod, func_name, old, param)
    func = replaced[func_name]
    lifted = relax.Function([*func.params, param], func.body, func.ret_ty, func.is_pure, func.attrs, func.span)
    return with_function(replaced, func_name, lifted)


def rename_binding(mod: tvm.IRModule, func_name: str, old: str, new: str) -> tvm.IRModule:
    """``mod`` with the binding ``old`` of ``func_name`` named ``new``."""
    return with_function(mod, func_name, rebind(mod, func_name, renames={old: new}))


def rename_parameter(mod: tvm.IRModule, func_name: str, old: str, new: str) -> tvm.IRModule:
    """``mod`` with the parameter ``old`` of ``func_name`` named ``new``."""
    func = mod[func_name]
    names = [new if p.name == old else p.name for p in func.params]
    if func_name == "main":
        return rename_inputs(mod, names)
    single = rename_inputs(tvm.IRModule({"main": func}), names)["main"]
    return with_function(mod, func_name, single)


def as_constant(value: Any, like: tvm.runtime.Tensor | None = None) -> relax.Expr:
    """A Relax constant holding ``value`` (a copy)."""
    array = np.ascontiguousarray(np.array(value, copy=True))
    return relax.const(array, str(array.dtype) if like is None else str(like.dtype))
