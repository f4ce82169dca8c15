"""The model's run-time checks as calls of Forge's runtime, so that they run without TVM's compiler.

Relax's ``assert_op`` becomes a VM call of ``relax.run.assert_op``, a global function that TVM registers in
Python (``tvm.relax``): in Forge's light runtime, which loads TVM's runtime library alone, an artifact holding
a check (an index range, a size computed from the inputs) failed to run. Each ``assert_op`` is rewritten, with
the same arguments, into a call of :data:`forge_core.runtime.run_checks.ASSERT_FUNCTION`, which the runtime
registers (and which behaves as TVM's).
"""

from __future__ import annotations

import tvm
from tvm import relax

from forge_core.passes import mutate_functions
from forge_core.runtime.run_checks import ASSERT_FUNCTION


@relax.expr_functor.mutator
class _PortableAsserts(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.assert_op = tvm.ir.Op.get("relax.assert_op")
        self.changed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 - ExprMutator's hook
        call = super().visit_call_(call)
        if isinstance(call, relax.Call) and call.op.same_as(self.assert_op):
            self.changed = True
            return relax.Call(relax.ExternFunc(ASSERT_FUNCTION), list(call.args), None, [relax.TupleType([])],
                              span=call.span)
        return call


def portable_run_checks(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``relax.assert_op`` a call of Forge's runtime function (``mod`` itself when none)."""
    return mutate_functions(mod, _PortableAsserts)


_PLACEHOLDER = "forge.run.assert_op_placeholder"


@relax.expr_functor.mutator
class _Messages(relax.PyExprMutator):
    """Each check's message out (a numbered placeholder call) or back in (``relax.assert_op``)."""

    def __init__(self, mod: tvm.IRModule, messages: list[str], restore: bool) -> None:
        super().__init__(mod)
        self.assert_op = tvm.ir.Op.get("relax.assert_op")
        self.messages, self.restore = messages, restore
        self.changed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 - ExprMutator's hook
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call):
            return call
        if not self.restore and call.op.same_as(self.assert_op) and isinstance(call.args[1], tvm.ir.expr.StringImm):
            self.changed = True
            self.messages.append(str(call.args[1].value))
            index = relax.prim_value(tvm.tirx.IntImm("int64", len(self.messages) - 1))
            return relax.Call(relax.ExternFunc(_PLACEHOLDER), [call.args[0], index, *call.args[2:]], None,
                              [relax.TupleType([])], span=call.span)
        if self.restore and isinstance(call.op, relax.ExternFunc) and str(call.op.global_symbol) == _PLACEHOLDER:
            self.changed = True
            message = self.messages[int(call.args[1].value)]
            return relax.op.assert_op(call.args[0], list(call.args[2:]), message)
        return call


def _rewrite_messages(mod: tvm.IRModule, messages: list[str], restore: bool) -> tvm.IRModule:
    return mutate_functions(mod, lambda m: _Messages(m, messages, restore))


def without_check_messages(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """``mod`` with each check's message string replaced by a number, and the messages.

    Some of TVM's passes cannot visit a string argument (``MergeCompositeFunctions``, under TensorRT's
    partitioning: "Do not have a default for ir.StringImm"); :func:`with_check_messages` puts them back.
    """
    messages: list[str] = []
    return _rewrite_messages(mod, messages, restore=False), messages


def with_check_messages(mod: tvm.IRModule, messages: list[str]) -> tvm.IRModule:
    """``mod`` with the checks :func:`without_check_messages` numbered given their messages again."""
    return _rewrite_messages(mod, messages, restore=True) if messages else mod
