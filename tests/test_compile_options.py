"""Compile options pass by keyword through every layer."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from forge_core.compiler.compile import compile_module, compile_to_function
from forge_core.compiler.options import CompileOptions
from forge_core.compiler.pipeline import build, build_pipeline, schedule_stage
from forge_core.tuning.session import tune_module


def test_validate_rejects_positional_options():
    with pytest.raises(TypeError):
        CompileOptions.validate(None, 3, False, None, False, False, False, None, None)  # type: ignore[misc]


def test_validate_takes_keywords_with_defaults():
    options = CompileOptions.validate(opt_level=2, set_channel_layout="last", export_metadata=True,
                                      uuid="123e4567-e89b-12d3-a456-426614174000")
    assert options.opt_level == 2 and options.set_channel_layout == "last" and options.export_metadata
    assert options.output_path == Path("./compile_output") and not options.set_float16
    assert options.uuid == "123e4567-e89b-12d3-a456-426614174000"
    defaults = CompileOptions.validate()
    assert defaults.opt_level == 3 and not defaults.force_overwrite and defaults.uuid
    with pytest.raises(ValueError, match="opt_level"):
        CompileOptions.validate(opt_level=7)


@pytest.mark.parametrize(
    "function, positional",
    [
        (compile_module, ("ir", "target")),
        (compile_to_function, ("ir", "target")),
        (tune_module, ("ir", "target")),
        (build, ("mod", "target", "opt_level")),
        (build_pipeline, ("target", "opt_level")),
        (schedule_stage, ("target", "opt_level")),
    ],
)
def test_internal_functions_take_options_by_keyword(function, positional):
    params = inspect.signature(function).parameters.values()
    assert tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD) == positional
