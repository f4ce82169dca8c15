"""The direct route: ``torch.export`` and TVM's Relax exported-program importer.

Never ``from_fx``: it builds BatchNorm in training mode and computes it wrongly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

from forge_core.errors import ForgeError, ModelImportError, OperatorConversionError, UnsupportedOperatorError
from forge_core.ir.index_checks import check_takes
from forge_core.passes import mutate_functions


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
        self.convert_map["index.Tensor"] = _named("index.Tensor", self._index_from_the_end)

    def update_convert_map(self, custom_convert_map: dict[str, Callable[..., Any]]) -> None:
        super().update_convert_map({op: _named(op, fn) for op, fn in custom_convert_map.items()})

    def _index_from_the_end(self, node: torch.fx.Node) -> relax.Var:
        """``x[idx]`` with Python's negative indices: TVM's converter takes them as they are, and ``take`` read
        before the data (``t[[-1]]`` gave numbers from other memory). Each index tensor becomes
        ``where(idx < 0, idx + n, idx)``, ``n`` the extent of its axis, before TVM's conversion; an index then
        still outside ``[0, n)`` is refused when the model runs (:func:`~forge_core.ir.index_checks.check_takes`).
        """
        data, indices = node.args[0], node.args[1]
        extents = self.shape_of(self.env[data])
        saved = {}
        for axis, index in enumerate(indices):
            if not isinstance(index, torch.fx.Node) or index in saved:
                continue
            value = self.env[index]
            if not isinstance(value.ty, relax.TensorType) or value.ty.dtype.dtype.startswith(("uint", "bool")) \
                    or not isinstance(value.ty.shape, relax.ShapeExpr) or axis >= len(extents) \
                    or not isinstance(extents[axis], tvm.tirx.IntImm):
                # A dynamic extent: the normalization's kernel did not build in TVM 0.27 (RenewDefs: a variable
                # defined twice, DistilBERT with a dynamic batch); such an index is taken as TVM takes it.
                continue
            bound = self.block_builder.emit(relax.op.astype(relax.op.reshape(
                relax.op.shape_to_tensor(relax.ShapeExpr([extents[axis]])), []), value.ty.dtype.dtype))
            saved[index] = value
            self.env[index] = self.block_builder.emit(relax.op.where(
                relax.op.less(value, relax.const(0, value.ty.dtype.dtype)), relax.op.add(value, bound), value))
        try:
            return self._index_tensor(node)
        finally:
            self.env.update(saved)


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
    mod = _integer_clip_bounds(_slices_within_bounds(mod))
    _check_shapes_known(mod)
    return check_takes(mod, "PyTorch")


@relax.expr_functor.mutator
class _IntegerClipBounds(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.clip = tvm.ir.Op.get("relax.clip")
        self.changed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 - ExprMutator's hook
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not call.op.same_as(self.clip):
            return call
        ty = call.args[0].ty
        if not isinstance(ty, relax.TensorType) or not ty.dtype.dtype.startswith(("int", "uint")):
            return call
        info = np.iinfo(ty.dtype.dtype)
        bounds, infinite = [], False
        for bound, limit in zip(call.args[1:], (info.min, info.max)):
            value = getattr(bound, "value", None)
            if isinstance(value, float) and math.isinf(value):
                bound, infinite = tvm.tirx.IntImm(ty.dtype.dtype, int(limit)), True
            bounds.append(bound)
        if not infinite:
            return call
        self.changed = True
        return relax.op.clip(call.args[0], *bounds)


def _integer_clip_bounds(mod: tvm.IRModule) -> tvm.IRModule:
    """``clamp(min=0)`` of an integer tensor (``ids.clamp(min=0)``): TVM's converter writes the absent bound as
    infinity, and its kernel then failed to build ("Cannot convert infinity to BigInt"), the model with it. An
    infinite bound of an integer clip becomes the dtype's limit."""
    return mutate_functions(mod, _IntegerClipBounds)


def _slices_within_bounds(mod: tvm.IRModule) -> tvm.IRModule:
    """Slices whose ends the dims' ranges keep inside the axis, marked so: their extent is the end itself.

    With a dynamic sequence (``torch.export.Dim("s", max=64)``), BERT slices its position table of 64 to
    ``s``; TVM clamps the end, the slice's extent becomes ``min(s, 64)`` (and the reshapes after it take that
    shape), which Relax cannot relate to ``s``: the sum with the token embeddings lost its shape and the model
    was refused. The importer records each dim's upper bound (``tir_var_upper_bound``); where the bounds prove
    ``0 <= begin <= end <= extent`` (unit steps) the slice takes ``assume_inbound``, shape arguments are
    simplified under the same bounds (``min(s, 64)`` is ``s``), and the model checks those dims against their
    bounds when it runs (:func:`_with_range_checks`).
    """
    from tvm import sym, tirx

    from forge_core.transforms.rebind import RebindError, rebind

    func = mod["main"]
    attrs = func.attrs or {}
    upper = dict(attrs.get("tir_var_upper_bound", {}) or {})
    if not upper:
        return mod
    analyzer = sym.Analyzer()
    for param in func.params:
        shape = getattr(getattr(param, "ty", None), "shape", None)
        for value in shape.values if isinstance(shape, relax.ShapeExpr) else ():
            for var in tirx.analysis.undefined_vars(value):
                if var.name in upper:
                    # from 0, not the recorded lower bound: sizes below it are not checked, so no rewrite may
                    # rely on it
                    analyzer.update(var, sym.ConstIntBound(0, int(upper[var.name])), override=True)
    changed = []
    relied_on: set[str] = set()  # the dims whose upper bounds a proof or a simplification used

    def prim(value: Any) -> Any:
        return value if tvm.ir.is_prim_expr(value) else getattr(value, "value", value)

    def in_bounds(args: list[relax.Expr]) -> bool:
        data, *tuples = args
        shape = getattr(data.ty, "shape", None)
        if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(t, relax.Tuple) for t in tuples):
            return False
        for axis, start, stop, step in zip(*[[prim(v) for v in t.fields] for t in tuples]):
            if not isinstance(axis, tirx.IntImm) or not (isinstance(step, tirx.IntImm) and int(step.value) == 1):
                return False
            extent = shape.values[int(axis.value) % len(shape.values)]
            if not (analyzer.can_prove(start >= 0) and analyzer.can_prove(stop >= start)
                    and analyzer.can_prove(stop <= extent)):
                return False
        for stop in (prim(v) for v in tuples[2].fields):
            relied_on.update(var.name for var in tirx.analysis.undefined_vars(stop))
        return True

    def rewrite(_binding: str, call: relax.Call, args: list[relax.Expr], _emit: Any) -> relax.Expr | None:
        simplified = []
        for arg in args:
            if isinstance(arg, relax.ShapeExpr):
                values = [analyzer.simplify(v) for v in arg.values]
                for old, new in zip(arg.values, values):
                    if not tvm_ffi.structural_equal(old, new):  # a rewrite that relies on the bounds
                        relied_on.update(var.name for var in tirx.analysis.undefined_vars(old))
                arg = relax.ShapeExpr(values)
            simplified.append(arg)
        shapes_changed = any(not tvm_ffi.structural_equal(new, old) for new, old in zip(simplified, args))
        if getattr(call.op, "name", "") == "relax.strided_slice" and not bool(call.attrs.assume_inbound) \
                and in_bounds(simplified):
            changed.append(call)
            return relax.op.strided_slice(simplified[0], *[list(t.fields) for t in simplified[1:]],
                                          assume_inbound=True)
        if shapes_changed:
            changed.append(call)
            return relax.Call(call.op, simplified, call.attrs, call.ty_args)
        return None

    try:
        new_main = rebind(mod, "main", rewrite_call=rewrite)
    except RebindError:  # a binding that does not re-infer: the module as imported (checked just after)
        return mod
    if not changed:
        return mod
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    result["main"] = _with_range_checks(new_main, {name: upper[name] for name in relied_on if name in upper})
    return result


def _with_range_checks(func: relax.Function, upper: dict[str, Any]) -> relax.Function:
    """``func`` checking, when it runs, that each dim a slice's proof used is at most the bound the program
    recorded: the slice reads past its table otherwise (BERT at a sequence of 80 against a table of 64: a
    segmentation fault where torch raises). A larger size raises ``forge.InputError`` naming the input."""
    from tvm import tirx

    from forge_core.runtime.signature import RUN_TIME_CHECK

    bindings: list[relax.VarBinding] = []

    def bind(name: str, expr: relax.Expr, ty: Any) -> relax.Var:
        var = relax.Var(name, ty)
        bindings.append(relax.VarBinding(var, expr))
        return var

    size_ty, count_ty, fine_ty = (relax.TensorType((1,), "int64"), relax.TensorType((), "int64"),
                                  relax.TensorType((), "bool"))

    seen = set()
    for param in func.params:
        shape = getattr(param.ty, "shape", None)
        for axis, value in enumerate(shape.values if isinstance(shape, relax.ShapeExpr) else ()):
            if not isinstance(value, tirx.Var) or value.name not in upper or value.name in seen:
                continue
            seen.add(value.name)
            low, high = 0, int(upper[value.name])
            size = bind(f"{value.name}_size", relax.op.shape_to_tensor(relax.ShapeExpr([value])), size_ty)
            outside = relax.op.logical_or(relax.op.less(size, relax.const(low, "int64")),
                                          relax.op.greater(size, relax.const(high, "int64")))
            count = bind(f"{value.name}_outside", relax.op.sum(relax.op.astype(outside, "int64")), count_ty)
            fine = bind(f"{value.name}_fine", relax.op.equal(count, relax.const(0, "int64")), fine_ty)
            message = (f"{RUN_TIME_CHECK}input {param.name!r} axis {axis} ({value.name}) must be at most {high}, "
                       "the bound torch.export recorded for it (the model slices a table of that size), given {}")
            bind(f"{value.name}_checked", relax.op.assert_op(fine, [size], message), relax.TupleType([]))
    if not bindings:
        return func
    body = relax.SeqExpr([relax.BindingBlock(bindings), *func.body.blocks], func.body.body)
    checked = relax.Function(func.params, body, func.body.body.ty, False, func.attrs, func.span)  # checks: impure
    return relax.transform.Normalize()(tvm.IRModule({"main": checked}))["main"]


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
