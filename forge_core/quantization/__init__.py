"""Calibration and quantization (numpy-only statistics, so ``ONNXModule`` can share them)."""

from forge_core.quantization.calibration_data import CalibrationData, TensorStatistics

__all__ = ["CalibrationData", "TensorStatistics"]
