"""Rewriting the interface of a module's ``main``: input and output order, and transposed layouts.

TVM's TFLite importer orders inputs and outputs as the flatbuffer lists them,
and keeps TensorFlow's channels-last layout. :func:`rewrite_main` wraps
``main`` in a new ``main`` that takes its inputs in another order or layout,
binds the old inputs to them (transposed where asked), runs the old body, and
returns the outputs in another order or layout. The old body is kept as it is,
its symbolic dims included, so the module keeps a single Relax function and the
computation itself is unchanged (transposes are exact). TVM's inliner is not
used: it renamed dims it then left unbound in a reshape's ``ShapeExpr``, and it
lost the shapes of a body imported through tf2onnx with a dynamic batch
("emit_te now only supports Tensor that has ShapeExpr shape").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tvm
from tvm import relax

from forge_core.errors import ModelImportError, OptionError
from forge_core.ir.naming import OUTPUT_NAMES_ATTR
from forge_core.passes import canonicalize_bindings


def _output_count(func: relax.Function) -> int:
    ret = func.ret_ty
    return len(ret.fields) if isinstance(ret, relax.TupleType) else 1


def _outer_shape(inner: relax.TensorType, axes: Sequence[int]) -> relax.TensorType:
    """The type of ``x`` such that ``permute_dims(x, axes)`` has type ``inner``."""
    if inner.shape is None:
        raise ModelImportError("cannot transpose an input of unknown shape")
    dims = list(inner.shape.values)
    outer: list[tvm.ir.PrimExpr] = [dims[0]] * len(dims)
    for position, axis in enumerate(axes):
        outer[axis] = dims[position]
    return relax.TensorType(outer, inner.dtype)


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
        raise OptionError(f"input_order {input_order} or output_order {output_order} is not a permutation")
    if not input_axes and not output_axes and input_order == list(range(len(params))) \
            and output_order == list(range(count)):
        return mod

    normalizer = relax.BlockBuilder()
    # A transposed input's old parameter becomes a binding of another name (``x = permute_dims(x)`` would read
    # as a cycle to whatever looks values up by name): a dataflow var in the body's dataflow block, where TVM's
    # dataflow passes may rewrite it, else a var of a binding block before the body.
    in_dataflow = bool(main.body.blocks) and isinstance(main.body.blocks[0], relax.DataflowBlock)
    kind = relax.DataflowVar if in_dataflow else relax.Var
    transposed = {params[old]: kind(f"{params[old].name}_transposed", params[old].ty) for old in input_axes}
    body = main.bind_params(transposed).body if transposed else main.body
    outer_params: list[relax.Var] = []
    head: list[relax.Binding] = []
    for old in input_order:
        var = params[old]
        if old not in input_axes:
            outer_params.append(var)
            continue
        outer = relax.Var(var.name, _outer_shape(var.ty, input_axes[old]))
        outer_params.append(outer)
        head.append(relax.VarBinding(transposed[var],
                                     normalizer.normalize(relax.op.permute_dims(outer, input_axes[old]))))
    result = body.body
    tail: list[relax.Binding] = []

    def bound(value: relax.Expr, name: str) -> relax.Var:
        value = normalizer.normalize(value)
        var = relax.Var(name, value.ty)
        tail.append(relax.VarBinding(var, value))
        return var

    if isinstance(main.ret_ty, relax.TupleType):
        items: list[relax.Expr] = [bound(relax.TupleGetItem(result, i), f"output_{i}") for i in range(count)]
    else:
        items = [result]
    items = [bound(relax.op.permute_dims(item, output_axes[i]), f"output_{i}_transposed") if i in output_axes
             else item for i, item in enumerate(items)]
    reordered = [items[i] for i in output_order]
    output = normalizer.normalize(relax.Tuple(reordered)) if isinstance(main.ret_ty, relax.TupleType) \
        else reordered[0]
    blocks = list(body.blocks)
    if head and in_dataflow:
        blocks[0] = relax.DataflowBlock(head + list(blocks[0].bindings))
    elif head:
        blocks.insert(0, relax.BindingBlock(head))
    if tail:
        blocks.append(relax.BindingBlock(tail))
    wrapper = relax.Function(outer_params, relax.SeqExpr(blocks, output), output.ty, is_pure=main.is_pure)
    attrs = dict(main.attrs) if main.attrs is not None else {}
    if OUTPUT_NAMES_ATTR in attrs:
        names = list(attrs[OUTPUT_NAMES_ATTR])
        attrs[OUTPUT_NAMES_ATTR] = [names[i] for i in output_order]
    if attrs:
        wrapper = wrapper.with_attrs(attrs)
    functions = {gv: func for gv, func in mod.functions.items() if gv.name_hint != "main"}
    updated = tvm.IRModule(functions, attrs=mod.attrs)
    updated["main"] = wrapper
    updated = canonicalize_bindings(relax.transform.Normalize()(updated))
    return relax.transform.DeadCodeElimination(["main"])(updated)
