"""``IRModule.get_inference_function``: a quick, unoptimized callable for checking numbers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm

from forge_core.compiler.run_checks import portable_run_checks
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


def reference_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    """TVM's CPU build, each fused kernel scheduled by :class:`~forge_core.schedules.reference_order.ReferenceOrder`.

    The kernels compute what TVM's unscheduled ones do, in the same order (no fast-math, no layout change,
    no reduction reordered), in parallel and in vectors: a 512x512 U-Net took 7.9 s unscheduled, 0.41 s so.
    """
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from forge_core.schedules.apply import apply_rules
    from forge_core.schedules.reference_order import ReferenceOrder

    @tvm.transform.module_pass(opt_level=0, name="forge_reference_order")
    def _schedule(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return apply_rules(mod, target, [ReferenceOrder()])

    @tvm.transform.module_pass(opt_level=0, name="forge_inference_build")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(
                cpu.library_dispatch_passes(target) + cpu.legalize_passes(target) + [_schedule]
                + cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))(mod)

    return _pipeline


def prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """What TVM builds for the inference function: external codegens run, quantization expanded to arithmetic,
    layouts TVM's legalization handles, takes bounded (:func:`~forge_core.ir.index_checks.clamped_takes`), names
    every code generator accepts."""
    from forge_core.compiler.c_names import plain_names
    from forge_core.compiler.external import run_external_codegens
    from forge_core.compiler.legal_layouts import legal_layouts
    from forge_core.ir.index_checks import clamped_takes
    from forge_core.quantization.expand import expand_quantize

    return plain_names(clamped_takes(legal_layouts(expand_quantize(run_external_codegens(mod)))))


def build_inference_function(mod: tvm.IRModule | Any, target: tvm.target.Target, inputs: Sequence[TensorSpec],
                             outputs: Sequence[TensorSpec], *, reference_order: bool = True) -> InferenceFunction:
    """An :class:`InferenceFunction` from a Relax module (built here) or an executable built already.

    On a CPU the kernels are scheduled by :func:`reference_pipeline` (``reference_order=False``: TVM's plain
    loops, for comparison), on another device by TVM's default rules.
    """
    device = tvm.runtime.device(target.get_target_device_type(), 0)
    if not device.exist:
        raise ForgeError(
            f"No {target.kind.name} device is present on this machine; use target='llvm' to run on the CPU."
        )
    if isinstance(mod, tvm.IRModule):
        logger.debug("building inference function for %s", target)
        mod = portable_run_checks(prepare(mod))
        if target.kind.name == "llvm" and reference_order:
            mod = tvm.compile(mod, target=target, relax_pipeline=reference_pipeline(target))
        else:
            mod = tvm.compile(mod, target=target)
    return InferenceFunction(mod, device, inputs, outputs)
