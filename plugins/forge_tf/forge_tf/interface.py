"""Rewriting the interface of a module's ``main``: input and output order, and transposed layouts.

TVM's TFLite importer orders inputs and outputs as the flatbuffer lists them,
and keeps TensorFlow's channels-last layout. :func:`rewrite_main` wraps
``main`` in a new ``main`` that takes its inputs in another order or layout,
calls the old body, and returns the outputs in another order or layout; the
old body is then inlined, so the module keeps a single Relax function and the
computation itself is unchanged (transposes are exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from forge_core.ir.naming import OUTPUT_NAMES_ATTR
from forge_core.schedules.rewrite import substitute
from forge_core.transforms.rebind import rebind

_INNER_NAME = "forge_tf_inner_main"


def _output_count(func: relax.Function) -> int:
    ret = func.ret_ty
    return len(ret.fields) if isinstance(ret, relax.TupleType) else 1


def _outer_shape(inner: relax.TensorType, axes: Sequence[int]) -> relax.TensorType:
    """The type of ``x`` such that ``permute_dims(x, axes)`` has type ``inner``."""
    if inner.shape is None:
        raise ValueError("cannot transpose an input of unknown shape")
    dims = list(inner.shape.values)
    outer: list[tvm.ir.PrimExpr] = [dims[0]] * len(dims)
    for position, axis in enumerate(axes):
        outer[axis] = dims[position]
    return relax.TensorType(outer, inner.dtype)


def _rebind_free_dims(func: relax.Function) -> relax.Function:
    """``func`` with each free symbolic dim replaced by the defined dim of its name.

    TVM 0.27's inliner gives the inlined body fresh symbolic dims and binds them
    from the call's arguments, but leaves the old ones in a ``ShapeExpr`` that is
    an operator's argument (a reshape's new shape ``R.shape([batch, 1000])``):
    that dim is then defined nowhere, and the VM build fails ("PrimExpr ...
    batch has not been computed"). Keras's MobileNet with a dynamic batch hit it.
    """
    defined = {str(var.name): var for var in relax.analysis.defined_symbolic_vars(func)}
    mapping = {var: defined[str(var.name)] for var in relax.analysis.free_symbolic_vars(func)
               if str(var.name) in defined}
    if not mapping:
        return func
    pairs = list(mapping.items())

    def dims_of_their_name(_binding: str, call: relax.Call, args: list[relax.Expr], _emit: Any) -> relax.Expr | None:
        if not any(isinstance(arg, relax.ShapeExpr) for arg in args):
            return None
        args = [relax.ShapeExpr([substitute(dim, pairs) for dim in arg.values])
                if isinstance(arg, relax.ShapeExpr) else arg for arg in args]
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    return rebind(tvm.IRModule({"main": func}), rewrite_call=dims_of_their_name)


def rewrite_main(
    mod: tvm.IRModule,
    *,
    input_order: Sequence[int] | None = None,
    input_axes: Mapping[int, Sequence[int]] | None = None,
    output_order: Sequence[int] | None = None,
    output_axes: Mapping[int, Sequence[int]] | None = None,
) -> tvm.IRModule:
    """``mod`` whose ``main`` has its inputs and outputs reordered and transposed.

    Args:
        mod: A module whose ``main`` is a Relax function.
        input_order: New input ``j`` is old input ``input_order[j]``.
        input_axes: Old input ``k`` receives ``permute_dims(new input, input_axes[k])``.
        output_order: New output ``j`` is old output ``output_order[j]``.
        output_axes: Old output ``k`` is returned as ``permute_dims(old output, output_axes[k])``.

    Returns:
        The rewritten module; ``main``'s attributes are kept (recorded output
        names follow ``output_order``).
    """
    input_axes = dict(input_axes or {})
    output_axes = dict(output_axes or {})
    main = mod["main"]
    params = list(main.params)
    input_order = list(input_order) if input_order is not None else list(range(len(params)))
    count = _output_count(main)
    output_order = list(output_order) if output_order is not None else list(range(count))
    if sorted(input_order) != list(range(len(params))) or sorted(output_order) != list(range(count)):
        raise ValueError(f"input_order {input_order} or output_order {output_order} is not a permutation")
    if not input_axes and not output_axes and input_order == list(range(len(params))) \
            and output_order == list(range(count)):
        return mod

    inner = main.without_attr("global_symbol")
    builder = relax.BlockBuilder()
    inner_var = builder.add_func(inner, _INNER_NAME)
    outer_params = []
    for old in input_order:
        var = params[old]
        ty = _outer_shape(var.ty, input_axes[old]) if old in input_axes else var.ty
        outer_params.append(relax.Var(var.name, ty))
    with builder.function("main", outer_params):
        with builder.dataflow():
            args: list[relax.Expr] = [relax.Tuple([])] * len(params)
            for var, old in zip(outer_params, input_order):
                args[old] = builder.emit(relax.op.permute_dims(var, input_axes[old])) if old in input_axes else var
            result = builder.emit(relax.Call(inner_var, args))
            items = [builder.emit(relax.TupleGetItem(result, i)) for i in range(count)] \
                if isinstance(main.ret_ty, relax.TupleType) else [result]
            items = [builder.emit(relax.op.permute_dims(item, output_axes[i])) if i in output_axes else item
                     for i, item in enumerate(items)]
            reordered = [items[i] for i in output_order]
            output = builder.emit_output(
                relax.Tuple(reordered) if isinstance(main.ret_ty, relax.TupleType) else reordered[0])
        builder.emit_func_output(output)
    wrapper = _rebind_free_dims(builder.get()["main"].inline_functions({inner_var: inner}))
    attrs = dict(main.attrs) if main.attrs is not None else {}
    if OUTPUT_NAMES_ATTR in attrs:
        names = list(attrs[OUTPUT_NAMES_ATTR])
        attrs[OUTPUT_NAMES_ATTR] = [names[i] for i in output_order]
    if attrs:
        wrapper = wrapper.with_attrs(attrs)
    functions = {gv: func for gv, func in mod.functions.items() if gv.name_hint != "main"}
    updated = tvm.IRModule(functions, attrs=mod.attrs)
    updated["main"] = wrapper
    updated = relax.transform.Normalize()(updated)
    return relax.transform.DeadCodeElimination(["main"])(updated)
