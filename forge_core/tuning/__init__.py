"""Tuning with MetaSchedule, into a database that later compiles reuse without trials."""

from forge_core.tuning.session import TuningReport, tune_module

__all__ = ["TuningReport", "tune_module"]
