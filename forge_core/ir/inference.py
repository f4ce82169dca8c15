"""``IRModule.get_inference_function``: a quick, unoptimized callable for checking numbers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm

from forge_core.errors import ForgeError
from forge_core.runtime.outputs import outputs_to_numpy, to_device
from forge_core.runtime.signature import TensorSpec, check_inputs, explained_run_errors
from forge_core.runtime.vm_threads import VMSessions

logger = logging.getLogger("forge.inference")


class InferenceFunction:
    """Calls a compiled Relax module with numpy arrays.

    ``fn(x0, x1, ...)`` returns one array for a single-output model, else a list.
    It may be called from several threads, as :class:`forge_core.runtime.Runtime` may
    (:mod:`forge_core.runtime.vm_threads`).
    """

    def __init__(self, executable: Any, device: tvm.runtime.Device, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec]) -> None:
        self._sessions = VMSessions(executable, device)
        self._device = device
        self.input_specs = tuple(inputs)
        self.output_specs = tuple(outputs)

    def __call__(self, *arrays: Any) -> np.ndarray | list[np.ndarray]:
        checked = check_inputs(self.input_specs, arrays)
        args = [to_device(a, self._device) for a in checked]
        with explained_run_errors(self.input_specs, checked):
            results = self._sessions.call("main", *args, convert=outputs_to_numpy)
        return results[0] if len(self.output_specs) == 1 and len(results) == 1 else results

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self.input_specs)
        return f"<InferenceFunction ({ins}) on {self._device}>"


def build_inference_function(mod: tvm.IRModule | Any, target: tvm.target.Target, inputs: Sequence[TensorSpec],
                             outputs: Sequence[TensorSpec]) -> InferenceFunction:
    """An :class:`InferenceFunction` from a Relax module (built plainly here) or an executable built already."""
    device = tvm.runtime.device(target.get_target_device_type(), 0)
    if not device.exist:
        raise ForgeError(
            f"No {target.kind.name} device is present on this machine; use target='llvm' to run on the CPU."
        )
    if isinstance(mod, tvm.IRModule):
        from forge_core.compiler.c_names import plain_names
        from forge_core.compiler.external import run_external_codegens
        from forge_core.compiler.legal_layouts import legal_layouts
        from forge_core.quantization.expand import expand_quantize

        logger.debug("building inference function for %s", target)
        mod = tvm.compile(plain_names(legal_layouts(expand_quantize(run_external_codegens(mod)))),
                          target=target)
    return InferenceFunction(mod, device, inputs, outputs)
