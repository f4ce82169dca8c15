"""The direct route: ``torch.export`` and TVM's Relax exported-program importer.

Never ``from_fx``: it builds BatchNorm in training mode and computes it wrongly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
import tvm
from tvm import relax
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

from forge_core.errors import ForgeError, ModelImportError, OperatorConversionError, UnsupportedOperatorError


def _named(op: str, convert: Callable[..., Any]) -> Callable[..., Any]:
    def call(node: Any, *rest: Any) -> Any:
        try:
            return convert(node, *rest)
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - converters fail with anything from asserts to TVMError
            raise OperatorConversionError("torch", op, node.name, exc) from exc

    return call


class _Importer(ExportedProgramImporter):
    """TVM's importer, with every converter failure named by node and op."""

    def __init__(self) -> None:
        super().__init__()
        self.convert_map = {op: _named(op, fn) for op, fn in self.convert_map.items()}

    def update_convert_map(self, custom_convert_map: dict[str, Callable[..., Any]]) -> None:
        super().update_convert_map({op: _named(op, fn) for op, fn in custom_convert_map.items()})


def _call_nodes(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [node for node in ep.graph.nodes if node.op == "call_function"]


def check_operators(ep: torch.export.ExportedProgram, custom: Mapping[str, Any] | None) -> None:
    """Raise one :class:`UnsupportedOperatorError` listing every op the importer lacks, with counts."""
    known = set(ExportedProgramImporter().convert_map) | set(custom or {})
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for node in _call_nodes(ep):
        op = node.target.__name__
        if op not in known:
            counts[op] += 1
            examples.setdefault(op, node.name)
    if counts:
        raise UnsupportedOperatorError("torch", {op: (n, examples[op]) for op, n in counts.items()})


def import_exported_program(
    ep: torch.export.ExportedProgram, custom_convert_map: Mapping[str, Callable[..., Any]] | None
) -> tvm.IRModule:
    """A Relax module from an ExportedProgram, decomposed to core ATen first."""
    try:
        decomposed = ep.run_decompositions()
    except Exception as exc:  # noqa: BLE001 - torch's decompositions fail with anything (GPT-2: a view's strides)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelImportError(f"torch's decomposition to core ATen failed: {type(exc).__name__}: {first}") from exc
    check_operators(decomposed, custom_convert_map)
    try:
        mod = _Importer().from_exported_program(
            decomposed,
            keep_params_as_input=False,
            unwrap_unit_return_tuple=True,
            no_bind_return_tuple=False,
            custom_convert_map=dict(custom_convert_map) if custom_convert_map else None,
        )
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelImportError(f"TVM's exported-program importer failed: {type(exc).__name__}: {exc}") from exc
    _check_shapes_known(mod)
    return mod


def _check_shapes_known(mod: tvm.IRModule) -> None:
    """Refuse a module where an operator lost the shape its operands have (from_torch then takes the ONNX route).

    With a dynamic sequence, BERT's embeddings ``(b, s, 32)`` are added to position embeddings sliced from a
    table of 64, ``(1, min(s, 64), 32)``: Relax cannot relate ``s`` to ``min(s, 64)``, the sum keeps only its
    rank, and nothing after it can be compiled. The ONNX exporter gives the slice the sequence's own dim.
    """
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            ty, value = binding.var.ty, binding.value
            if not isinstance(ty, relax.TensorType) or isinstance(ty.shape, relax.ShapeExpr) \
                    or not isinstance(value, relax.Call):
                continue
            tensors = [a for a in value.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
            # Operands with known shapes and a result without one: dims Relax cannot relate (not an
            # operator whose output size depends on the data, such as nonzero).
            if len(tensors) >= 2 and all(isinstance(a.ty.shape, relax.ShapeExpr) for a in tensors):
                op = getattr(value.op, "name", str(value.op))
                operands = [str(a.ty.shape) for a in tensors]
                raise ModelImportError(
                    f"TVM's exported-program importer left {binding.var.name!r} ({op} of {', '.join(operands)}) "
                    "without a shape: the dynamic dims of its operands cannot be related (give those dims a "
                    "static size in input_infos, or keep them dynamic through the ONNX route)"
                )


def export(model: torch.nn.Module, examples: tuple[torch.Tensor, ...], dynamic_shapes: Any) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(model, examples, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # noqa: BLE001 - torch.export raises many error types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelImportError(f"torch.export failed: {type(exc).__name__}: {first}") from exc
