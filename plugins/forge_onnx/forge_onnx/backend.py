"""Forge as an ``onnx.backend.base.Backend``: import, compile and run, as ONNX users expect.

    import forge_onnx.backend as backend
    rep = backend.prepare(model)          # forge.from_onnx + compile (in memory) for this CPU
    outputs = rep.run([x])                # a tuple of numpy arrays, one per graph output
    outputs = backend.run_model(model, [x])
    outputs = backend.run_node(node, [x]) # one node, as a one-node model

``prepare`` takes the keyword options ``opt_level`` (default 3),
``set_float16`` and ``set_channel_layout`` of ``compile()``. Devices: "CPU".

Graph inputs that feed only operands TVM needs as constants (a Reshape's
shape, a ReduceSum's axes, a Pad's pads, a TopK's k...) are bound to their
values when ``run`` first sees them: the model is compiled once per distinct
value of those inputs, and the compiled versions are cached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from forge_core.compiler.compile import compile_to_function
from forge_onnx.loader import load_onnx
from forge_onnx.static_inputs import value_inputs

_COMPILE_OPTIONS = ("opt_level", "set_float16", "set_channel_layout")


def _graph_inputs(model: onnx.ModelProto) -> list[str]:
    initializers = {init.name for init in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in initializers]


def _bind(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs ``values`` are initializers."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    kept = [vi for vi in bound.graph.input if vi.name not in values]
    del bound.graph.input[:]
    bound.graph.input.extend(kept)
    bound.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return bound


class ForgeRep(BackendRep):
    """A model prepared by Forge: ``run(inputs)`` returns the outputs as a named tuple."""

    def __init__(self, model: onnx.ModelProto, options: Mapping[str, Any]) -> None:
        self._model = model
        self._options = dict(options)
        self.input_names = _graph_inputs(model)
        self.output_names = [vi.name for vi in model.graph.output]
        self._value_inputs = value_inputs(model)
        self._compiled: dict[bytes, Any] = {}
        if not self._value_inputs:
            self._compiled[b""] = self._compile(model)

    def _compile(self, model: onnx.ModelProto) -> Any:
        return compile_to_function(load_onnx(model), "llvm", **self._options)

    def _function_for(self, arrays: Sequence[np.ndarray]) -> tuple[Any, list[np.ndarray]]:
        if not self._value_inputs:
            return self._compiled[b""], list(arrays)
        values = {name: np.asarray(a) for name, a in zip(self.input_names, arrays) if name in self._value_inputs}
        key = b"|".join(name.encode() + b"=" + v.dtype.str.encode() + str(v.shape).encode() + v.tobytes()
                        for name, v in sorted(values.items()))
        if key not in self._compiled:
            self._compiled[key] = self._compile(_bind(self._model, values))
        rest = [a for name, a in zip(self.input_names, arrays) if name not in self._value_inputs]
        return self._compiled[key], rest

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = input_arrays(inputs, self.input_names)
        function, rest = self._function_for(arrays)
        result = function(*rest)
        return named_outputs(result, self.output_names)


def input_arrays(inputs: Any, names: Sequence[str]) -> list[np.ndarray]:
    """A backend run's inputs (a mapping by name, one array, or a sequence) as a list in ``names`` order."""
    if isinstance(inputs, Mapping):
        return [inputs[name] for name in names]
    if isinstance(inputs, np.ndarray):
        return [inputs]
    return list(inputs)


def named_outputs(result: Any, names: Sequence[str]) -> tuple[np.ndarray, ...]:
    """An inference function's result as the backend API's named tuple (non-identifier names as ``output_<i>``)."""
    outputs = result if isinstance(result, list) else [result]
    fields = [name if name.isidentifier() else f"output_{i}" for i, name in enumerate(names)]
    return namedtupledict("Outputs", fields)(*outputs)


class ForgeBackend(Backend):
    """Forge's ONNX backend (CPU)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> ForgeRep:
        super().prepare(model, device, **kwargs)
        options = {k: kwargs[k] for k in _COMPILE_OPTIONS if k in kwargs}
        return ForgeRep(model, options)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        arrays = [np.asarray(x) for x in inputs]
        graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for name, a in zip(node.input, arrays)]
        if outputs_info is None:
            graph_outputs = [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
                             for name in node.output]
        else:
            graph_outputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                           shape)
                             for name, (dtype, shape) in zip(node.output, outputs_info)]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)], ir_version=10)
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


is_compatible = ForgeBackend.is_compatible
prepare = ForgeBackend.prepare
run_model = ForgeBackend.run_model
run_node = ForgeBackend.run_node
supports_device = ForgeBackend.supports_device
