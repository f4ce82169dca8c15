"""Where a module keeps what ``calibrate()`` records: statistics per graph node.

Statistics are keyed by node name (see :mod:`forge_core.graph`). They stay
valid while the graph's nodes keep their names and meaning: a batch-size change
keeps them (a node's value range does not depend on how many samples run
together); ``split_tensors`` replaces the convolutions they describe, so it
discards them (``force=True``) or refuses.

Everything here is numpy: memory is bounded by the number of nodes, never by
the number of samples times the size of a tensor. Each sample adds two floats
per node (its extrema) and is folded into a fixed-size histogram of ``|x|``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HISTOGRAM_BINS = 2048


@dataclass
class TensorStatistics:
    """What calibration saw of one node's values over the calibration samples.

    ``minima`` and ``maxima`` hold one entry per sample (the ``"average"``
    method averages them, ``"minmax"`` takes the extremes); ``histogram`` counts
    the non-zero ``|x|`` over ``HISTOGRAM_BINS`` equal bins from 0 to
    ``bin_edges[-1]``, for the ``"entropy"`` and ``"percentile"`` methods
    (exact zeros, half of every ReLU output, are on every grid: counted, they
    would drag the entropy threshold towards 0). When a sample exceeds the
    histogram's range, the range doubles until it fits and the old counts are
    merged pairwise, so no count is lost and the bins stay aligned.
    """

    minima: list[float] = field(default_factory=list)
    maxima: list[float] = field(default_factory=list)
    histogram: np.ndarray | None = None
    bin_edges: np.ndarray | None = None

    def observe(self, values: np.ndarray) -> None:
        """Fold one sample's values of this node into the statistics."""
        values = np.asarray(values)
        if values.size == 0:
            return
        mask = np.isfinite(values)
        finite = values if mask.all() else values[mask]
        if finite.size == 0:
            return
        low, high = float(finite.min()), float(finite.max())
        self.minima.append(low)
        self.maxima.append(high)
        magnitude = np.abs(finite.astype(np.float32, copy=False)).ravel()
        magnitude = magnitude[magnitude != 0]  # zeros are exact on any grid: they must not pull a threshold down
        top = max(abs(low), abs(high))
        if self.histogram is None or self.bin_edges is None:
            edge = top if top > 0 else 1.0
            self.histogram = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
            self.bin_edges = np.linspace(0.0, edge, HISTOGRAM_BINS + 1)
        edge = float(self.bin_edges[-1])
        while top > edge:  # double the range: merge neighbouring bins, keep every count
            merged = self.histogram.reshape(-1, 2).sum(axis=1)
            self.histogram = np.concatenate([merged, np.zeros(HISTOGRAM_BINS // 2, dtype=np.int64)])
            edge *= 2.0
            self.bin_edges = np.linspace(0.0, edge, HISTOGRAM_BINS + 1)
        counts = np.bincount(np.minimum((magnitude * (HISTOGRAM_BINS / edge)).astype(np.int64), HISTOGRAM_BINS - 1),
                             minlength=HISTOGRAM_BINS)
        self.histogram += counts

    def copy(self) -> TensorStatistics:
        return TensorStatistics(list(self.minima), list(self.maxima),
                                None if self.histogram is None else self.histogram.copy(),
                                None if self.bin_edges is None else self.bin_edges.copy())


@dataclass
class WeightStatistics:
    """Per-output-channel extrema of one weight (``axis`` is its output-channel axis)."""

    axis: int
    minima: np.ndarray
    maxima: np.ndarray

    @classmethod
    def of(cls, weight: np.ndarray, axis: int) -> WeightStatistics:
        from forge_core.quantization.ranges import per_channel_rows

        rows = per_channel_rows(np.asarray(weight, dtype=np.float64), axis)
        return cls(axis, rows.min(axis=1), rows.max(axis=1))

    def copy(self) -> WeightStatistics:
        return WeightStatistics(self.axis, self.minima.copy(), self.maxima.copy())


@dataclass
class CalibrationData:
    """Calibration statistics of a module: node name -> :class:`TensorStatistics`, and the sample count.

    ``weights`` maps each quantizable operator's node name to its weight's
    per-channel statistics.
    """

    statistics: dict[str, TensorStatistics] = field(default_factory=dict)
    num_samples: int = 0
    weights: dict[str, WeightStatistics] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.num_samples > 0 or bool(self.statistics)

    def copy(self) -> CalibrationData:
        return CalibrationData({k: v.copy() for k, v in self.statistics.items()}, self.num_samples,
                               {k: v.copy() for k, v in self.weights.items()})

    def renamed(self, old: str, new: str) -> CalibrationData:
        """The same statistics with node ``old`` called ``new``."""
        stats = {new if k == old else k: v for k, v in self.statistics.items()}
        weights = {new if k == old else k: v for k, v in self.weights.items()}
        return CalibrationData(stats, self.num_samples, weights)
