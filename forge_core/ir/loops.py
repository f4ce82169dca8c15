"""Loops in Relax, for every frontend: a function that runs one iteration and calls itself.

Relax has no loop construct; a loop is a function whose ``If`` either runs the body and calls the function
again with the next values, or returns them. :func:`build_loop` builds, for one loop of a model:

* a *step* function ``loop_0(i, stop, cond, carried..., scanned..., captured...)``: while ``i < stop`` and
  ``cond``, it runs the body (the frontend's :attr:`LoopSpec.step` emits it) and calls itself with ``i + 1``;
  else it returns ``(i, cond, carried..., scanned...)``. ``scanned`` are the per-iteration outputs stacked
  so far (ONNX's scan outputs).
* ``LEVELS - 1`` *chunk* functions above it: ``loop_k`` runs ``loop_{k-1}`` over ``CHUNK ** k`` iterations
  at a time. TVM's VM recurses on the C++ stack (an 8 MB stack held about 2000 nested calls), so a chain of
  one call per iteration would crash a long loop; chunked, a loop of ``n`` iterations nests about
  ``CHUNK * (LEVELS - 1) + n / CHUNK ** (LEVELS - 1)`` calls (100 000 iterations: 73). Each level stacks
  its own chunk's scan outputs, which the level above appends at once: an element is copied about
  ``CHUNK / 2`` times per level rather than once per later iteration (30 s of WeSpeaker's frames, 2998
  iterations: 486 ms with one stack for the whole loop, 113 ms so).

The body runs only inside the ``If`` (an iteration past the end would read past a scanned input). A carried
value whose shape the body changes (a sequence that grows by one token per iteration) gets its own symbolic
dims; one whose shape holds keeps it, static where it was. In core, for any frontend plugin (plugins do not
import each other); ``forge_onnx.loops`` builds ONNX's Loop and Scan on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from forge_core.errors import OperatorConversionError

# Iterations run by one call of the level below, per level: level k runs CHUNK ** k iterations at a time.
CHUNK = 16
LEVELS = 4
INT64_MAX = 2**63 - 1
_counter = itertools.count()

SCALAR_I64 = relax.TensorType([], "int64")
SCALAR_BOOL = relax.TensorType([], "bool")

# step(i, cond, carried, captured) -> (the next condition, the next carried values, this iteration's scan outputs)
Step = Callable[[relax.Var, relax.Var, list[relax.Var], dict[str, relax.Var]], tuple[Any, list[Any], list[Any]]]


@dataclass
class LoopSpec:
    """One loop of a model, as :func:`build_loop` takes it."""

    frontend: str                   # for errors: "onnx", "tflite"
    op: str                         # the operator: "Loop", "Scan", "WHILE"
    node: str                       # its node's name
    carried_names: list[str]        # the values carried from one iteration to the next, named for errors
    carried_init: list[Any]         # ... as the loop starts
    captured: dict[str, Any]        # tensors every iteration reads, passed to every call
    scan_names: list[str]           # the per-iteration outputs to stack, named for errors
    step: Step                      # emits one iteration into the open block

    def error(self, exc: Exception) -> OperatorConversionError:
        return OperatorConversionError(self.frontend, self.op, self.node, exc)


def new_label() -> str:
    """A name prefix unique in the process, for a loop's functions and symbolic dims."""
    return f"loop{next(_counter)}"


def tensor_type(value: relax.Expr, what: str, spec: LoopSpec) -> relax.TensorType:
    ty = getattr(value, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise spec.error(TypeError(f"{what} must be a tensor of known rank; got {ty}. Sequences, optionals "
                                   "and tensors of unknown rank cannot be carried through a loop yet"))
    return ty


def _param_type(ty: relax.TensorType, label: str, entry: tvm.sym.Analyzer | None = None) -> relax.TensorType:
    """``ty`` as a function parameter's type: each dim a constant or a symbolic var. A dim computed from vars
    (``min(240, N)``: a Slice of a dynamic length) becomes a fresh var, which the parameter defines (TVM cannot
    match a parameter against an expression of vars that no parameter defines); ``entry`` learns what it is
    when the loop starts."""
    if ty.shape is None:
        return _generalized(ty, label)
    dims = []
    for axis, dim in enumerate(ty.shape.values):
        if not isinstance(dim, (tvm.tirx.IntImm, tvm.tirx.Var)):
            fresh = tvm.tirx.Var(f"{label}_d{axis}", "int64")
            if entry is not None:
                entry.bind(fresh, dim)
            dim = fresh
        dims.append(dim)
    return relax.TensorType(dims, ty.dtype)


def _generalized(ty: relax.TensorType, label: str) -> relax.TensorType:
    """``ty`` with every dim a fresh symbolic var."""
    return relax.TensorType([tvm.tirx.Var(f"{label}_d{axis}", "int64") for axis in range(ty.ndim)], ty.dtype)


def _settled_dims(before: relax.TensorType, after: relax.TensorType, fresh: list[Any],
                  label: str) -> list[Any] | None:
    """None when each dim of ``after`` is the one of ``before`` or ``before``'s is a var made for a changing dim;
    else ``before``'s dims with a fresh var for each that changes (or is unknown)."""
    old = list(before.shape.values) if before.shape is not None else [None] * before.ndim
    new = list(after.shape.values) if after.shape is not None else [None] * after.ndim
    dims, changed = [], False
    analyzer = tvm.sym.Analyzer()
    for axis, (a, b) in enumerate(zip(old, new, strict=True)):
        if a is not None and (isinstance(a, tvm.tirx.Var) and any(a.same_as(v) for v in fresh)
                              or b is not None and analyzer.can_prove_equal(a, b)):
            dims.append(a)
        else:
            dims.append(tvm.tirx.Var(f"{label}_d{axis}", "int64"))
            changed = True
    return dims if changed else None


def _symbolic_vars(ty: relax.TensorType) -> list[tvm.tirx.Var]:
    if ty.shape is None:
        return []
    found: list[tvm.tirx.Var] = []
    for dim in ty.shape.values:
        found.extend(tvm.tirx.analysis.undefined_vars(dim))
    return found


def _loose(ty: relax.TensorType) -> relax.TensorType:
    return relax.TensorType(ndim=ty.ndim, dtype=ty.dtype)






def in_scope(bb: relax.BlockBuilder, params: list[relax.Var], build: Callable[[], Any]) -> relax.SeqExpr:
    """``build()``'s bindings as a SeqExpr of their own (a function body or a branch), not the open block."""
    bb.begin_scope(params)
    bb._begin_binding_block()
    try:
        result = build()
    finally:
        block = bb._end_block()
        bb.end_scope()
    bb.begin_scope(params)
    try:
        return bb.normalize(relax.SeqExpr([block], result))
    finally:
        bb.end_scope()


def build_loop(bb: relax.BlockBuilder, spec: LoopSpec, stop: Any, cond: Any,
               label: str | None = None) -> tuple[list[Any], list[Any]]:
    """Emit the call of ``spec``'s loop from ``i = 0`` while ``i < stop`` and ``cond``; the final carried values
    and the stacked scan outputs (leading axis: the iterations)."""
    label = label or new_label()
    for name, value in zip(spec.carried_names, spec.carried_init, strict=True):
        tensor_type(value, f"carried value {name!r}", spec)
    for name, value in spec.captured.items():
        tensor_type(value, f"the value {name!r} read from outside the body", spec)
    # Types: carried values as they enter, generalized where the body changes them; scan outputs stacked.
    # The dims of the values as the loop starts, in the scope around it (for the scan outputs' dims).
    entry = tvm.sym.Analyzer()
    carried_types = [_param_type(value.ty, f"{label}_{name}", entry)
                     for name, value in zip(spec.carried_names, spec.carried_init, strict=True)]
    captured_types = [_param_type(value.ty, f"{label}_captured{j}", entry)
                      for j, value in enumerate(spec.captured.values())]
    fresh: list[Any] = []     # the symbolic dims made here (a dim the body changes)
    for _ in range(4):
        after_types, elem_types = _step_types(bb, spec, carried_types, captured_types)
        changed = False
        for k, (before, after) in enumerate(zip(carried_types, after_types, strict=True)):
            if after.dtype != before.dtype or after.ndim != before.ndim:
                raise spec.error(TypeError(
                    f"its body turns the carried value {spec.carried_names[k]!r} from {before} into {after}; "
                    f"{spec.frontend} requires the same element type and rank in every iteration"))
            dims = _settled_dims(before, after, fresh, f"{label}_{spec.carried_names[k]}")
            if dims is not None:
                fresh.extend(d for d in dims if isinstance(d, tvm.tirx.Var))
                carried_types[k] = relax.TensorType(dims, before.dtype)
                changed = True
        if not changed:
            break
    else:
        raise spec.error(ValueError("the shapes of its carried values do not settle"))
    outer_vars = [v for value in [*spec.carried_init, *spec.captured.values()] for v in _symbolic_vars(value.ty)]

    def outside_dims(ty: relax.TensorType) -> list[Any] | None:
        """``ty``'s dims in the scope around the loop, as they are when it starts; None if one changes."""
        if ty.shape is None:
            return None
        dims = [entry.simplify(dim) for dim in ty.shape.values]
        known = all(any(v.same_as(o) for o in outer_vars) for dim in dims
                    for v in tvm.tirx.analysis.undefined_vars(dim))
        return dims if known else None

    elem_outside = []
    for name, ty in zip(spec.scan_names, elem_types, strict=True):
        dims = outside_dims(ty)
        if dims is None:
            raise spec.error(ValueError(
                f"its scan output {name!r} has a shape ({ty}) that changes from one iteration to the next "
                "or is not known before the loop runs; it must have one shape for all iterations"))
        elem_outside.append(dims)
    acc_types = [relax.TensorType([tvm.tirx.Var(f"{label}_n{j}", "int64"), *ty.shape.values], ty.dtype)
                 for j, ty in enumerate(elem_types)]
    signature = _Signature(carried_types, acc_types, captured_types)
    functions = _build_levels(bb, spec, label, signature)

    acc_init = [relax.op.zeros(relax.ShapeExpr([0, *dims]), ty.dtype)
                for dims, ty in zip(elem_outside, elem_types, strict=True)]
    args = [relax.const(0, "int64"), stop, cond, *spec.carried_init, *acc_init, *spec.captured.values()]
    result = bb.emit(relax.Call(functions[-1], args))
    fields = [bb.emit(relax.TupleGetItem(result, j)) for j in range(2 + len(carried_types) + len(acc_types))]
    finals = []
    for position, (name, ty) in enumerate(zip(spec.carried_names, carried_types, strict=True)):
        # The dims the body keeps are known after the loop too; one it changes is a new dim of its own.
        dims = []
        for axis, dim in enumerate(ty.shape.values):
            known = outside_dims(relax.TensorType([dim], ty.dtype))
            dims.append(known[0] if known is not None and not any(dim.same_as(v) for v in fresh)
                        else tvm.tirx.Var(f"{label}_{name}_out_d{axis}", "int64"))
        finals.append(bb.match_cast(fields[2 + position], relax.TensorType(dims, ty.dtype)))
    stacked = []
    for j, (dims, elem) in enumerate(zip(elem_outside, elem_types, strict=True)):
        count = tvm.tirx.Var(f"{label}_count{j}", "int64")
        stacked.append(bb.match_cast(fields[2 + len(carried_types) + j],
                                     relax.TensorType([count, *dims], elem.dtype)))
    return finals, stacked


def _step_types(bb: relax.BlockBuilder, spec: LoopSpec, carried_types: list[Any],
                captured_types: list[Any]) -> tuple[list[Any], list[Any]]:
    """Emit the body once with these carried types (the result thrown away): its outputs' types."""
    i = relax.Var("i", SCALAR_I64)
    cond = relax.Var("cond", SCALAR_BOOL)
    carried_vars = [relax.Var(f"carried{k}", ty) for k, ty in enumerate(carried_types)]
    captured_vars = {name: relax.Var(f"captured{j}", ty)
                     for j, (name, ty) in enumerate(zip(spec.captured, captured_types, strict=True))}
    out: dict[str, Any] = {}

    def build() -> Any:
        _, values, elems = spec.step(i, cond, carried_vars, captured_vars)
        out["values"], out["elems"] = values, elems
        return relax.Tuple([*values, *elems])

    in_scope(bb, [i, cond, *carried_vars, *captured_vars.values()], build)
    values = [tensor_type(v, f"carried value {name!r}", spec)
              for name, v in zip(spec.carried_names, out["values"], strict=True)]
    elems = [tensor_type(v, f"scan output {name!r}", spec) for name, v in zip(spec.scan_names, out["elems"],
                                                                            strict=True)]
    return values, elems


@dataclass
class _Signature:
    carried_types: list[relax.TensorType]
    acc_types: list[relax.TensorType]
    captured_types: list[relax.TensorType]

    def loose_params(self) -> list[Any]:
        return [SCALAR_I64, SCALAR_I64, SCALAR_BOOL, *map(_loose, self.carried_types), *map(_loose, self.acc_types),
                *map(_loose, self.captured_types)]

    def returns(self) -> relax.TupleType:
        return relax.TupleType([SCALAR_I64, SCALAR_BOOL, *map(_loose, self.carried_types),
                                *map(_loose, self.acc_types)])


def _build_levels(bb: relax.BlockBuilder, spec: LoopSpec, label: str, signature: _Signature) -> list[Any]:
    """The step function and the chunk functions above it, added to the module being built; each is first
    added as a placeholder of its signature, so that the functions can call each other and themselves."""
    gvars = []
    for level in range(LEVELS):
        params = [relax.Var(f"p{j}", ty) for j, ty in enumerate(signature.loose_params())]
        state = 3 + len(signature.carried_types) + len(signature.acc_types)
        fields = [params[0], params[2], *params[3:state]]  # (i, cond, carried..., scanned...): the signature's
        placeholder = relax.Function(params, relax.Tuple(fields), signature.returns(), is_pure=True)
        # Named in an attribute: the block builder gives structurally equal functions one GlobalVar.
        gvars.append(bb.add_func(placeholder.with_attr("forge.loop_function", f"{label}_{level}"),
                                 f"{label}_{level}"))
    for level, gv in enumerate(gvars):
        bb.update_func(gv, _level_function(bb, spec, label, signature, gvars, level))
    return gvars


def _level_function(bb: relax.BlockBuilder, spec: LoopSpec, label: str, signature: _Signature,
                    gvars: list[Any], level: int) -> relax.Function:
    i = relax.Var("i", SCALAR_I64)
    stop = relax.Var("stop", SCALAR_I64)
    cond = relax.Var("cond", SCALAR_BOOL)
    carried_vars = [relax.Var(f"carried{k}", ty) for k, ty in enumerate(signature.carried_types)]
    acc_vars = [relax.Var(f"scanned{j}", ty) for j, ty in enumerate(signature.acc_types)]
    captured_vars = {name: relax.Var(f"captured{j}", ty)
                     for j, (name, ty) in enumerate(zip(spec.captured, signature.captured_types, strict=True))}
    one = relax.const(1, "int64")

    def step() -> Any:
        next_cond, values, elems = spec.step(i, cond, carried_vars, captured_vars)
        accs = [bb.emit(relax.op.concat([acc, relax.op.expand_dims(elem, 0)], axis=0))
                for acc, elem in zip(acc_vars, elems, strict=True)]
        return bb.emit(relax.Call(gvars[0], [bb.emit(relax.op.add(i, one)), stop, next_cond, *values, *accs,
                                             *captured_vars.values()]))

    def chunk() -> Any:
        size = relax.const(CHUNK ** level, "int64")
        sub_stop = bb.emit(relax.op.minimum(relax.op.add(i, size), stop))
        # The level below stacks its chunk's scan outputs from empty; appended here once per chunk, each
        # element is copied about CHUNK / 2 times per level, not once per later iteration.
        empty = [relax.op.zeros(relax.ShapeExpr([0, *ty.shape.values[1:]]), ty.dtype) for ty in signature.acc_types]
        inner = bb.emit(relax.Call(gvars[level - 1], [i, sub_stop, cond, *carried_vars, *empty,
                                                       *captured_vars.values()]))
        fields = [bb.emit(relax.TupleGetItem(inner, j)) for j in range(len(signature.returns().fields))]
        state = fields[: len(fields) - len(acc_vars)]
        parts = [bb.match_cast(part, relax.TensorType([tvm.tirx.Var(f"{label}_chunk{j}", "int64"),
                                                       *ty.shape.values[1:]], ty.dtype))
                 for j, (part, ty) in enumerate(zip(fields[len(state):], signature.acc_types, strict=True))]
        accs = [bb.emit(relax.op.concat([acc, part], axis=0)) for acc, part in zip(acc_vars, parts, strict=True)]
        return bb.emit(relax.Call(gvars[level], [state[0], stop, *state[1:], *accs, *captured_vars.values()]))

    def function_body() -> Any:
        go = bb.emit(relax.op.logical_and(relax.op.less(i, stop), cond))
        then = in_scope(bb, [], step if level == 0 else chunk)
        done = relax.Tuple([i, cond, *carried_vars, *acc_vars])
        return bb.emit(relax.If(go, then, relax.SeqExpr([], done)))

    all_params = [i, stop, cond, *carried_vars, *acc_vars, *captured_vars.values()]
    seq = in_scope(bb, all_params, function_body)
    return relax.Function(all_params, seq, signature.returns(), is_pure=True)
