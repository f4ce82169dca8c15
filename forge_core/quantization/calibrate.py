"""``IRModule.calibrate``: statistics of every tensor quantization will need, streamed over the samples."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from forge_core.errors import OptionError
from forge_core.quantization.calibration_data import CalibrationData, TensorStatistics, WeightStatistics
from forge_core.quantization.observe import logger, pick_target, sample_arrays, stream
from forge_core.quantization.plan import build_plan

if TYPE_CHECKING:
    from forge_core.ir.parts import ModuleParts


def calibrate(ir: ModuleParts, calib_data: Iterable[Any], *, previous: CalibrationData | None = None,
              use_cuda: bool = True, show_progress: bool = True) -> CalibrationData:
    """Statistics of ``ir``'s quantizable activations over ``calib_data``, added to ``previous`` if given.

    Raises:
        ValueError: ``calib_data`` is not iterable or holds no samples.
        forge.InputError: A sample does not fit the model (names the sample, the
            input, the expected and given shape or dtype).
    """
    if isinstance(calib_data, np.ndarray) or not isinstance(calib_data, Iterable):
        raise OptionError(
            f"calib_data must be an iterable of samples (a list of arrays, a generator...); given "
            f"{type(calib_data).__name__}" + (" — wrap a single array in a list: [array]"
                                             if isinstance(calib_data, np.ndarray) else ""))
    plan = build_plan(ir.mod, ir.params)
    names = plan.activations
    data = previous.copy() if previous is not None else CalibrationData()
    for name in names:
        data.statistics.setdefault(name, TensorStatistics())
    for op in plan.ops:
        if op.weight is not None and op.weight_axis is not None:
            data.weights[op.name] = WeightStatistics.of(plan.constant_value(op.weight, ir.params), op.weight_axis)

    def record(_: int, values: list[np.ndarray]) -> None:
        for name, value in zip(names, values):
            data.statistics[name].observe(value)

    if names:
        count = stream(ir, names, calib_data, record, target=pick_target(use_cuda), show_progress=show_progress)
    else:  # nothing to quantize: the samples are still checked
        count = sum(1 for i, sample in enumerate(calib_data) if sample_arrays(sample, ir.input_specs, i) is not None)
    if count == 0:
        raise OptionError("calib_data held no samples")
    data.num_samples += count
    logger.info("calibrated %d tensors over %d samples", len(names), count)
    return data
