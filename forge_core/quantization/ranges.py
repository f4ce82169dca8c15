"""From calibration statistics to quantization parameters (numpy only).

The five methods of ``quantize(calib_method=...)`` each turn a node's
statistics into a range ``[low, high]``:

* ``"average"``: the mean over samples of each sample's minimum and maximum;
* ``"minmax"``: the smallest minimum and the largest maximum seen;
* ``"entropy"``: the threshold ``T`` on ``|x|`` whose quantized distribution is
  closest, in KL divergence, to the observed one (TensorRT's search over the
  histogram), the range being the observed one clipped to ``[-T, T]``;
* ``"percentile"``: ``T`` is the given percentile of ``|x|`` (99 by default,
  as the docs say), clipped the same way;
* ``"mse"`` (Forge's addition to the documented four): ``T`` minimizing the
  expected squared error of the 8-bit quantized values over the histogram,
  rounding inside the range and clipping beyond it (the ``"mse"`` calibrator
  of NVIDIA's pytorch-quantization, on Forge's grid).

The KL search of ``"entropy"`` compares distribution shapes, not values: a
peak narrower than a quantization step (an image's flat background gives
one activation value many times over) is smeared in its quantized candidate
and costs more than clipping the whole tail past it. On a MobileNetV2 trained
on scikit-learn's digits it clipped a ReLU6 output from 6 to 1.03, and the
model's output SQNR fell to 4.6 dB (28.4 with ``"minmax"``, 28.7 with
``"mse"``; benchmarks/quantization_accuracy.py).

Activations are quantized asymmetrically (the zero point places 0 exactly on
the grid, so ReLU outputs use all 256 levels); weights symmetrically (zero
point 0 for int8, 128 for uint8), per tensor or per output channel; biases to
int32 with scale = input scale x weight scale and zero point 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forge_core.errors import ModelStateError, OptionError
from forge_core.quantization.calibration_data import TensorStatistics
from forge_core.settings import ACTIVATION_DTYPES, CALIB_METHODS, QUANT_TYPES  # noqa: F401 (re-exported)

ACTIVATION_STEPS = 255  # an 8-bit activation's range holds 255 steps (int8 and uint8 alike)
QUANT_DTYPES = ACTIVATION_DTYPES
BIAS_DTYPES = ("int8", "uint8", "int32")

_LIMITS = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}


def per_channel_rows(values: np.ndarray, axis: int) -> np.ndarray:
    """``values`` as one row per index of ``axis`` (a weight's output channels)."""
    return np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)


def dtype_limits(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype."""
    return _LIMITS[dtype]


@dataclass(frozen=True)
class QuantParams:
    """Scale(s) and zero point(s) of one tensor; arrays for per-channel (``axis`` set), scalars otherwise."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"scale": np.asarray(self.scale).tolist(), "zero_point": np.asarray(self.zero_point).tolist(),
                "dtype": self.dtype, "axis": self.axis}


def _entropy_threshold(histogram: np.ndarray, edges: np.ndarray, levels: int) -> float:
    """TensorRT's KL-divergence threshold search over a histogram of ``|x|``.

    For each candidate threshold (bin ``i``), ``p`` is the histogram up to
    ``i`` with every count beyond clipped into its last bin, and ``q`` the
    unclipped bins merged into ``levels`` groups and spread back over their
    non-empty bins; the threshold minimizing ``KL(p || q)`` wins, balancing
    clipping error against rounding error.
    """
    counts = histogram.astype(np.float64)
    used = int(np.nonzero(counts)[0].max()) + 1 if counts.any() else 0
    if used <= levels:
        return float(edges[max(used, 1)])
    best_threshold, best_divergence = float(edges[used]), np.inf
    tail = np.cumsum(counts[::-1])[::-1]  # tail[i] = counts[i:].sum()
    for i in range(levels, used + 1):
        sliced = counts[:i]
        reference = sliced.copy()
        if i < len(counts):
            reference[i - 1] += tail[i]  # outliers clipped into the last bin
        group = (np.arange(i) * levels) // i
        nonzero = sliced > 0
        totals = np.bincount(group, weights=sliced, minlength=levels)
        members = np.bincount(group, weights=nonzero, minlength=levels)
        expanded = np.where(nonzero, totals[group] / np.maximum(members[group], 1), 0.0)
        if expanded.sum() == 0:
            continue
        p, q = reference / reference.sum(), expanded / expanded.sum()
        mask = p > 0
        if (q[mask] == 0).any():  # outliers clipped into an empty bin: infinite divergence
            continue
        divergence = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if divergence < best_divergence:
            best_divergence, best_threshold = divergence, float(edges[i])
    return best_threshold


def _mse_threshold(histogram: np.ndarray, edges: np.ndarray, low: float, high: float, symmetric: bool) -> float:
    """The threshold ``T`` on ``|x|`` whose 8-bit grid gives the least expected squared error.

    Candidate ``T`` are the histogram's bin edges. A value with ``|x| <= T``
    rounds to the grid, an error of ``step**2 / 12`` on average; one beyond is
    clipped to ``T``, an error of ``(|x| - T)**2`` (``|x|`` at its bin's
    centre). ``step`` is the clipped range over the grid's steps:
    ``(min(high, T) - max(low, -T)) / 255`` for Forge's asymmetric grid, ``2T /
    254`` for a symmetric one (zero point 0, levels -127..127). Exact zeros
    are not in the histogram: 0 is on every grid. Ties go to the larger ``T``.
    """
    counts = histogram.astype(np.float64)
    if not counts.any():
        return float(edges[-1])
    used = int(np.nonzero(counts)[0].max()) + 1
    counts = counts[:used]
    centres = (edges[:used] + edges[1:used + 1]) / 2.0
    thresholds = np.asarray(edges[1:used + 1], dtype=np.float64)  # candidate i keeps bins [0, i]

    def beyond(values: np.ndarray) -> np.ndarray:  # sum over the bins after each candidate's last kept bin
        return np.concatenate([np.cumsum(values[::-1])[::-1][1:], [0.0]])

    count_out, first_out, second_out = beyond(counts), beyond(counts * centres), beyond(counts * centres ** 2)
    clipping = np.maximum(second_out - 2.0 * thresholds * first_out + thresholds ** 2 * count_out, 0.0)
    if symmetric:
        step = 2.0 * thresholds / (ACTIVATION_STEPS - 1)
    else:
        step = (np.minimum(high, thresholds) - np.maximum(low, -thresholds)) / ACTIVATION_STEPS
    error = np.cumsum(counts) * step ** 2 / 12.0 + clipping
    best = len(error) - 1 - int(np.argmin(error[::-1]))
    return float(thresholds[best])


def _percentile_threshold(histogram: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    cumulative = np.cumsum(histogram.astype(np.float64))
    if cumulative[-1] == 0:
        return float(edges[-1])
    index = int(np.searchsorted(cumulative, cumulative[-1] * percentile / 100.0))
    return float(edges[min(index + 1, len(edges) - 1)])


def activation_range(stats: TensorStatistics, method: str, percentile: float = 99.0,
                     symmetric: bool = False) -> tuple[float, float]:
    """The range ``[low, high]`` (always holding 0) that ``method`` derives from ``stats``.

    ``symmetric``: the range goes to a symmetric grid (zero point 0, the
    TensorRT plugin's), which ``"mse"`` weighs its rounding error on.
    """
    if not stats.minima:
        raise ModelStateError("no calibration samples were recorded for this node")
    if method == "minmax":
        low, high = min(stats.minima), max(stats.maxima)
    elif method == "average":
        low, high = float(np.mean(stats.minima)), float(np.mean(stats.maxima))
    elif method in ("entropy", "percentile", "mse"):
        assert stats.histogram is not None and stats.bin_edges is not None
        low, high = min(stats.minima), max(stats.maxima)
        if method == "entropy":
            threshold = _entropy_threshold(stats.histogram, stats.bin_edges, 256 if low >= 0 else 128)
        elif method == "mse":
            threshold = _mse_threshold(stats.histogram, stats.bin_edges, low, high, symmetric)
        else:
            threshold = _percentile_threshold(stats.histogram, stats.bin_edges, percentile)
        low, high = max(low, -threshold), min(high, threshold)
    else:
        raise OptionError(f"calib_method must be one of {', '.join(map(repr, CALIB_METHODS))}; given {method!r}")
    return min(low, 0.0), max(high, 0.0)


def activation_params(low: float, high: float, dtype: str) -> QuantParams:
    """Asymmetric parameters mapping ``[low, high]`` (holding 0) onto ``dtype``'s full range."""
    qmin, qmax = dtype_limits(dtype)
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / (qmax - qmin)
    if not np.isfinite(scale) or scale <= 0:
        scale = 1.0
    zero_point = int(np.clip(np.round(qmin - low / scale), qmin, qmax))
    return QuantParams(np.float32(scale), np.asarray(zero_point, dtype=dtype), dtype)


def weight_params(weight: np.ndarray, dtype: str, axis: int | None) -> QuantParams:
    """Symmetric parameters for a weight, per output channel when ``axis`` is given."""
    magnitude = np.abs(np.asarray(weight, dtype=np.float64))
    if axis is None:
        absmax = np.asarray(magnitude.max() if magnitude.size else 0.0)
    else:
        absmax = per_channel_rows(magnitude, axis).max(axis=1)
    scale = (absmax / 127.0).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    zero = 0 if dtype == "int8" else 128
    return QuantParams(scale, np.full(scale.shape, zero, dtype=dtype), dtype, axis)


def quantize_array(values: np.ndarray, params: QuantParams) -> np.ndarray:
    """``values`` on the integer grid of ``params`` (round half to even, saturating)."""
    qmin, qmax = dtype_limits(params.dtype)
    scale, zero_point = np.asarray(params.scale, np.float64), np.asarray(params.zero_point, np.float64)
    if params.axis is not None:
        shape = [1] * values.ndim
        shape[params.axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    return np.clip(np.round(values / scale) + zero_point, qmin, qmax).astype(params.dtype)
