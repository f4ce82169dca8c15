"""Shape buckets: static copies of a dynamic model's ``main``, picked at run time by the inputs' shapes.

Forge's CPU schedule rules tile static extents: a kernel over a dynamic
extent falls back to TVM's plain loops, and a dynamic artifact runs many
times slower than a static one (``benchmarks/dynamic_shapes.py``). A bucket is
one size the user names, ``compile(shape_buckets=[{"x": (1, 3, 224, 224)}])``:
the build adds ``main`` with the model's dynamic dims bound to that size
(``main_bucket0``, ...), scheduled like a static model, and the artifact's
metadata lists the buckets. The runtime calls the bucket whose shapes the
inputs have exactly, and the generic ``main`` for any other size, so every
size the model takes still runs (TensorRT's optimization profiles and
onnxruntime's shape-specialized sessions make the same trade).

A bucket costs its kernels and, where its schedules repack the weights, a
copy of them in the library.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.utils import copy_with_new_vars
from tvm.sym import Analyzer

from forge_core.errors import OptionError
from forge_core.runtime.signature import TensorSpec, format_shape
from forge_core.schedules.rewrite import substitute

logger = logging.getLogger("forge.compile")

BUCKET_FUNCTION = "main_bucket{index}"
"""The name of bucket ``index``'s function in the library."""


def _takes(spec: TensorSpec) -> str:
    """``"x: (batch, 3, height, width)"``: an input and the shapes it takes."""
    return f"{spec.name}: {format_shape(spec.shape, spec.dims)}"


def typed_values(values: Mapping[tvm.tirx.Var, int]) -> dict[tvm.tirx.Var, tvm.tirx.IntImm]:
    """Each dim variable's value as an integer of the variable's own type (int64 dims stay int64)."""
    return {var: tvm.tirx.IntImm(str(var.ty), size) for var, size in values.items()}


def _bucket_shape(index: int, name: str, value: Any) -> tuple[int, ...]:
    try:
        shape: tuple[Any, ...] | None = tuple(value)
    except TypeError:
        shape = None
    if shape is None or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise OptionError(f"shape_buckets[{index}][{name!r}] must be a tuple of non-negative integers, given "
                          f"{value!r}") from None
    return shape


def bucket_bindings(params: Sequence[relax.Var], specs: Sequence[TensorSpec], buckets: Any,
                    ) -> list[tuple[dict[tvm.tirx.Var, int], dict[str, list[int]]]]:
    """Check ``buckets`` against ``main``'s ``params`` (``specs`` name them); each bucket's dim values and shapes.

    A bucket maps input names to shapes. Every input with a dynamic dim must
    be given; an input whose shape is static may be left out. A static dim
    must keep its size, and a dim that several inputs share must have one
    value. A bucket that binds nothing (the model is static there) warns and
    is dropped.

    Raises:
        ValueError: The bucket list is malformed, names an unknown input,
            leaves a dynamic input out, or gives a shape the model cannot take
            (the message names the input and the shapes it takes).
    """
    if isinstance(buckets, Mapping) or not isinstance(buckets, Sequence) or isinstance(buckets, (str, bytes)):
        raise OptionError("shape_buckets must be a list of {input name: shape} dicts, e.g. "
                          f"[{{{specs[0].name if specs else 'x'!r}: (1, 3, 224, 224)}}], given {buckets!r}")
    names = [spec.name for spec in specs]
    result = []
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for index, bucket in enumerate(buckets):
        if not isinstance(bucket, Mapping):
            raise OptionError(f"shape_buckets[{index}] must be a dict of input name -> shape, given {bucket!r}")
        unknown = [name for name in bucket if name not in names]
        if unknown:
            raise OptionError(f"shape_buckets[{index}] names {unknown[0]!r}, which is not an input of the model; "
                              f"its inputs: {', '.join(_takes(s) for s in specs)}")
        values: dict[tvm.tirx.Var, int] = {}
        shapes: dict[str, list[int]] = {}
        for param, spec in zip(params, specs):
            dims = list(param.ty.shape.values) if isinstance(param.ty.shape, relax.ShapeExpr) else None
            if spec.name not in bucket:
                if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                    raise OptionError(f"shape_buckets[{index}] leaves out input {_takes(spec)}, which has dynamic "
                                      "dims: give its shape in every bucket")
                continue
            shape = _bucket_shape(index, spec.name, bucket[spec.name])
            wrong = (f"shape_buckets[{index}] gives input {spec.name!r} the shape {shape}, which the model does not "
                     f"take: {_takes(spec)}")
            if dims is None or len(dims) != len(shape):
                raise OptionError(wrong)
            for dim, size in zip(dims, shape):
                if isinstance(dim, tvm.tirx.Var):
                    if values.setdefault(dim, size) != size:
                        raise OptionError(f"{wrong}; its dim {dim.name!r} is {values[dim]} in another input of "
                                          "the bucket")
                elif isinstance(dim, tvm.tirx.IntImm) and int(dim.value) != size:
                    raise OptionError(wrong)
            shapes[spec.name] = list(shape)
        for param, spec in zip(params, specs):  # dims that are expressions of the variables (2 * n)
            if spec.name not in shapes:
                continue
            for dim, size in zip(param.ty.shape.values, shapes[spec.name]):
                if isinstance(dim, (tvm.tirx.Var, tvm.tirx.IntImm)):
                    continue
                bound = Analyzer().simplify(substitute(dim, list(typed_values(values).items())))
                if not isinstance(bound, tvm.tirx.IntImm) or int(bound.value) != size:
                    raise OptionError(f"shape_buckets[{index}] gives input {spec.name!r} the shape "
                                      f"{tuple(shapes[spec.name])}, which the model does not take: {_takes(spec)} "
                                      f"(its dim {dim} is {bound} there)")
        if not values:
            warnings.warn(f"shape_buckets[{index}] fixes no dynamic dim (the model is static there); it is dropped",
                          UserWarning, stacklevel=4)
            continue
        key = tuple(tuple(shapes.get(name, ())) for name in names)
        if key in seen:
            raise OptionError(f"shape_buckets[{index}] repeats an earlier bucket: {dict(bucket)}")
        seen.add(key)
        result.append((values, shapes))
    return result


def _static_dims(ty: Any) -> list[tvm.tirx.IntImm] | None:
    shape = getattr(ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return list(shape.values)


def specialize_prim_func(func: tvm.tirx.PrimFunc, operands: Sequence[Any]) -> tvm.tirx.PrimFunc | None:
    """``func`` bound to its static ``operands`` (relax tensors, integers, output types in parameter order):
    integer parameters dropped, buffer shapes static; None where nothing changes.

    A graph pass may emit a kernel over symbolic extents with the extents as
    integer arguments (``fast_math``'s sigmoid over ``(b, 1, h, w)``). In a
    bucket its operands are static; left symbolic, FuseTIR cannot fuse it
    with its static neighbours.
    """
    scalars = {param: value for param, value in zip(func.params, operands) if isinstance(value, tvm.tirx.IntImm)}
    if scalars:
        func = func.specialize(scalars)
        operands = [value for value in operands if not isinstance(value, tvm.tirx.IntImm)]
    buffers = {}
    for param, operand in zip(func.params, operands):
        dims = _static_dims(operand if isinstance(operand, relax.Type) else getattr(operand, "ty", None))
        shape = list(getattr(param, "shape", None) or ())
        if dims is None or len(dims) != len(shape) or all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            continue
        if all(isinstance(d, (tvm.tirx.IntImm, tvm.tirx.Var)) for d in shape):  # expressions stay as they are
            static = [old if isinstance(old, tvm.tirx.IntImm) else tvm.tirx.IntImm(str(old.ty), int(new.value))
                      for old, new in zip(shape, dims)]  # the kernel's own index types (int32 or int64)
            buffers[param] = tvm.tirx.decl_buffer(static, str(param.dtype), param.name)
    if buffers:
        func = func.specialize(buffers)
    return func if scalars or buffers else None


@mutator
class _StaticKernels(PyExprMutator):
    """Calls of symbolic kernels with static operands become calls of static copies of those kernels."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's name)
        call = super().visit_call_(call)
        if call.op != tvm.ir.Op.get("relax.call_tir") or len(call.args) != 2:
            return call
        callee, arguments = call.args
        func = self.mod[callee] if callee in self.mod.get_global_vars() else None
        outputs = list(call.ty_args[0].fields) if isinstance(call.ty_args[0], relax.TupleType) else [call.ty_args[0]]
        if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(arguments, relax.Tuple):
            return call
        specialized = specialize_prim_func(func, [*arguments.fields, *outputs])
        if specialized is None:
            return call
        name = f"{callee.name_hint}_static"
        gvar = self.builder_.add_func(specialized, name)
        tensors = relax.Tuple([a for a in arguments.fields if not isinstance(a, tvm.tirx.IntImm)])
        return relax.Call(call.op, [gvar, tensors], call.attrs, call.ty_args, call.span)


def add_buckets(mod: tvm.IRModule, specs: Sequence[TensorSpec], buckets: Any) -> tuple[tvm.IRModule, list[dict[str, Any]]]:
    """``mod`` with a static copy of ``main`` per bucket, and the metadata's ``shape_buckets`` entry.

    Each entry is ``{"function": name, "inputs": {input name: shape}}``; the
    inputs are every input of the model, static ones included.
    """
    main = mod["main"]
    bindings = bucket_bindings(list(main.params), specs, buckets)
    if not bindings:
        return mod, []
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    entries = []
    for index, (values, shapes) in enumerate(bindings):
        name = BUCKET_FUNCTION.format(index=index)
        rewriter = _StaticKernels(updated)
        # Fresh variables: a copy sharing main's (a run-time check's among them) was refused by fusion ("The
        # object lv8 appears at multiple definition sites").
        bound = copy_with_new_vars(main.bind_symbolic_vars(typed_values(values)))
        body = rewriter.visit_expr(bound.body)
        updated = rewriter.builder_.get()
        updated[name] = relax.Function(bound.params, body, bound.ret_ty, bound.is_pure, bound.attrs,
                                       bound.span).with_attr("global_symbol", name)
        full = {spec.name: shapes.get(spec.name, list(spec.shape or ())) for spec in specs}
        entries.append({"function": name, "inputs": full})
        logger.info("shape bucket %s: %s", name, full)
    return updated, entries
