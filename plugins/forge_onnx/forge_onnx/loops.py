"""ONNX ``Loop`` and ``Scan`` on :mod:`forge_core.ir.loops` (the body as a Relax function that calls itself).

Values the body reads from the enclosing graph (``captured``) are parameters, constants stay constants, and a
carried value the body passes through unchanged (Paddle2ONNX carries every weight of a decoder so) is read
like a captured one. A sequence carried from ``SequenceEmpty`` that each iteration appends to (TorchScript's
list) is stacked like a scan output.

``Scan`` (opset 9 and later) is the same loop over the scanned axis of its inputs, each iteration taking
one slice (from the end when its direction is reversed), its outputs stacked along ``scan_output_axes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import tvm
from tvm import relax

from forge_core.errors import OperatorConversionError
from forge_core.ir.loops import INT64_MAX, LoopSpec, build_loop, new_label
from forge_core.runtime.signature import RUN_TIME_CHECK



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




class LoopImporter:
    """The Loop and Scan conversion of Forge's ONNX importer (a mixin of ``loader._ForgeImporter``)."""

    bb: relax.BlockBuilder
    _nodes: dict[str, Any]
    _branch_stack: list[Any]
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
        stop = self._scalar(trip, "int64", INT64_MAX)
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
            ty = getattr(value, "ty", None)
            if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
                raise OperatorConversionError("onnx", "Scan", node, TypeError(
                    f"its scanned input {name!r} must be a tensor of known rank; got {ty}"))
            rank = ty.ndim
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
        """The loop's functions (forge_core.ir.loops), called; the final carried values and the stacked scan
        outputs."""
        label = new_label()
        # Pass-through carried values: read like captured ones.
        passed = {k for k, (name, out) in enumerate(zip(loop.carried_names, loop.carried_out, strict=True))
                  if name == out}
        carried = [k for k in range(len(loop.carried_names)) if k not in passed]
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
            params[name] = value
        taken = self.branch_taken()
        if taken is not None and not (isinstance(taken, tvm.ir.GenericConst)):
            params[f"{label}/taken"] = taken if isinstance(taken, relax.Var) else self.bb.emit(taken)

        def step(i: relax.Var, cond: relax.Var, carried_vars: list[relax.Var],
                 param_vars: dict[str, relax.Var]) -> tuple[Any, list[Any], list[Any]]:
            return self._body(loop, label, i, cond, carried, carried_vars, param_vars, outside)

        spec = LoopSpec("onnx", op, loop.node, [loop.carried_names[k] for k in carried],
                        [loop.carried_init[k] for k in carried], params, loop.scan_out, step)
        finals, stacked = build_loop(self.bb, spec, stop, cond, label)
        values: list[Any] = list(loop.carried_init)
        for k, value in zip(carried, finals, strict=True):
            values[k] = value
        return values, stacked

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
                array = onnx.numpy_helper.to_array(init)
                # Its own dtype: relax.const would make an int64 array int32 (INT64_MAX, x[1:]'s end, became -1).
                self._nodes[init.name] = relax.const(array, str(array.dtype))
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
