"""The suite through the path a user's model takes: ``forge.from_onnx(model).get_inference_function()``.

:mod:`forge_onnx.backend` binds the inputs that only feed operands TVM needs as
constants (a Reshape's shape, a Pad's pads...) to their values at run time, and
compiles once per value. A user's exported model gets no such help: its graph
inputs stay inputs. This backend measures that path, so that the conformance
output shows both rates and the cases where they differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import BackendRep

from forge_core.errors import OptionError
from forge_onnx.backend import ForgeBackend, input_arrays, named_outputs

NAME = "forge-public"


class PublicPathRep(BackendRep):
    """``forge.from_onnx(model).get_inference_function()``, called with every graph input."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from forge_core.loaders import from_onnx  # what forge.from_onnx is (plugins never import the facade)

        initializers = {init.name for init in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in initializers]
        self.output_names = [vi.name for vi in model.graph.output]
        self._function = from_onnx(model).get_inference_function()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = input_arrays(inputs, self.input_names)
        result = self._function(*arrays)
        return named_outputs(result, self.output_names)


class PublicPathBackend(ForgeBackend):
    """Forge through its public import path only: no value inputs bound, no compile options."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PublicPathRep:
        if not cls.supports_device(device):
            raise OptionError(f"{NAME} runs on CPU only, not {device!r}")
        return PublicPathRep(model)
