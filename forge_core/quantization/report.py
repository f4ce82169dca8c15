"""The layer-wise quantization report: each quantized layer's output SQNR against the float model.

Both models run on the same samples with the same nodes watched; signal and
noise energies are summed over samples (streamed, as in calibration), so the
SQNR of a layer is ``10 log10(sum(ref^2) / sum((quantized - ref)^2))``. The
error is the accumulated one, as a deployed model sees it: the layer where
the SQNR falls sharply is where accuracy is lost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from forge_core.errors import OptionError
from forge_core.quantization.observe import compile_watching, pick_target, progress, sample_arrays

if TYPE_CHECKING:
    from forge_core.ir.parts import ModuleParts
    from forge_core.quantization.quantize import QuantizationInfo


@dataclass
class LayerReport:
    """One row of the report."""

    name: str
    kind: str
    sqnr_db: float
    input_scale: float | None


@dataclass
class QuantizationReport:
    """Layer rows in graph order, plus the model outputs' SQNR."""

    layers: list[LayerReport] = field(default_factory=list)
    outputs: dict[str, float] = field(default_factory=dict)
    num_samples: int = 0

    def worst(self, n: int = 5) -> list[LayerReport]:
        """The ``n`` layers with the lowest SQNR."""
        return sorted(self.layers, key=lambda row: row.sqnr_db)[:n]

    def to_dict(self) -> dict[str, Any]:
        return {"num_samples": self.num_samples, "outputs": dict(self.outputs),
                "layers": [vars(row) for row in self.layers]}

    def __str__(self) -> str:
        lines = [f"{'layer':<40} {'kind':<7} {'SQNR dB':>8} {'input scale':>12}"]
        for row in self.layers:
            scale = f"{row.input_scale:.4g}" if row.input_scale is not None else "dynamic"
            lines.append(f"{row.name[:40]:<40} {row.kind:<7} {row.sqnr_db:>8.2f} {scale:>12}")
        for name, value in self.outputs.items():
            lines.append(f"{'output ' + name:<40} {'':<7} {value:>8.2f}")
        lines.append(f"({self.num_samples} samples; SQNR of each layer's output against the float model)")
        return "\n".join(lines)


def sqnr_db(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def quantization_report(ir: ModuleParts, info: QuantizationInfo, calib_data: Iterable[Any], *,
                        use_cuda: bool = True, show_progress: bool = True) -> QuantizationReport:
    """Run the float reference and ``ir`` side by side on ``calib_data`` (a re-iterable collection)."""
    reference = info.reference
    assert reference is not None
    layers = list(info.layers)
    target = pick_target(use_cuda)
    outputs = [spec.name for spec in ir.output_specs]
    energies = {name: [0.0, 0.0] for name in layers + outputs}  # [signal, noise]
    ref_fn = _Runner(reference, layers, target)
    q_fn = _Runner(ir, layers, target)
    count = 0
    total = len(calib_data) if hasattr(calib_data, "__len__") else None  # type: ignore[arg-type]
    with progress("Comparing with float", total, show_progress) as advance:
        for index, sample in enumerate(calib_data):
            for name, ref, got in zip(layers + outputs, ref_fn(index, sample), q_fn(index, sample)):
                ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
                energies[name][0] += float(np.sum(ref64 * ref64))
                energies[name][1] += float(np.sum((got64 - ref64) ** 2))
            count += 1
            advance()
    if count == 0:
        raise OptionError("calib_data held no samples")
    report = QuantizationReport(num_samples=count)
    for name in layers:
        layer = info.layers[name]
        scales = [v["scale"] for v in layer["inputs"].values() if isinstance(v, dict)]
        report.layers.append(LayerReport(name, layer["kind"], sqnr_db(*energies[name]),
                                         float(scales[0]) if scales else None))
    for name in outputs:
        report.outputs[name] = sqnr_db(*energies[name])
    return report


class _Runner:
    """A module compiled once to return the named layers' values, then its outputs', for one sample."""

    def __init__(self, ir: ModuleParts, layers: list[str], target: str) -> None:
        self.function, self.skip = compile_watching(ir, layers, target)
        self.specs = ir.input_specs

    def __call__(self, index: int, sample: Any) -> list[np.ndarray]:
        results = self.function(*sample_arrays(sample, self.specs, index))
        results = results if isinstance(results, list) else [results]
        return results[self.skip:] + results[:self.skip]
