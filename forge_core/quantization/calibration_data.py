"""Where a module keeps what ``calibrate()`` records: statistics per graph node.

Statistics are keyed by node name (see :mod:`forge_core.graph`). They stay
valid while the graph's nodes keep their names and meaning: a batch-size change
keeps them (a node's value range does not depend on how many samples run
together); ``split_tensors`` replaces the convolutions they describe, so it
discards them (``force=True``) or refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TensorStatistics:
    """What calibration saw of one node's values over the calibration samples.

    ``minima`` and ``maxima`` hold one entry per sample (the ``"average"``
    method averages them, ``"minmax"`` takes the extremes); ``histogram`` and
    ``bin_edges`` accumulate the distribution for the ``"entropy"`` and
    ``"percentile"`` methods.
    """

    minima: list[float] = field(default_factory=list)
    maxima: list[float] = field(default_factory=list)
    histogram: np.ndarray | None = None
    bin_edges: np.ndarray | None = None

    def copy(self) -> TensorStatistics:
        return TensorStatistics(list(self.minima), list(self.maxima),
                                None if self.histogram is None else self.histogram.copy(),
                                None if self.bin_edges is None else self.bin_edges.copy())


@dataclass
class CalibrationData:
    """Calibration statistics of a module: node name -> :class:`TensorStatistics`, and the sample count."""

    statistics: dict[str, TensorStatistics] = field(default_factory=dict)
    num_samples: int = 0

    def __bool__(self) -> bool:
        return self.num_samples > 0 or bool(self.statistics)

    def copy(self) -> CalibrationData:
        return CalibrationData({k: v.copy() for k, v in self.statistics.items()}, self.num_samples)

    def renamed(self, old: str, new: str) -> CalibrationData:
        """The same statistics with node ``old`` called ``new``."""
        stats = {new if k == old else k: v for k, v in self.statistics.items()}
        return CalibrationData(stats, self.num_samples)
