"""One default per option: the API signatures, the option validation and the CLI read theirs from forge_core.settings."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
from model_factory import conv_bn_net

import forge
from forge_core.cli.app import build_parser
from forge_core.compiler.options import CompileOptions
from forge_core.settings import (
    COMPILE_DEFAULTS,
    COMPILE_POSITIONAL,
    QUANTIZE_DEFAULTS,
    CompileSettings,
    QuantizeSettings,
    field_names,
    keyword_only_after,
)
from forge_tensorrt.onnx_module import ONNXModule


def _parameters(func) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(func).parameters.items() if name != "self"}


def test_compile_takes_every_option_after_target_by_keyword_with_the_settings_defaults():
    params = _parameters(forge.IRModule.compile)
    assert list(params) == ["target", *field_names(CompileSettings)]
    assert params["target"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for name in field_names(CompileSettings):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == getattr(COMPILE_DEFAULTS, name), name
    # The documented positional order (still accepted, with a warning) is the settings' order.
    assert COMPILE_POSITIONAL == field_names(CompileSettings)[:len(COMPILE_POSITIONAL)]


def test_tune_and_the_option_validation_share_the_compile_defaults():
    tune = _parameters(forge.IRModule.tune)
    validate = _parameters(CompileOptions.validate)
    for name in ("opt_level", "set_float16", "set_channel_layout"):
        assert tune[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert tune[name].default == getattr(COMPILE_DEFAULTS, name) == validate[name].default, name
    for name in ("export_relay", "export_metadata", "force_overwrite", "uuid", "encrypt_password"):
        assert validate[name].default == getattr(COMPILE_DEFAULTS, name), name
    assert [n for n, p in tune.items() if p.kind is not inspect.Parameter.KEYWORD_ONLY] == ["target"]
    options = CompileOptions.validate()
    assert str(options.output_path) == str(COMPILE_DEFAULTS.output_path).removeprefix("./")


def test_ir_quantize_and_onnx_module_quantize_share_their_signature_and_defaults():
    ir_params = _parameters(forge.IRModule.quantize)
    onnx_params = _parameters(ONNXModule.quantize)
    assert [(p.name, p.kind, p.default) for p in ir_params.values()] == \
        [(p.name, p.kind, p.default) for p in onnx_params.values()]
    assert list(ir_params) == list(field_names(QuantizeSettings))
    for field in dataclasses.fields(QuantizeSettings):
        assert ir_params[field.name].default == getattr(QUANTIZE_DEFAULTS, field.name), field.name
    assert QUANTIZE_DEFAULTS.per_channel is False  # the documented default


def _subcommand_defaults(command: str, *required: str) -> dict:
    return vars(build_parser().parse_args([command, "model.onnx", *required]))


def test_the_cli_flags_take_the_settings_defaults():
    compile_args = _subcommand_defaults("compile")
    assert compile_args["output"] == COMPILE_DEFAULTS.output_path
    assert compile_args["host"] == COMPILE_DEFAULTS.host
    assert compile_args["opt_level"] == COMPILE_DEFAULTS.opt_level
    assert compile_args["float16"] is COMPILE_DEFAULTS.set_float16
    assert compile_args["channel_layout"] == COMPILE_DEFAULTS.set_channel_layout
    assert compile_args["export_relay"] is COMPILE_DEFAULTS.export_relay
    assert compile_args["export_metadata"] is COMPILE_DEFAULTS.export_metadata
    assert compile_args["force"] is COMPILE_DEFAULTS.force_overwrite
    assert compile_args["uuid"] == COMPILE_DEFAULTS.uuid
    tune_args = _subcommand_defaults("tune")
    assert (tune_args["opt_level"], tune_args["float16"], tune_args["channel_layout"]) == \
        (COMPILE_DEFAULTS.opt_level, COMPILE_DEFAULTS.set_float16, COMPILE_DEFAULTS.set_channel_layout)
    quant_args = _subcommand_defaults("quantize", "-o", "out")
    assert quant_args["method"] == QUANTIZE_DEFAULTS.calib_method
    assert quant_args["percentile"] == QUANTIZE_DEFAULTS.percentile
    assert quant_args["per_channel"] is QUANTIZE_DEFAULTS.per_channel
    assert quant_args["activation_dtype"] == QUANTIZE_DEFAULTS.activation_dtype
    assert quant_args["kernel_dtype"] == QUANTIZE_DEFAULTS.kernel_dtype
    assert quant_args["quant_type"] == QUANTIZE_DEFAULTS.quant_type
    assert quant_args["opt_level"] == COMPILE_DEFAULTS.opt_level


def test_options_passed_by_position_still_compile_with_a_deprecation_warning(tmp_path):
    ir = forge.from_onnx(conv_bn_net())
    with pytest.warns(DeprecationWarning,
                      match=r"Passing host, output_path, opt_level to IRModule.compile\(\) by position is deprecated"
                            r".*compile\(target, host=\.\.\., output_path=\.\.\., opt_level=\.\.\.\)"):
        ir.compile("llvm", None, tmp_path / "positional", 0)
    assert (tmp_path / "positional" / "model_library.so").is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # by keyword: no warning
        ir.compile("llvm", output_path=tmp_path / "keywords", opt_level=0)
    assert (tmp_path / "keywords" / "model_library.so").is_file()


def test_the_positional_shim_refuses_what_python_would():
    @keyword_only_after("a", "b")
    def f(x, *, a=1, b=2):
        return x, a, b

    assert f(0, a=5) == (0, 5, 2)
    with pytest.warns(DeprecationWarning, match=r"Passing a, b to .*f\(\) by position"):
        assert f(0, 3, 4) == (0, 3, 4)
    with pytest.raises(TypeError, match="takes at most 3 positional arguments"):
        f(0, 1, 2, 3)
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        f(0, 1, a=1)
    assert list(inspect.signature(f).parameters) == ["x", "a", "b"]
