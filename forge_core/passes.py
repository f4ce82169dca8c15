"""Running the passes that plugins register through ``register_passes``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.relax import dpl

from forge_core.errors import ForgeError
from forge_core.plugin_manager import get_plugin_manager

logger = logging.getLogger("forge.passes")


@dataclass(frozen=True)
class PassContext:
    """What a pass receives beside the module.

    ``target`` is the :class:`tvm.target.Target` being compiled for, or ``None``
    when a pass runs outside compilation (at import). ``options`` holds the
    caller's settings, e.g. ``{"opt_level": 3}``.
    """

    target: tvm.target.Target | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


def run_passes(mod: tvm.IRModule, names: Iterable[str], context: PassContext | None = None) -> tvm.IRModule:
    """Apply the registered passes ``names`` in order and return the new module."""
    context = context or PassContext()
    manager = get_plugin_manager()
    for name in names:
        spec = manager.get_pass(name)
        logger.debug("running pass %s (from plugin %s)", name, spec.plugin)
        result = spec.transform(mod, context)
        if not isinstance(result, tvm.IRModule):
            raise ForgeError(
                f"Pass {name!r} from plugin {spec.plugin!r} returned {type(result).__name__}, not a tvm.IRModule"
            )
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


def rewrite_functions(mod: tvm.IRModule, pattern: dpl.DFPattern,
                      rewrite: Callable[[relax.Expr, dict], relax.Expr]) -> tvm.IRModule:
    """``mod`` with every match of ``pattern`` in its Relax functions replaced by ``rewrite(expr, matches)``."""
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            updated[gv] = dpl.rewrite_call(pattern, rewrite, func)
    return updated
