"""Read facts off a Relax module: operators, signatures, graphs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import tvm
from tvm import relax

from forge_core.errors import OptionTypeError
from forge_core.runtime.signature import DYNAMIC_DIM, TensorSpec

_OP_PREFIX = "relax."


def relax_functions(mod: tvm.IRModule) -> Iterator[tuple[str, relax.Function]]:
    """The Relax functions of ``mod`` (not TIR PrimFuncs), sorted by name."""
    items = sorted(mod.functions.items(), key=lambda item: item[0].name_hint)
    for gv, func in items:
        if isinstance(func, relax.Function):
            yield gv.name_hint, func


def operator_name(op: tvm.ir.Op) -> str:
    """The user-facing name of a Relax operator: ``relax.nn.conv2d`` -> ``nn.conv2d``."""
    name = op.name
    return name[len(_OP_PREFIX):] if name.startswith(_OP_PREFIX) else name


def count_operators(mod: tvm.IRModule) -> dict[str, int]:
    """How many times each operator is called, over every Relax function."""
    counts: Counter[str] = Counter()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            counts[operator_name(expr.op)] += 1

    for _, func in relax_functions(mod):
        relax.analysis.post_order_visit(func, visit)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _dimension(value: tvm.ir.PrimExpr) -> int:
    if isinstance(value, tvm.tirx.IntImm):
        return int(value.value)
    return DYNAMIC_DIM


def static_shape(expr: relax.Expr) -> list[int] | None:
    """``expr``'s dimensions when they are all known integers, else None."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    try:
        return [int(v) for v in shape.values]
    except TypeError:
        return None


def tensor_spec(name: str, ty: relax.Type) -> TensorSpec:
    """A :class:`TensorSpec` from a Relax tensor type (dynamic dims become -1)."""
    if not isinstance(ty, relax.TensorType):
        raise OptionTypeError(f"{name!r} is not a tensor: its type is {ty}")
    shape = ty.shape
    names: tuple[int | str, ...] | None = None
    if isinstance(shape, relax.ShapeExpr):
        dims: tuple[int, ...] | None = tuple(_dimension(v) for v in shape.values)
        names = tuple(int(v.value) if isinstance(v, tvm.tirx.IntImm) else str(v) for v in shape.values)
    elif ty.ndim >= 0:
        dims = (DYNAMIC_DIM,) * ty.ndim
    else:
        dims = None
    return TensorSpec(name, dims, str(ty.dtype), names)


def input_specs(params: list[relax.Var]) -> list[TensorSpec]:
    """The specs of a function's inputs; a dim's name is kept only where it names one variable (importers may
    name several distinct dynamic dims alike, e.g. TVM's ``v``): inputs that share a name share the dim."""
    used = {var: _dim_vars(var.ty) for var in params}
    owners: dict[str, set[tvm.tirx.Var]] = {}
    for dim_vars in used.values():
        for dim_var in dim_vars:
            owners.setdefault(str(dim_var.name), set()).add(dim_var)
    specs = []
    for var in params:
        spec = tensor_spec(var.name, var.ty)
        if any(len(owners[str(dim_var.name)]) > 1 for dim_var in used[var]):
            spec = TensorSpec(spec.name, spec.shape, spec.dtype, None)
        specs.append(spec)
    return specs


def _dim_vars(ty: relax.Type) -> list[tvm.tirx.Var]:
    shape = getattr(ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return []
    return [v for dim in shape.values for v in tvm.tirx.analysis.undefined_vars(dim)]


def flatten_types(ty: relax.Type) -> list[relax.Type]:
    """The leaf tensor types of a possibly nested tuple type."""
    if isinstance(ty, relax.TupleType):
        leaves: list[relax.Type] = []
        for field in ty.fields:
            leaves.extend(flatten_types(field))
        return leaves
    return [ty]


def output_specs(func: relax.Function) -> list[TensorSpec]:
    """The outputs of ``func``, a tuple return flattened, named ``output_<i>``."""
    leaves = flatten_types(func.ret_ty)
    return [tensor_spec(f"output_{i}", ty) for i, ty in enumerate(leaves)]
