"""``set_batch_size``: give a model's inputs another batch size, and every shape after them.

The leading dimension of each input is its batch. Where it is symbolic (an
export with a dynamic batch), the symbol is bound to the new size and shapes
fold to constants. Where it is fixed, every type is inferred again from the new
inputs (:func:`forge_core.transforms.rebind.rebind`), and shapes the model
spells out are rewritten when they describe the batch:

* a ``reshape`` of a tensor that carries the batch scales its target's leading
  dimension (``[1, 2048]`` becomes ``[n, 2048]``; row-major order keeps the
  batch outermost, so each sample's values stay together);
* a ``broadcast_to`` of such a tensor takes the new batch in its leading
  dimension;
* a concat (on another axis) of batched values with values of batch 1 that do
  not depend on the inputs (a class token) broadcasts those to the batch: in a
  batch-1 model they are per-sample.

A value "carries" the batch when its leading dimension grew with it: from
``b`` to ``b * n / old``, which covers the batch folded with other axes
(attention's ``[batch * heads, ...]``).

Whatever cannot follow (a constant built for the old batch and concatenated
with batched values, a kernel compiled for the old shapes) raises
``ValueError`` naming the node. Every output that had the old batch must have
the new one afterwards, or the change is refused the same way.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import tvm
from tvm import relax

from forge_core.errors import ModelStateError, OptionError
from forge_core.ir.introspection import flatten_types
from forge_core.quantization.held_weights import fold_constants
from forge_core.transforms.rebind import Emit, RebindError, rebind


def _leading(ty: Any) -> Any:
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr) and len(ty.shape.values) >= 1:
        return ty.shape.values[0]
    return None


def _static(dim: Any) -> int | None:
    return int(dim.value) if isinstance(dim, tvm.tirx.IntImm) else None


def _static_shape(shape: Any) -> list[int] | None:
    if not isinstance(shape, relax.ShapeExpr):
        return None
    dims = [_static(v) for v in shape.values]
    return None if any(d is None for d in dims) else dims  # type: ignore[return-value]


def batch_dimension(func: relax.Function, weight_names: Collection[str]) -> tuple[Any, list[relax.Var]]:
    """The batch (the first batched input's leading dim: an int or a symbol) and the inputs that carry it."""
    inputs = [p for p in func.params if p.name not in weight_names]
    reference = next((_leading(p.ty) for p in inputs if _leading(p.ty) is not None), None)
    if reference is None:
        raise ModelStateError("set_batch_size: no input of the model has a batch dimension (every input is a scalar "
                              "or of unknown rank)")
    carriers = [p for p in inputs if _leading(p.ty) is not None and (
        _leading(p.ty).same_as(reference) if _static(reference) is None
        else _static(_leading(p.ty)) == _static(reference))]
    return (reference if _static(reference) is None else _static(reference)), carriers


def _concat_with_batch(call: relax.Call, parts: relax.Tuple, batch_size: int, emit: Emit,
                       binding: str) -> relax.Expr | None:
    """A concat (not on the batch axis) of batched values with values that have batch 1 because they do not
    depend on the inputs (ViT's class token): those are per-sample, so each is broadcast to the batch."""
    leading = [_static(_leading(p.ty)) for p in parts.fields]
    if batch_size not in leading or any(d not in (1, batch_size) for d in leading):
        return None
    fields = []
    for i, (part, dim) in enumerate(zip(parts.fields, leading)):
        if dim == 1:
            shape = [batch_size, *list(part.ty.shape.values)[1:]]
            part = emit(relax.op.broadcast_to(part, shape), f"{binding}_batch{i}")
        fields.append(part)
    return relax.op.concat(fields, axis=int(call.attrs.axis))


def set_batch_size(mod: tvm.IRModule, batch_size: int, weight_names: Collection[str] = ()) -> tvm.IRModule:
    """``mod`` with ``main``'s batch set to ``batch_size``.

    Raises:
        ValueError: ``batch_size`` is not a positive integer, or a node cannot take the new batch (named).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise OptionError(f"batch_size must be a positive integer, given {batch_size!r}")
    func = mod["main"]
    old, carriers = batch_dimension(func, weight_names)
    if old == batch_size:
        return mod
    if not isinstance(old, int):
        bound = func.bind_symbolic_vars({old: batch_size})
        updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        updated["main"] = bound
        return fold_constants(relax.transform.Normalize()(updated))

    new_params = {}
    for var in carriers:
        dims = [batch_size, *list(var.ty.shape.values)[1:]]
        new_params[var] = relax.Var(var.name, relax.TensorType(dims, var.ty.dtype))

    def carries(before: relax.Expr, after: relax.Expr) -> bool:
        """The value's leading dim grew with the batch: ``b`` became ``b * n / old`` (batch-major, possibly
        folded with other axes, as attention's ``[batch * heads, ...]``)."""
        was, now = _static(_leading(before.ty)), _static(_leading(after.ty))
        return was is not None and now is not None and was != now and was * batch_size == now * old

    def rewrite(binding: str, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
        name = getattr(call.op, "name", "")
        if name == "relax.reshape" and carries(call.args[0], args[0]):
            target = _static_shape(args[1])
            if target and target[0] > 0 and target[0] % old == 0:
                return relax.op.reshape(args[0], [target[0] // old * batch_size, *target[1:]])
        if name == "relax.broadcast_to" and carries(call.args[0], args[0]):
            target = _static_shape(args[1])
            if target and target[0] == old:
                return relax.op.broadcast_to(args[0], [batch_size, *target[1:]])
        if name == "relax.concat" and isinstance(args[0], relax.Tuple):
            grew = [carries(before, after) for before, after in zip(call.args[0].fields, args[0].fields)]
            if int(call.attrs.axis) == 0 and any(grew) and not all(grew):
                raise RebindError(f"node {binding!r} (concat): it joins batched values with values that do not "
                                  "depend on the inputs along the batch axis; no batch size but the model's keeps "
                                  "its meaning")
            if old == 1 and int(call.attrs.axis) != 0:
                return _concat_with_batch(call, args[0], batch_size, emit, binding)
        return None

    try:
        new_func = rebind(mod, "main", params=new_params, rewrite_call=rewrite)
    except RebindError as exc:
        raise ModelStateError(f"set_batch_size({batch_size}): {exc}") from None
    before, after = flatten_types(func.ret_ty), flatten_types(new_func.ret_ty)
    for index, (was, now) in enumerate(zip(before, after)):
        if _static(_leading(was)) == old and _static(_leading(now)) != batch_size:
            raise ModelStateError(
                f"set_batch_size({batch_size}): output {index} keeps shape {_static_shape(now.shape)}: its batch "
                f"comes from a shape fixed inside the model, not from the inputs")
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = new_func
    return updated
