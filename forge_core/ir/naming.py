"""Names of a module's inputs and outputs, as frontends set them."""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import relax

from forge_core.errors import OptionError

OUTPUT_NAMES_ATTR = "forge.output_names"
"""Attribute of ``main`` holding the model's output names, when the source model had them."""


def rename_inputs(mod: tvm.IRModule, names: Sequence[str]) -> tvm.IRModule:
    """``mod`` with ``main``'s first ``len(names)`` parameters renamed to ``names``."""
    func = mod["main"]
    if len(names) > len(func.params):
        raise OptionError(f"{len(names)} input names given for a function of {len(func.params)} parameters")
    mapping: dict[relax.Var, relax.Var] = {}
    params = []
    for index, var in enumerate(func.params):
        if index < len(names) and names[index] != var.name:
            renamed = relax.Var(names[index], var.ty)
            mapping[var] = renamed
            params.append(renamed)
        else:
            params.append(var)
    if not mapping:
        return mod
    bound = func.bind_params(mapping)
    renamed_func = relax.Function(params, bound.body, func.ret_ty, func.is_pure, func.attrs, func.span)
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = renamed_func
    return updated


def with_output_names(mod: tvm.IRModule, names: Sequence[str]) -> tvm.IRModule:
    """``mod`` with ``main`` recording its outputs' names."""
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = mod["main"].with_attr(OUTPUT_NAMES_ATTR, list(names))
    return updated
