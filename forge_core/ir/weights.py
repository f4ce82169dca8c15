"""Weights: the ``params`` dict, constants frozen in the graph, and moves between them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from forge_core.errors import OptionTypeError
from forge_core.ir.introspection import relax_functions

Tensor = tvm.runtime.Tensor


def to_tensor(name: str, value: Any) -> Tensor:
    """A TVM tensor from a numpy array, a TVM tensor, or anything with ``.numpy()``."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, tvm.ir.GenericConst):
        return value.value
    if not isinstance(value, np.ndarray) and hasattr(value, "numpy"):
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype == object:
        raise OptionTypeError(f"Parameter {name!r} is not a numeric array (got {type(value).__name__})")
    return tvm.runtime.tensor(np.ascontiguousarray(array))


def copy_tensor(value: Tensor) -> Tensor:
    return tvm.runtime.tensor(value.numpy())


def normalize_params(params: Mapping[str, Any] | None) -> dict[str, Tensor]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise OptionTypeError(f"params must be a dict of name to array, not {type(params).__name__}")
    return {str(k): to_tensor(str(k), v) for k, v in params.items()}


def iter_constants(mod: tvm.IRModule) -> list[tvm.ir.GenericConst]:
    """Every constant of every Relax function, in a deterministic order."""
    found: list[tvm.ir.GenericConst] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            found.append(expr)

    for _, func in relax_functions(mod):
        relax.analysis.post_order_visit(func, visit)
    return found


def weights_nbytes(mod: tvm.IRModule, params: Mapping[str, Tensor]) -> int:
    """Bytes of weights: the graph's tensor constants (each buffer once) plus ``params``.

    Scalar constants (one element) are attributes of operators, not weights.
    """
    seen: set[int] = set()
    total = 0
    for const in iter_constants(mod):
        key = const.value.data_ptr()
        if key in seen or int(np.prod(const.value.shape)) <= 1:
            continue
        seen.add(key)
        total += _nbytes(const.value)
    return total + sum(_nbytes(t) for t in params.values())


def _nbytes(tensor: Tensor) -> int:
    return int(np.prod(tensor.shape, dtype=np.int64)) * np.dtype(tensor.dtype).itemsize if tensor.dtype != "bool" else int(np.prod(tensor.shape))


@mutator
class _ConstantCopier(PyExprMutator):
    def visit_generic_const_(self, op: tvm.ir.GenericConst) -> relax.Expr:  # noqa: N802 (TVM's name)
        return relax.const(op.value.numpy(), str(op.value.dtype))


def deep_copy_module(mod: tvm.IRModule) -> tvm.IRModule:
    """A copy of ``mod`` whose constants own fresh buffers."""
    copier = _ConstantCopier(mod)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            copier.builder_.update_func(gv, copier.visit_expr(func))
    return copier.builder_.get()


@mutator
class _ConstantLifter(PyExprMutator):
    """Replaces float constants with more than one element by new parameters."""

    def __init__(self, mod: tvm.IRModule, prefix: str) -> None:
        super().__init__(mod)
        self.prefix = prefix
        self.lifted: list[tuple[relax.Var, Tensor]] = []

    def visit_generic_const_(self, op: tvm.ir.GenericConst) -> relax.Expr:  # noqa: N802
        value = op.value
        if not str(value.dtype).startswith(("float", "bfloat")) or int(np.prod(value.shape)) <= 1:
            return op
        var = relax.Var(f"{self.prefix}{len(self.lifted)}", relax.TensorType(list(value.shape), str(value.dtype)))
        self.lifted.append((var, value))
        return var


def lift_weights(mod: tvm.IRModule, prefix: str = "param_") -> tuple[tvm.IRModule, dict[str, Tensor]]:
    """Turn ``main``'s weight constants into parameters named ``param_0``, ``param_1``…

    Returns the new module and the ``params`` dict. Integer constants (shapes,
    indices) and scalars stay frozen: they are attributes, not weights.
    """
    func = mod["main"]
    lifter = _ConstantLifter(mod, prefix)
    body = lifter.visit_expr(func.body)
    if not lifter.lifted:
        return mod, {}
    new_params = list(func.params) + [var for var, _ in lifter.lifted]
    new_func = relax.Function(new_params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    new_mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    new_mod["main"] = new_func
    new_mod = relax.transform.Normalize()(new_mod)
    return new_mod, {var.name: value for var, value in lifter.lifted}


def bind_params(mod: tvm.IRModule, params: Mapping[str, Tensor]) -> tvm.IRModule:
    """Freeze ``params`` into ``main`` as constants."""
    if not params:
        return mod
    func = mod["main"]
    by_var = {var: params[var.name] for var in func.params if var.name in params}
    bound = relax.transform.BindParams("main", by_var)(mod)
    return _with_num_input(bound)


def _with_num_input(mod: tvm.IRModule) -> tvm.IRModule:
    func = mod["main"]
    if func.attrs is not None and "num_input" in func.attrs:
        func = func.with_attr("num_input", len(func.params))
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        mod["main"] = func
    return mod


def format_bytes(n: int) -> str:
    """``576`` -> ``"576 B"``, ``2411724`` -> ``"2.3 MiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
