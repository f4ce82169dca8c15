"""TFLite resource variables (a streaming model's state) as explicit inputs and outputs.

A streaming TFLite model (a wake-word detector, a voice-activity model
converted with resource variables) keeps state between invocations:
``CALL_ONCE`` runs an init subgraph that assigns each variable its first value,
and each invocation reads the variables (``READ_VARIABLE``), computes, and
assigns their next values (``ASSIGN_VARIABLE``). TVM's importer converts the
init subgraph and the reads of its values, not assignments (a compiled
function keeps no state).

Forge makes the state explicit, as an ONNX export of a recurrent model has it:
each variable that an invocation reads before it assigns it becomes one more
input of the model, named after the variable (its ``shared_name``), and the
value last assigned to it becomes one more output, named ``<variable>_next``.
Feeding each ``_next`` output back as the next call's input runs the model as
the TFLite interpreter does; the first call takes the values the model's
``CALL_ONCE`` assigns (:attr:`forge.IRModule.initial_state`). Values move
as they are stored: a quantized variable is its int8 (or uint8) integers, as
the interpreter copies them.

A variable read after the invocation assigned it gets that assigned value; one
that is read and never assigned stays the constant its init gave it; one that
is assigned and never read before is not state (nothing reads the value it
carries to the next call).

:func:`explicit_state` gives TVM's importer a view of the flatbuffer whose first
subgraph has these inputs and outputs; the operator converter
(:class:`forge_tf.tflite_import.ForgeOperatorConverter`) reads the state inputs
where the reads were and records assignments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tflite.Model import Model
from tflite.SubGraph import SubGraph

from forge_core.errors import ModelImportError
from forge_core.ir.state import NEXT_SUFFIX

RESOURCE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})
"""Operators that handle resource variables; they move values and compute nothing."""


@dataclass(frozen=True)
class StateVariable:
    """One resource variable an invocation reads, then assigns."""

    name: str
    """The variable's ``shared_name`` (else its handle tensor's name): the state input's name."""
    input_tensor: int
    """The tensor of its first read in the first subgraph: the state input."""
    output_tensor: int
    """The tensor last assigned to it: the state output."""
    reads: tuple[int, ...]
    """Every tensor the invocation reads from it before it assigns it (all are the state input)."""
    initial: np.ndarray | None
    """The value ``CALL_ONCE`` assigns it, as stored; None when no init assigns it."""

    @property
    def output_name(self) -> str:
        return self.name + NEXT_SUFFIX


@dataclass
class _Walk:
    handles: dict[int, str] = field(default_factory=dict)  # handle tensor -> variable name
    assigned: dict[str, int] = field(default_factory=dict)  # variable -> tensor last assigned
    reads_before: dict[str, list[int]] = field(default_factory=dict)  # variable -> tensors read before assigned


def _codes(model: Any, subgraph: Any) -> list[str]:
    from forge_tf.operator_support import operator_code

    return [operator_code(model, subgraph.Operators(i)) for i in range(subgraph.OperatorsLength())]


def _variable_name(op: Any, subgraph: Any, handle: int) -> str:
    from tflite.VarHandleOptions import VarHandleOptions

    from forge_tf.tflite_model import tensor_name

    table = op.BuiltinOptions()
    if table is not None:
        options = VarHandleOptions()
        options.Init(table.Bytes, table.Pos)
        container = (options.Container() or b"").decode("utf-8", "replace")
        shared = (options.SharedName() or b"").decode("utf-8", "replace")
        if container or shared:
            return f"{container}/{shared}" if container else shared
    return tensor_name(subgraph, handle)


def _walk(model: Any, subgraph: Any) -> _Walk:
    walk = _Walk()
    for index, code in enumerate(_codes(model, subgraph)):
        if code not in RESOURCE_OPS:
            continue
        op = subgraph.Operators(index)
        inputs = [int(i) for i in op.InputsAsNumpy()] if op.InputsLength() else []
        outputs = [int(i) for i in op.OutputsAsNumpy()] if op.OutputsLength() else []
        if code == "VAR_HANDLE" and outputs:
            walk.handles[outputs[0]] = _variable_name(op, subgraph, outputs[0])
        elif code == "READ_VARIABLE" and inputs and outputs and inputs[0] in walk.handles:
            name = walk.handles[inputs[0]]
            if name not in walk.assigned:
                walk.reads_before.setdefault(name, []).append(outputs[0])
        elif code == "ASSIGN_VARIABLE" and len(inputs) == 2 and inputs[0] in walk.handles:
            walk.assigned[walk.handles[inputs[0]]] = inputs[1]
    return walk


def _initial_values(model: Any, main: Any) -> dict[str, np.ndarray]:
    """The constants each ``CALL_ONCE`` init subgraph of ``main`` assigns, by variable."""
    from tflite.CallOnceOptions import CallOnceOptions

    from forge_tf.tflite_model import stored_array

    values: dict[str, np.ndarray] = {}
    for index, code in enumerate(_codes(model, main)):
        if code != "CALL_ONCE":
            continue
        table = main.Operators(index).BuiltinOptions()
        if table is None:
            continue
        options = CallOnceOptions()
        options.Init(table.Bytes, table.Pos)
        init_index = int(options.InitSubgraphIndex())
        if not 0 <= init_index < model.SubgraphsLength():
            continue  # the validator and TVM's converter name a CALL_ONCE whose subgraph is missing
        init = model.Subgraphs(init_index)
        walk = _walk(model, init)
        for name, tensor in walk.assigned.items():
            value = stored_array(model, init, tensor)
            if value is not None:
                values[name] = value
    return values


def find_state(model: Any) -> list[StateVariable]:
    """The state variables of the first subgraph, in the order the invocation first reads them."""
    main = model.Subgraphs(0)
    walk = _walk(model, main)
    initial = _initial_values(model, main) if walk.reads_before else {}
    state = []
    for name, reads in walk.reads_before.items():
        if name in walk.assigned:
            state.append(StateVariable(name, reads[0], walk.assigned[name], tuple(reads), initial.get(name)))
    return state


class _StatefulSubGraph(SubGraph):
    """The first subgraph, with the state inputs and outputs after its own."""

    def __init__(self, base: Any, state: list[StateVariable]) -> None:
        super().__init__()
        self._tab = base._tab
        own_inputs = [int(i) for i in base.InputsAsNumpy()] if base.InputsLength() else []
        own_outputs = [int(i) for i in base.OutputsAsNumpy()] if base.OutputsLength() else []
        self._inputs = np.asarray(own_inputs + [v.input_tensor for v in state], dtype=np.int32)
        self._outputs = np.asarray(own_outputs + [v.output_tensor for v in state], dtype=np.int32)
        self.state_reads = {read: v.input_tensor for v in state for read in v.reads}
        """Each tensor read from a state variable before it is assigned -> the state input it is."""

    def Inputs(self, j: int) -> int:  # noqa: N802 - the flatbuffer API's names
        return int(self._inputs[j])

    def InputsAsNumpy(self) -> np.ndarray:  # noqa: N802
        return self._inputs

    def InputsLength(self) -> int:  # noqa: N802
        return len(self._inputs)

    def InputsIsNone(self) -> bool:  # noqa: N802
        return False

    def Outputs(self, j: int) -> int:  # noqa: N802
        return int(self._outputs[j])

    def OutputsAsNumpy(self) -> np.ndarray:  # noqa: N802
        return self._outputs

    def OutputsLength(self) -> int:  # noqa: N802
        return len(self._outputs)

    def OutputsIsNone(self) -> bool:  # noqa: N802
        return False


class _StatefulModel(Model):
    """The model, its first subgraph seen with explicit state (a ``tflite.Model``, as TVM's importer asks)."""

    def __init__(self, base: Any, main: _StatefulSubGraph) -> None:
        super().__init__()
        self._tab = base._tab
        self._main = main

    def Subgraphs(self, j: int) -> Any:  # noqa: N802
        return self._main if j == 0 else super().Subgraphs(j)


def explicit_state(model: Any) -> tuple[Any, tuple[StateVariable, ...]]:
    """``model`` seen with its state variables as inputs and outputs, and those variables (none: ``model``).

    Raises:
        forge.ModelImportError: A state variable's name is already an input's.
    """
    state = find_state(model)
    if not state:
        return model, ()
    from forge_tf.tflite_model import tensor_name

    main = model.Subgraphs(0)
    taken = {tensor_name(main, int(i)) for i in main.InputsAsNumpy()} if main.InputsLength() else set()
    taken |= {tensor_name(main, int(i)) for i in main.OutputsAsNumpy()} if main.OutputsLength() else set()
    for variable in state:
        for name in (variable.name, variable.output_name):
            if name in taken:
                raise ModelImportError(
                    f"from_tflite: resource variable {variable.name!r} would become the input {variable.name!r} "
                    f"and the output {variable.output_name!r}, and the model already has a tensor {name!r} among "
                    "its inputs and outputs"
                )
    return _StatefulModel(model, _StatefulSubGraph(main, state)), tuple(state)
