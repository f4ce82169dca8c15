"""Forge's import passes on a converted model, with a failure traced back to the ONNX node it comes from.

TVM's converters check few operands: a model ONNX's rules allow can convert
into a Relax call that TVM cannot lower (a PRelu slope of another length than
its channels, a Conv whose dilations leave no output). The call then fails in
the first pass that lowers it, constant folding, with an ``AssertionError`` or
a ``ValueError`` from deep inside TOPI that names nothing of the model. On that
path only, each call of the converted module is lowered on its own until one
fails; its binding's name (the node's name, or its output's) gives the node.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from typing import Any

import onnx
import tvm
from tvm import relax

from forge_core.errors import ForgeError, ModelImportError, OperatorConversionError
from forge_core.ir.module import IRModule
from forge_onnx.operator_support import iter_nodes

logger = logging.getLogger("forge.onnx")


def build_ir_module(mod: tvm.IRModule, params: Mapping[str, Any], proto: onnx.ModelProto, source: str,
                    **options: Any) -> IRModule:
    """``IRModule(mod, params, **options)``; a failure of its import passes raises an error naming the node.

    Raises:
        OperatorConversionError: A node's converted call cannot be lowered (the error names the node).
        ModelImportError: The passes failed, and no single call is to blame.
    """
    try:
        return IRModule(mod, params, **options)
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - TVM's lowering raises anything from AssertionError to TVMError
        raise _located(mod, proto, source, exc) from exc


def _summary(exc: BaseException) -> str:
    """The exception's last line, or where it was raised when it has no message (a bare ``assert``)."""
    lines = str(exc).strip().splitlines()
    if lines:
        return f"{type(exc).__name__}: {lines[-1].strip()}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} in {last.name} ({last.line or 'no source'})"


def _bindings(mod: tvm.IRModule) -> list[Any]:
    main = mod["main"]
    blocks = main.body.blocks if isinstance(main.body, relax.SeqExpr) else []
    return [binding for block in blocks for binding in block.bindings]


def _failing_call(bindings: list[Any]) -> tuple[int, str, BaseException] | None:
    """The first call that TVM cannot lower on its own: its binding's index, its op, the error."""
    for index, binding in enumerate(bindings):
        value = getattr(binding, "value", None)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        single = relax.Function(list(relax.analysis.free_vars(value)), value, value.ty)
        try:
            relax.transform.LegalizeOps()(tvm.IRModule({"main": single}))
        except Exception as exc:  # noqa: BLE001 - the culprit, whatever TVM raises
            return index, str(value.op.name), exc
    return None


def _owner(bindings: list[Any], index: int, nodes: Mapping[str, onnx.NodeProto]) -> onnx.NodeProto | None:
    """The node whose conversion emitted binding ``index``: the first binding named after a node (or its
    output) that is it or reads it, directly or through unnamed ones (a node's intermediate values)."""
    readers = {bindings[index].var}
    for binding in bindings[index:]:
        if binding is not bindings[index]:
            used = set(relax.analysis.free_vars(binding.value)) if isinstance(binding.value, relax.Expr) else set()
            if not used & readers:
                continue
        name = str(binding.var.name)
        if name in nodes:
            return nodes[name]
        readers.add(binding.var)
    return None


def _located(mod: tvm.IRModule, proto: onnx.ModelProto, source: str, exc: BaseException) -> ModelImportError:
    try:
        bindings = _bindings(mod)
        found = _failing_call(bindings)
    except Exception as search_error:  # noqa: BLE001 - the search is best effort; the original error stands
        logger.debug("could not locate the failing call: %s", search_error)
        found = None
    if found is None:
        return ModelImportError(f"{source}: Forge's import passes failed on the converted model: {_summary(exc)}")
    index, op, cause = found
    nodes: dict[str, onnx.NodeProto] = {}
    for node in iter_nodes(proto.graph):
        for key in (node.name, *node.output):
            if key:
                nodes.setdefault(key, node)
    node = _owner(bindings, index, nodes)
    if node is not None:
        return OperatorConversionError("onnx", node.op_type, node.name,
                                       RuntimeError(f"TVM cannot lower its {op} for these operands: "
                                                    f"{_summary(cause)}"))
    return ModelImportError(f"{source}: TVM cannot lower the converted model's {op} (value "
                            f"{str(bindings[index].var.name)!r}): {_summary(cause)}")
