"""Re-deriving a Relax function's types after its inputs or operators change.

Relax stores each binding's type; changing an input shape (a new batch size)
or an operator's arguments (a split weight) makes every type downstream
stale. :func:`rebind` walks a function with TVM's ``ExprMutator``: each call's
arguments are visited first, ``rewrite_call`` may then replace the call, and
the builder infers the call's type anew, so a shape error surfaces at the
binding that causes it, named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from forge_core.errors import ForgeError

Emit = Callable[[relax.Expr, str], relax.Var]
CallRewrite = Callable[[str, relax.Call, list[relax.Expr], Emit], relax.Expr | None]
"""``rewrite_call(binding_name, call, new_args, emit)``: a replacement expression, or None to keep the call.
``emit(expr, name)`` binds a new value before the current binding (e.g. the halves of a split)."""

# Calls whose output types were fixed when they were built: their arguments' types must not change.
_FIXED_TYPE_OPS = frozenset({"relax.call_tir", "relax.call_dps_packed", "relax.call_tir_inplace",
                             "relax.call_tir_with_grad", "relax.call_pure_packed"})


class RebindError(ForgeError, ValueError):
    """A binding whose type cannot be inferred after the change; names the binding and TVM's reason."""


@mutator
class _Rebinder(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, rewrite_call: CallRewrite | None, renames: Mapping[str, str]) -> None:
        super().__init__(mod)
        self.rewrite_call = rewrite_call
        self.renames = dict(renames)
        self.binding = "<function body>"
        self.error: RebindError | None = None

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: N802 (TVM's name)
        self.binding = binding.var.name
        new_name = self.renames.get(binding.var.name)
        if new_name is None:
            return super().visit_var_binding_(binding)
        value = self.visit_expr(binding.value)
        var_type = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
        renamed = var_type(new_name, value.ty)
        self.builder_.emit_normalized(relax.VarBinding(renamed, value))
        self.set_var_remap(binding.var, renamed)
        return None

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's name)
        args = [self.visit_expr(arg) for arg in call.args]
        op = getattr(call.op, "name", str(call.op)).removeprefix("relax.")
        if getattr(call.op, "name", "") in _FIXED_TYPE_OPS and any(
                not tvm_ffi.structural_equal(new.ty, old.ty) for new, old in zip(args, call.args)):
            self.error = RebindError(
                f"node {self.binding!r} ({op} of {call.args[0]}) was built for its input shapes at import "
                "and cannot take new ones; load the model with the shapes wanted instead")
            raise self.error
        try:
            replacement = (self.rewrite_call(self.binding, call, args, self._emit)
                           if self.rewrite_call is not None else None)
        except RebindError as exc:
            self.error = exc
            raise
        if replacement is None:
            if all(new.same_as(old) for new, old in zip(args, call.args)):
                return call
            replacement = relax.Call(call.op, args, call.attrs, call.ty_args)
        try:
            return self.builder_.normalize(replacement)
        except Exception as exc:  # noqa: BLE001 - TVM raises ValueError, TVMError, InternalError
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            reason = re.sub(r"^In ir\.Op\(.*support_level=\d+\),\s*", "", reason)  # TVM prints the whole op
            self.error = RebindError(f"node {self.binding!r} ({op}): {reason}")
            raise self.error from None


    def _emit(self, expr: relax.Expr, name: str) -> relax.Var:
        return self.builder_.emit(expr, name_hint=name)


def rebind(
    mod: tvm.IRModule,
    func_name: str = "main",
    params: Mapping[relax.Var, relax.Var] | None = None,
    rewrite_call: CallRewrite | None = None,
    renames: Mapping[str, str] | None = None,
) -> relax.Function:
    """``mod[func_name]`` rebuilt with its parameters replaced and its calls rewritten, types inferred anew.

    Args:
        mod: The module holding the function (other functions it calls are looked up there).
        func_name: The function to rebuild.
        params: Old parameter -> new parameter (e.g. one with another shape).
        rewrite_call: Called for every call with its visited arguments; returns a replacement or None.
        renames: Binding name -> new name.

    Raises:
        RebindError: A binding's type no longer infers; the message names the binding and the reason.
    """
    func = mod[func_name]
    params = dict(params or {})
    rebinder = _Rebinder(mod, rewrite_call, renames or {})
    for old, new in params.items():
        rebinder.set_var_remap(old, new)
    try:
        body = rebinder.visit_expr(func.body)
    except Exception:
        if rebinder.error is not None:
            raise rebinder.error from None  # TVM's FFI wrapped it on the way out
        raise
    new_params = [params.get(p, p) for p in func.params]
    result = relax.Function(new_params, body, None, func.is_pure, func.attrs, func.span)
    return relax.transform.Normalize()(tvm.IRModule({func_name: result}))[func_name]
