"""ONNX ``Loop`` and ``Scan``: the body as a Relax function that calls itself, once per iteration.

Relax has no loop construct; a loop is a function whose ``If`` either runs the body and calls the function
again with the next values, or returns them. The importer builds, per Loop or Scan node:

* a *step* function ``loop_0(i, stop, cond, carried..., scanned..., captured...)``: while ``i < stop`` and
  ``cond``, it runs the body and calls itself with ``i + 1``; else it returns ``(i, cond, carried...,
  scanned...)``. ``scanned`` are the per-iteration outputs stacked so far (ONNX's scan outputs).
* ``LEVELS - 1`` *chunk* functions above it: ``loop_k`` runs ``loop_{k-1}`` over ``CHUNK ** k`` iterations
  at a time. TVM's VM recurses on the C++ stack (an 8 MB stack held about 2000 nested calls), so a chain of
  one call per iteration would crash a long loop; chunked, a loop of ``n`` iterations nests about
  ``CHUNK * (LEVELS - 1) + n / CHUNK ** (LEVELS - 1)`` calls (100 000 iterations: 73). Each level stacks
  its own chunk's scan outputs, which the level above appends at once: an element is copied about
  ``CHUNK / 2`` times per level rather than once per later iteration (30 s of WeSpeaker's frames, 2998
  iterations: 486 ms with one stack for the whole loop).

The body runs only inside the ``If`` (an iteration past the end would read past a scanned input). Values the
body reads from the enclosing graph (``captured``) are parameters, constants stay constants, and a carried
value the body passes through unchanged (Paddle2ONNX carries every weight of a decoder so) is read like a
captured one. A carried value whose shape the body changes (a sequence that grows by one token per
iteration) gets its own symbolic dims; one whose shape holds keeps it, static where it was.

``Scan`` (opset 9 and later) is the same loop over the scanned axis of its inputs, each iteration taking
one slice (from the end when its direction is reversed), its outputs stacked along ``scan_output_axes``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import tvm
import tvm_ffi
from tvm import relax

from forge_core.errors import OperatorConversionError
from forge_core.runtime.signature import RUN_TIME_CHECK

# Iterations run by one call of the level below, per level: level k runs CHUNK ** k iterations at a time.
CHUNK = 16
LEVELS = 4
_INT64_MAX = np.iinfo(np.int64).max
_counter = itertools.count()


@dataclass
class _Loop:
    """One Loop or Scan, as the step function sees it."""

    node: str
    body: onnx.GraphProto
    # Names, in the body, of the iteration number and of the condition (None: the body does not read it).
    iter_name: str | None
    cond_name: str | None
    carried_names: list[str]            # body inputs carried from one iteration to the next
    carried_init: list[relax.Expr]
    cond_out: str | None                # the body output that decides the next iteration (Loop)
    carried_out: list[str]
    scan_out: list[str]
    # Scan: each scanned body input's name, the whole tensor and its axis and direction.
    scanned_inputs: list[tuple[str, relax.Expr, int, bool]] = field(default_factory=list)


def _free_names(graph: onnx.GraphProto) -> list[str]:
    """The names ``graph`` reads from the scopes around it, in order of first use."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} \
        | {t.name for t in graph.sparse_initializer}
    free: dict[str, None] = {}
    for node in graph.node:
        used = list(node.input)
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                used.extend(_free_names(sub))
        for name in used:
            if name and name not in defined:
                free.setdefault(name)
        defined.update(node.output)
    for out in graph.output:
        if out.name not in defined:
            free.setdefault(out.name)
    return list(free)


def _is_empty_sequence(value: Any) -> bool:
    return isinstance(value, relax.Tuple) and len(value.fields) == 0


def _appended_sequences(body: onnx.GraphProto, carried_names: list[str], carried_out: list[str],
                        initial: list[Any]) -> dict[int, tuple[onnx.NodeProto, str]]:
    """The carried sequences that start empty and to which each iteration appends one tensor, by slot: the
    ``SequenceInsert`` node and the tensor. The torch exporter writes a Python list appended in a loop so
    (``outs.append(x)``, then ``torch.stack(outs)``); Forge stacks the tensors as a scan output."""
    found = {}
    for k, (name, out) in enumerate(zip(carried_names, carried_out, strict=True)):
        if not _is_empty_sequence(initial[k]):
            continue
        readers = [n for n in body.node if name in n.input] + [n for n in body.node for a in n.attribute
                                                               if a.type == onnx.AttributeProto.GRAPH
                                                               and name in _free_names(a.g)]
        if len(readers) != 1:
            continue
        insert = readers[0]
        if insert.op_type != "SequenceInsert" or list(insert.output) != [out] or insert.input[0] != name \
                or len([i for i in insert.input if i]) != 2 or out in {o.name for o in body.output} - {out}:
            continue
        found[k] = (insert, insert.input[1])
    return found


def _without_nodes(body: onnx.GraphProto, dropped: set[str]) -> onnx.GraphProto:
    """A copy of ``body`` without the nodes whose first output is in ``dropped``."""
    copy = onnx.GraphProto()
    copy.CopyFrom(body)
    del copy.node[:]
    copy.node.extend(n for n in body.node if not (n.output and n.output[0] in dropped))
    return copy


def _tensor_type(value: relax.Expr, what: str, node: str, op: str) -> relax.TensorType:
    ty = getattr(value, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise OperatorConversionError(
            "onnx", op, node, TypeError(f"{what} must be a tensor of known rank; got {ty}. Sequences, optionals "
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


def _same_type(a: relax.TensorType, b: relax.TensorType) -> bool:
    if a.shape is None or b.shape is None:
        return False
    return a.dtype == b.dtype and tvm_ffi.structural_equal(a.shape, b.shape)


def _symbolic_vars(ty: relax.TensorType) -> list[tvm.tirx.Var]:
    if ty.shape is None:
        return []
    found: list[tvm.tirx.Var] = []
    for dim in ty.shape.values:
        found.extend(tvm.tirx.analysis.undefined_vars(dim))
    return found


def _loose(ty: relax.TensorType) -> relax.TensorType:
    return relax.TensorType(ndim=ty.ndim, dtype=ty.dtype)


_SCALAR_I64 = relax.TensorType([], "int64")
_SCALAR_BOOL = relax.TensorType([], "bool")


class LoopImporter:
    """The Loop and Scan conversion of Forge's ONNX importer (a mixin of ``loader._ForgeImporter``)."""

    bb: relax.BlockBuilder
    _nodes: dict[str, Any]
    _branch_stack: list[Any]
    _loop_functions: list[tuple[relax.GlobalVar, relax.Function]]
    _stacked_sequences: list[relax.Expr]

    # The importer's own methods.
    _construct_nodes: Callable[[Any], None]
    branch_taken: Callable[[], Any]

    def convert_loop(self, op: str, node: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> Any:
        """The outputs of a Loop or Scan node: a Tuple, or the value itself when there is one (TVM's node loop
        binds a one-output node's result as it is)."""
        if op == "Loop":
            outputs = self._convert_onnx_loop(node, inputs, attrs)
        else:
            outputs = self._convert_scan(node, inputs, attrs)
        return outputs.fields[0] if len(outputs.fields) == 1 else outputs

    def _convert_onnx_loop(self, node: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> relax.Tuple:
        body = attrs["body"]
        trip, cond = (list(inputs) + [None, None])[:2]
        initial = list(inputs[2:])
        names = [i.name for i in body.input]
        outs = [o.name for o in body.output]
        if len(names) != 2 + len(initial) or len(outs) < 1 + len(initial):
            raise OperatorConversionError("onnx", "Loop", node, ValueError(
                f"its body takes {len(names)} inputs and gives {len(outs)} outputs; a Loop with {len(initial)} "
                f"carried values needs {2 + len(initial)} inputs and at least {1 + len(initial)} outputs"))
        carried_names, carried_out = names[2:], outs[1:1 + len(initial)]
        appended = _appended_sequences(body, carried_names, carried_out, initial)
        kept = [k for k in range(len(initial)) if k not in appended]
        if appended:
            body = _without_nodes(body, {node.output[0] for node, _ in appended.values()})
        loop = _Loop(node, body, names[0], names[1], [carried_names[k] for k in kept], [initial[k] for k in kept],
                     outs[0], [carried_out[k] for k in kept],
                     outs[1 + len(initial):] + [value for _, value in appended.values()])
        stop = self._scalar(trip, "int64", _INT64_MAX)
        start_cond = self._scalar(cond, "bool", True)
        final_carried, scanned = self._run(loop, stop, start_cond, "Loop")
        # Each appended sequence comes back as its stacked tensor, which ConcatFromSequence, SequenceAt and
        # SequenceLength read (read_stacked_sequence).
        stacked = scanned[len(scanned) - len(appended):]
        finals = iter(final_carried)
        by_slot = dict(zip(appended, stacked, strict=True))
        carried_results = []
        for k in range(len(initial)):
            if k in by_slot:
                self._stacked_sequences.append(by_slot[k])
                carried_results.append(by_slot[k])
            else:
                carried_results.append(next(finals))
        return relax.Tuple(carried_results + scanned[: len(scanned) - len(appended)])

    def read_stacked_sequence(self, op: str, node: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> Any:
        """``op`` on a sequence that a Loop built by appending (now one stacked tensor); None when ``inputs[0]`` is
        no such sequence."""
        stacked = inputs[0] if inputs else None
        if stacked is None or not any(stacked.same_as(s) for s in self._stacked_sequences):
            return None
        rank = stacked.ty.ndim
        if op == "ConcatFromSequence":
            axis = int(attrs.get("axis", 0))
            if int(attrs.get("new_axis", 0)):
                axis = axis + rank if axis < 0 else axis  # the new axis counts in the result's rank
                order = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
                return relax.op.permute_dims(stacked, order) if axis else stacked
            axis = axis + rank - 1 if axis < 0 else axis
            # Concatenated along axis: the stacking axis moved next to it, then the two merged.
            order = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
            moved = self.bb.emit(relax.op.permute_dims(stacked, order)) if axis else stacked
            dims = list(moved.ty.shape.values)
            merged = dims[:axis] + [dims[axis] * dims[axis + 1]] + dims[axis + 2:]
            return relax.op.reshape(moved, relax.ShapeExpr(merged))
        if op == "SequenceLength":
            return relax.op.take(relax.op.shape_to_tensor(relax.op.shape_of(stacked)), relax.const(0, "int64"),
                                 axis=0)
        if op == "SequenceAt":
            position = inputs[1]
            length = relax.op.take(relax.op.shape_to_tensor(relax.op.shape_of(stacked)), relax.const(0, "int64"),
                                   axis=0)
            position = self.bb.emit(relax.op.astype(position, "int64"))
            index = self.bb.emit(relax.op.where(relax.op.less(position, relax.const(0, "int64")),
                                                relax.op.add(position, length), position))
            self.bb.emit(relax.op.assert_op(
                relax.op.logical_and(relax.op.greater_equal(index, relax.const(0, "int64")),
                                     relax.op.less(index, length)), [position, length],
                f"{RUN_TIME_CHECK}SequenceAt {node!r}: position {{}} is outside the sequence of {{}} tensors"))
            return relax.op.take(stacked, index, axis=0)
        raise OperatorConversionError("onnx", op, node, TypeError(
            "it reads a sequence that a Loop built by appending, which Forge holds as one stacked tensor: only "
            "ConcatFromSequence, SequenceAt and SequenceLength read it"))

    def _convert_scan(self, node: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> relax.Tuple:
        body = attrs["body"]
        n_scan_in = int(attrs["num_scan_inputs"])
        states = list(inputs[: len(inputs) - n_scan_in])
        scans = list(inputs[len(inputs) - n_scan_in:])
        n_scan_out = len(body.output) - len(states)
        in_axes = list(attrs.get("scan_input_axes", [0] * n_scan_in)) or [0] * n_scan_in
        in_dirs = list(attrs.get("scan_input_directions", [0] * n_scan_in)) or [0] * n_scan_in
        out_axes = list(attrs.get("scan_output_axes", [0] * n_scan_out)) or [0] * n_scan_out
        out_dirs = list(attrs.get("scan_output_directions", [0] * n_scan_out)) or [0] * n_scan_out
        if any(x is None for x in scans) or not scans:
            raise OperatorConversionError("onnx", "Scan", node, ValueError("a Scan needs its scanned inputs"))
        names = [i.name for i in body.input]
        outs = [o.name for o in body.output]
        scanned_inputs = []
        for name, value, axis, reverse in zip(names[len(states):], scans, in_axes, in_dirs, strict=True):
            rank = _tensor_type(value, f"scanned input {name!r}", node, "Scan").ndim
            scanned_inputs.append((name, value, axis + rank if axis < 0 else axis, bool(reverse)))
        loop = _Loop(node, body, None, None, names[: len(states)], states, None, outs[: len(states)],
                     outs[len(states):], scanned_inputs)
        lengths = [self.bb.emit(relax.op.take(relax.op.shape_to_tensor(relax.op.shape_of(value)),
                                              relax.const(axis, "int64"), axis=0))
                   for _, value, axis, _ in scanned_inputs]
        length = lengths[0]
        for (name, _, axis, _), other in zip(scanned_inputs[1:], lengths[1:]):
            # Each iteration takes one slice of every scanned input: a shorter one would be read past its end.
            self.bb.emit(relax.op.assert_op(
                relax.op.equal(other, length), [other, length],
                f"{RUN_TIME_CHECK}Scan {node!r}: its scanned input {name!r} has {{}} steps along axis {axis}, the "
                f"first one {{}}; ONNX requires the same number of steps in every scanned input"))
        final_states, stacked = self._run(loop, length, self._scalar(None, "bool", True), "Scan")
        outputs = []
        for value, axis, reverse in zip(stacked, out_axes, out_dirs, strict=True):
            rank = value.ty.ndim
            if reverse:
                value = self.bb.emit(relax.op.flip(value, axis=0))
            axis = axis + rank if axis < 0 else axis
            if axis:
                order = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
                value = self.bb.emit(relax.op.permute_dims(value, order))
            outputs.append(value)
        return relax.Tuple(final_states + outputs)

    def _scalar(self, value: Any, dtype: str, default: Any) -> relax.Expr:
        if value is None:
            return relax.const(default, dtype)
        if value.ty.ndim != 0:
            value = self.bb.emit(relax.op.reshape(value, []))
        return value if value.ty.dtype == dtype else self.bb.emit(relax.op.astype(value, dtype))

    def _run(self, loop: _Loop, stop: relax.Expr, cond: relax.Expr, op: str) -> tuple[list[Any], list[Any]]:
        """Build the loop's functions, call them; the final carried values and the stacked scan outputs."""
        label = f"loop{next(_counter)}"
        # Pass-through carried values: read like captured ones.
        passed = {k for k, (name, out) in enumerate(zip(loop.carried_names, loop.carried_out, strict=True))
                  if name == out}
        carried = [k for k in range(len(loop.carried_names)) if k not in passed]
        for k in carried:
            _tensor_type(loop.carried_init[k], f"carried value {loop.carried_names[k]!r}", loop.node, op)
        fixed = {loop.carried_names[k]: loop.carried_init[k] for k in passed}
        bound = {loop.iter_name, loop.cond_name, *loop.carried_names, *(s[0] for s in loop.scanned_inputs)}
        captured = {name: self._nodes[name] for name in _free_names(loop.body)
                    if name not in bound and name in self._nodes}
        captured.update(fixed)
        scanned_whole = {f"{label}/scan{j}": value for j, (_, value, _, _) in enumerate(loop.scanned_inputs)}
        outside: dict[str, Any] = {}    # captured values that are constants: read directly
        params: dict[str, Any] = {}     # the others: the functions' parameters
        for name, value in {**captured, **scanned_whole}.items():
            if isinstance(value, tvm.ir.GenericConst) or isinstance(value, relax.ShapeExpr) and all(
                    isinstance(v, tvm.tirx.IntImm) for v in value.values):
                outside[name] = value
                continue
            if isinstance(value, relax.Expr) and isinstance(getattr(value, "ty", None), relax.ShapeType):
                value = self.bb.emit(relax.op.shape_to_tensor(value))
            if not isinstance(value, relax.Var):
                value = self.bb.emit(value)
            _tensor_type(value, f"the value {name!r} read from outside the body", loop.node, op)
            params[name] = value
        taken = self.branch_taken()
        if taken is not None and not (isinstance(taken, tvm.ir.GenericConst)):
            params[f"{label}/taken"] = taken if isinstance(taken, relax.Var) else self.bb.emit(taken)

        # Types: carried values as they enter, generalized where the body changes them; scan outputs stacked.
        # The dims of the values as the loop starts, in the scope around it (for the scan outputs' dims).
        entry = tvm.sym.Analyzer()
        carried_types = {k: _param_type(loop.carried_init[k].ty, f"{label}_{loop.carried_names[k]}", entry)
                         for k in carried}
        param_types = [_param_type(value.ty, f"{label}_captured{j}", entry) if isinstance(value.ty, relax.TensorType)
                       else value.ty for j, value in enumerate(params.values())]
        fresh: list[Any] = []     # the symbolic dims made here (a dim the body changes)
        for _ in range(4):
            step_types = self._step_types(loop, label, carried, carried_types, params, param_types, outside)
            changed = False
            for k in carried:
                before, after = carried_types[k], step_types[0][k]
                if after.dtype != before.dtype or after.ndim != before.ndim:
                    raise OperatorConversionError("onnx", op, loop.node, TypeError(
                        f"its body turns the carried value {loop.carried_names[k]!r} from {before} into {after}; "
                        "ONNX requires the same element type and rank in every iteration"))
                dims = _settled_dims(before, after, fresh, f"{label}_{loop.carried_names[k]}")
                if dims is not None:
                    fresh.extend(d for d in dims if isinstance(d, tvm.tirx.Var))
                    carried_types[k] = relax.TensorType(dims, before.dtype)
                    changed = True
            if not changed:
                break
        else:
            raise OperatorConversionError("onnx", op, loop.node, ValueError("the shapes of its carried values do "
                                                                            "not settle"))
        elem_types = step_types[1]
        outer_vars = [v for value in [*loop.carried_init, *params.values()] for v in _symbolic_vars(value.ty)]

        def outside_dims(ty: relax.TensorType) -> list[Any] | None:
            """``ty``'s dims in the scope around the loop, as they are when it starts; None if one changes."""
            if ty.shape is None:
                return None
            dims = [entry.simplify(dim) for dim in ty.shape.values]
            known = all(any(v.same_as(o) for o in outer_vars) for dim in dims
                        for v in tvm.tirx.analysis.undefined_vars(dim))
            return dims if known else None

        elem_outside = []
        for name, ty in zip(loop.scan_out, elem_types, strict=True):
            dims = outside_dims(ty)
            if dims is None:
                raise OperatorConversionError("onnx", op, loop.node, ValueError(
                    f"its scan output {name!r} has a shape ({ty}) that changes from one iteration to the next "
                    "or is not known before the loop runs; ONNX requires one shape for all iterations"))
            elem_outside.append(dims)
        acc_types = [relax.TensorType([tvm.tirx.Var(f"{label}_n{j}", "int64"), *ty.shape.values], ty.dtype)
                     for j, ty in enumerate(elem_types)]
        signature = _Signature(carried, [carried_types[k] for k in carried], acc_types, param_types)
        functions = self._build_levels(loop, label, signature, params, outside)

        acc_init = [relax.op.zeros(relax.ShapeExpr([0, *dims]), ty.dtype)
                    for dims, ty in zip(elem_outside, elem_types, strict=True)]
        args = [relax.const(0, "int64"), stop, cond, *(loop.carried_init[k] for k in carried), *acc_init,
                *params.values()]
        result = self.bb.emit(relax.Call(functions[-1], args))
        fields = [self.bb.emit(relax.TupleGetItem(result, j)) for j in range(2 + len(carried) + len(acc_types))]
        finals: list[Any] = list(loop.carried_init)
        for position, k in enumerate(carried):
            # The dims the body keeps are known after the loop too; one it changes is a new dim of its own.
            ty = carried_types[k]
            dims = []
            for axis, dim in enumerate(ty.shape.values):
                known = outside_dims(relax.TensorType([dim], ty.dtype))
                dims.append(known[0] if known is not None and not any(dim.same_as(v) for v in fresh)
                            else tvm.tirx.Var(f"{label}_{loop.carried_out[k]}_d{axis}", "int64"))
            finals[k] = self.bb.match_cast(fields[2 + position], relax.TensorType(dims, ty.dtype))
        stacked = []
        for j, (dims, elem) in enumerate(zip(elem_outside, elem_types, strict=True)):
            count = tvm.tirx.Var(f"{label}_count{j}", "int64")
            stacked.append(self.bb.match_cast(fields[2 + len(carried) + j],
                                              relax.TensorType([count, *dims], elem.dtype)))
        return finals, stacked

    # -- the body ------------------------------------------------------------------------------------------

    def _in_scope(self, params: list[relax.Var], build: Callable[[], Any]) -> relax.SeqExpr:
        """``build()``'s bindings as a SeqExpr of their own (a function body or a branch), not the open block."""
        bb = self.bb
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

    def _body(self, loop: _Loop, label: str, i: relax.Var, cond: relax.Var, carried: list[int],
              carried_vars: list[relax.Var], param_vars: dict[str, relax.Var],
              outside: dict[str, Any]) -> tuple[Any, list[Any], list[Any]]:
        """Emit the body's nodes; its next condition, carried values (one per carried slot) and scan elements."""
        saved_nodes, saved_stack = self._nodes, self._branch_stack
        nodes = dict(saved_nodes)
        nodes.update(outside)
        nodes.update({name: var for name, var in param_vars.items()})
        for position, k in enumerate(carried):
            nodes[loop.carried_names[k]] = carried_vars[position]
        if loop.iter_name:
            nodes[loop.iter_name] = i
        if loop.cond_name:
            nodes[loop.cond_name] = cond
        for j, (name, _, axis, reverse) in enumerate(loop.scanned_inputs):
            whole = nodes[f"{label}/scan{j}"]
            index = i
            if reverse:
                length = relax.op.take(relax.op.shape_to_tensor(relax.op.shape_of(whole)),
                                       relax.const(axis, "int64"), axis=0)
                index = self.bb.emit(relax.op.subtract(relax.op.subtract(length, i), relax.const(1, "int64")))
            nodes[name] = self.bb.emit(relax.op.take(whole, index, axis=axis))
        self._nodes = nodes
        taken = param_vars.get(f"{label}/taken")
        self._branch_stack = [taken] if taken is not None else []
        try:
            for init in loop.body.initializer:
                self._nodes[init.name] = relax.const(onnx.numpy_helper.to_array(init))
            self._construct_nodes(loop.body)
            missing = [n for n in [loop.cond_out, *loop.carried_out, *loop.scan_out] if n and n not in self._nodes]
            if missing:
                raise OperatorConversionError("onnx", "Loop" if loop.scanned_inputs == [] else "Scan", loop.node,
                                              ValueError(f"its body never computes {missing}"))
            next_cond = self._nodes[loop.cond_out] if loop.cond_out else cond
            values = [self._tensor(self._nodes[loop.carried_out[k]]) for k in carried]
            elems = [self._tensor(self._nodes[name]) for name in loop.scan_out]
            if loop.cond_out:
                next_cond = self._scalar(self._tensor(next_cond), "bool", True)
            return next_cond, values, elems
        finally:
            self._nodes, self._branch_stack = saved_nodes, saved_stack

    def _tensor(self, value: Any) -> Any:
        if isinstance(value, relax.Expr) and isinstance(getattr(value, "ty", None), relax.ShapeType):
            return self.bb.emit(relax.op.shape_to_tensor(value))
        if isinstance(value, relax.Expr) and not isinstance(value, (relax.Var, tvm.ir.GenericConst)):
            return self.bb.emit(value)
        return value

    def _step_types(self, loop: _Loop, label: str, carried: list[int], carried_types: dict[int, Any],
                    params: dict[str, Any], param_types: list[Any],
                    outside: dict[str, Any]) -> tuple[dict[int, Any], list[Any]]:
        """Convert the body once with these carried types (the result thrown away): its outputs' types."""
        i = relax.Var("i", _SCALAR_I64)
        cond = relax.Var("cond", _SCALAR_BOOL)
        carried_vars = [relax.Var(f"carried{k}", carried_types[k]) for k in carried]
        param_vars = {name: relax.Var(f"captured{j}", ty) for j, (name, ty) in enumerate(zip(params, param_types))}
        out: dict[str, Any] = {}

        def build() -> Any:
            _, values, elems = self._body(loop, label, i, cond, carried, carried_vars, param_vars, outside)
            out["values"], out["elems"] = values, elems
            return relax.Tuple([*values, *elems]) if values or elems else relax.Tuple([])

        self._in_scope([i, cond, *carried_vars, *param_vars.values()], build)
        values = {k: _tensor_type(v, f"carried value {loop.carried_out[k]!r}", loop.node, "Loop")
                  for k, v in zip(carried, out["values"], strict=True)}
        elems = [_tensor_type(v, f"scan output {name!r}", loop.node, "Loop")
                 for name, v in zip(loop.scan_out, out["elems"], strict=True)]
        return values, elems

    # -- the functions -------------------------------------------------------------------------------------

    def _build_levels(self, loop: _Loop, label: str, signature: _Signature, params: dict[str, Any],
                      outside: dict[str, Any]) -> list[relax.GlobalVar]:
        """The step function and the chunk functions above it, each a GlobalVar typed before it is built."""
        gvars = []
        for level in range(LEVELS):
            gv = relax.GlobalVar(f"{label}_{level}")
            relax.expr._update_type(gv, relax.FuncType(signature.loose_params(), signature.returns()))
            gvars.append(gv)
        for level, gv in enumerate(gvars):
            function = self._level_function(loop, label, signature, params, outside, gvars, level)
            self._loop_functions.append((gv, function))
        return gvars

    def _level_function(self, loop: _Loop, label: str, signature: _Signature, params: dict[str, Any],
                        outside: dict[str, Any], gvars: list[relax.GlobalVar], level: int) -> relax.Function:
        i = relax.Var("i", _SCALAR_I64)
        stop = relax.Var("stop", _SCALAR_I64)
        cond = relax.Var("cond", _SCALAR_BOOL)
        carried_vars = [relax.Var(f"carried{k}", ty) for k, ty in zip(signature.carried, signature.carried_types,
                                                                     strict=True)]
        acc_vars = [relax.Var(f"scanned{j}", ty) for j, ty in enumerate(signature.acc_types)]
        param_vars = {name: relax.Var(f"captured{j}", ty)
                      for j, (name, ty) in enumerate(zip(params, signature.captured_types))}
        bb = self.bb
        one = relax.const(1, "int64")

        def step() -> Any:
            next_cond, values, elems = self._body(loop, label, i, cond, signature.carried, carried_vars, param_vars,
                                                  outside)
            accs = [bb.emit(relax.op.concat([acc, relax.op.expand_dims(elem, 0)], axis=0))
                    for acc, elem in zip(acc_vars, elems, strict=True)]
            return bb.emit(relax.Call(gvars[0], [bb.emit(relax.op.add(i, one)), stop, next_cond, *values, *accs,
                                                 *param_vars.values()]))

        def chunk() -> Any:
            size = relax.const(CHUNK ** level, "int64")
            sub_stop = bb.emit(relax.op.minimum(relax.op.add(i, size), stop))
            # The level below stacks its chunk's scan outputs from empty; appended here once per chunk, each
            # element is copied about CHUNK / 2 times per level, not once per later iteration.
            empty = [relax.op.zeros(relax.ShapeExpr([0, *ty.shape.values[1:]]), ty.dtype)
                     for ty in signature.acc_types]
            inner = bb.emit(relax.Call(gvars[level - 1], [i, sub_stop, cond, *carried_vars, *empty,
                                                           *param_vars.values()]))
            fields = [bb.emit(relax.TupleGetItem(inner, j)) for j in range(len(signature.returns().fields))]
            state = fields[: len(fields) - len(acc_vars)]
            parts = [bb.match_cast(part, relax.TensorType([tvm.tirx.Var(f"{label}_chunk{j}", "int64"),
                                                           *ty.shape.values[1:]], ty.dtype))
                     for j, (part, ty) in enumerate(zip(fields[len(state):], signature.acc_types, strict=True))]
            accs = [bb.emit(relax.op.concat([acc, part], axis=0)) for acc, part in zip(acc_vars, parts, strict=True)]
            return bb.emit(relax.Call(gvars[level], [state[0], stop, *state[1:], *accs, *param_vars.values()]))

        def function_body() -> Any:
            go = bb.emit(relax.op.logical_and(relax.op.less(i, stop), cond))
            then = self._in_scope([], step if level == 0 else chunk)
            done = relax.Tuple([i, cond, *carried_vars, *acc_vars])
            return bb.emit(relax.If(go, then, relax.SeqExpr([], done)))

        all_params = [i, stop, cond, *carried_vars, *acc_vars, *param_vars.values()]
        seq = self._in_scope(all_params, function_body)
        return relax.Function(all_params, seq, relax.TupleType([f for f in signature.returns().fields]),
                              is_pure=True)


@dataclass
class _Signature:
    carried: list[int]
    carried_types: list[relax.TensorType]
    acc_types: list[relax.TensorType]
    captured_types: list[Any]

    def loose_params(self) -> list[Any]:
        return [_SCALAR_I64, _SCALAR_I64, _SCALAR_BOOL, *map(_loose, self.carried_types), *map(_loose, self.acc_types),
                *(_loose(t) if isinstance(t, relax.TensorType) else t for t in self.captured_types)]

    def returns(self) -> relax.TupleType:
        return relax.TupleType([_SCALAR_I64, _SCALAR_BOOL, *map(_loose, self.carried_types),
                                *map(_loose, self.acc_types)])
