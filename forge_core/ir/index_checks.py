"""Run-time range checks of indices: the check every frontend's lookups get (:func:`emit_index_check`: ONNX's
Gather and scatter converters, TFLite's GATHER), and :func:`check_takes` for importers that write lookups as
Relax's ``take`` or ``index_tensor`` (the torch route: ``nn.Embedding``, ``index_select``, ``t[ids]``,
``t[i, j]``).

TVM's ``take`` in "fast" mode reads wherever an index points: a token id past an embedding table gave numbers
from other memory, where PyTorch raises "index out of range in self". :func:`check_takes` puts a check before
each ``take`` whose indices are not a constant, made when the model runs, that they lie in ``[0, n)`` (``n`` the
extent of the axis taken; a frontend that allows negative indices has normalized them before its ``take``). A
failed check raises ``forge.InputError`` in the runtime (:data:`~forge_core.runtime.signature.RUN_TIME_CHECK`).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, tirx

from forge_core.passes import mutate_functions
from forge_core.runtime.signature import RUN_TIME_CHECK


def emit_index_check(bb: relax.BlockBuilder, indices: relax.Expr, extents: list[Any], *, label: str, where: str,
                     reference: str, negative: bool = False, branch: relax.Expr | None = None) -> None:
    """Emit the run-time check that every element of ``indices`` lies in ``[0, n)`` (``negative``: in
    ``[-n, n)``), ``n`` its extent.

    ``extents`` holds one dim (the indexed axis's, for every index) or one per coordinate (the last axis of
    ``indices``: GatherND, ScatterND). The message reads ``{label}: {count} of its indices lie outside
    {limits}, the extent of {where} ({reference} refuses such indices too)``. ``branch``: a bool scalar, the
    check holds only where it is true (an ``If`` branch's bindings run whichever branch is taken).
    """
    as_int = bb.emit(relax.op.astype(indices, "int64"))
    bound = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr(extents)))  # int64 [len(extents)]
    if len(extents) == 1:
        bound = bb.emit(relax.op.reshape(bound, []))
    low = relax.op.negative(bound) if negative else relax.const(0, "int64")
    outside = relax.op.logical_or(relax.op.less(as_int, low), relax.op.greater_equal(as_int, bound))
    count = bb.emit(relax.op.sum(relax.op.astype(outside, "int64")))
    fine = bb.emit(relax.op.equal(count, relax.const(0, "int64")))
    if branch is not None:
        fine = bb.emit(relax.op.logical_or(relax.op.logical_not(branch), fine))
    static = [int(d.value) for d in extents] if all(isinstance(d, tirx.IntImm) for d in extents) else None
    form = "[-n, n-1]" if negative else "[0, n-1]"
    if static is not None and len(static) == 1:
        limits, args = (f"[{-static[0]}, {static[0] - 1}]" if negative else f"[0, {static[0] - 1}]"), [count]
    elif static is not None:
        limits, args = f"{form} of n = {static}", [count]
    else:
        limits, args = f"{form} of n = {{}}", [count, bound]
    bb.emit(relax.op.assert_op(fine, args, f"{RUN_TIME_CHECK}{label}: {{}} of its indices lie outside {limits}, "
                                           f"the extent of {where} ({reference} refuses such indices too)"))


def _dims(data: relax.Expr) -> list[Any] | None:
    """The dims of a tensor whose shape Relax knows, else None."""
    ty = data.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _text(dims: list[Any]) -> str:
    return "(" + ", ".join(str(int(d.value)) if isinstance(d, tirx.IntImm) else str(d) for d in dims) + ")"


@relax.expr_functor.mutator
class _CheckTakes(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, framework: str) -> None:
        super().__init__(mod)
        self.take = tvm.ir.Op.get("relax.take")
        self.index_tensor = tvm.ir.Op.get("relax.index_tensor")
        self.framework = framework
        self.changed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 - ExprMutator's hook
        call = super().visit_call_(call)
        if isinstance(call, relax.Call) and call.op.same_as(self.index_tensor):
            return self._check_index_tensor(call)
        if not isinstance(call, relax.Call) or not call.op.same_as(self.take) or str(call.attrs.mode) != "fast":
            return call
        data, indices = call.args
        dims = _dims(data)
        if isinstance(indices, tvm.ir.GenericConst) or dims is None:
            return call
        if call.attrs.axis is None:
            extent = tirx.IntImm("int64", 1)
            for dim in dims:
                extent = extent * dim
            where = "the flattened tensor"
        else:
            axis = int(call.attrs.axis)
            axis = axis + len(dims) if axis < 0 else axis
            if not 0 <= axis < len(dims):
                return call
            extent, where = dims[axis], f"axis {axis}"
        emit_index_check(self.builder_, indices, [extent], where=where, reference=self.framework,
                         label=f"a lookup (take) into a tensor of shape {_text(dims)}")
        self.changed = True
        return call

    def _check_index_tensor(self, call: relax.Call) -> relax.Expr:
        """``index_tensor(data, (i0, i1, ...))`` (``t[i, j]``: ``ik`` indexes axis ``k``, the importer has
        normalized its negative indices): each ``ik`` that is not a constant checked against ``[0, n_k)``."""
        data, indices = call.args
        dims = _dims(data)
        if dims is None:
            return call
        if isinstance(indices, relax.Tuple):
            fields = list(indices.fields)
        elif isinstance(indices.ty, relax.TupleType):
            fields = [relax.TupleGetItem(indices, k) for k in range(len(indices.ty.fields))]
        else:
            return call
        for axis, field in enumerate(fields[:len(dims)]):
            if isinstance(field, tvm.ir.GenericConst):
                continue
            emit_index_check(self.builder_, field, [dims[axis]], where=f"axis {axis}", reference=self.framework,
                             label=f"an index (index_tensor) into a tensor of shape {_text(dims)}")
            self.changed = True
        return call


def check_takes(mod: tvm.IRModule, framework: str) -> tvm.IRModule:
    """``mod`` with a run-time range check before each ``take`` of indices that are not constants.

    ``framework`` names the reference in the message (``"PyTorch"``). A check is an impure call: a function
    holding one is no longer pure (an importer may have declared it so).
    """
    return mutate_functions(mod, lambda m: _CheckTakes(m, framework), lambda body: relax.Function(
        body.params, body.body, body.ret_ty, is_pure=False, attrs=body.attrs, span=body.span))


@relax.expr_functor.mutator
class _ClampedTakes(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.take = tvm.ir.Op.get("relax.take")
        self.changed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 - ExprMutator's hook
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not call.op.same_as(self.take) or str(call.attrs.mode) != "fast":
            return call
        self.changed = True
        data, indices = call.args
        return relax.op.take(data, indices, axis=call.attrs.axis, mode="clip")


def clamped_takes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``take`` in TVM's "fast" mode taken in "clip" mode, as it is legalized.

    The importers ask for "fast" (no bound in the kernel), and Forge checks every index that is not a constant
    when the model runs (:func:`check_takes`, :func:`emit_index_check`), after the frontend has made negative
    indices positive: every index a take then reads lies in ``[0, n)``, where "clip" reads the same element.
    So the values do not change; an index that no check covers reads the nearest edge rather than other memory;
    and TVM no longer logs, at every compile of a model with a lookup, that "fast mode segfaults when there are
    out-of-bounds indices", which Forge's checks make untrue. Its cost: a min and a max per element read.
    """
    return mutate_functions(mod, _ClampedTakes)


@tvm.transform.module_pass(opt_level=0, name="forge_clamped_takes")
def ClampedTakes(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 (TVM's style)
    """:func:`clamped_takes` as a TVM pass."""
    return clamped_takes(mod)
