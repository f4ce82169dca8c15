"""compile(): artifacts for the host, every option alone and combined, metadata, atomic output."""

from __future__ import annotations

import json
import os
import stat
import uuid as uuid_lib

import jsonschema
import numpy as np
import onnx
import pytest
from artifacts import run_in_fresh_process
from model_factory import LIGHT_MODELS, conv_bn_net, light_input, light_model_path, light_reference, two_io_net

import forge
from forge_core.runtime import metadata as schema

X = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def conv_ir():
    return forge.from_onnx(conv_bn_net(seed=4))


@pytest.fixture(scope="module")
def conv_expected(conv_ir):
    return conv_ir.get_inference_function()(X)


def compile_and_run(ir, tmp_path, inputs, **options):
    out = tmp_path / "artifact"
    ir.compile(output_path=out, **options)
    return forge.Runtime(out).infer(*inputs), out


def test_all_nine_light_models_are_found():
    assert len(LIGHT_MODELS) == 9, LIGHT_MODELS


# Three of the nine, of different operator mixes (residual bottlenecks; channel shuffle and grouped convolutions;
# fire modules' concatenations). The conformance test compiles all nine (without verification) against the same
# references; verification made DenseNet-121 alone take 343 s here, the suite's longest test but one.
VERIFIED_LIGHT_MODELS = ["resnet50", "shufflenet", "squeezenet"]


def test_the_verified_light_models_are_among_them():
    assert set(VERIFIED_LIGHT_MODELS) <= set(LIGHT_MODELS)


@pytest.mark.parametrize("name", VERIFIED_LIGHT_MODELS)
def test_light_model_compiles_and_runs_in_a_fresh_process(name, tmp_path):
    """Model-zoo "light" graphs the onnx wheel ships, compiled in verification mode and run in a fresh process,
    against their stored references (rtol 1e-3, atol 1e-5, as onnx's backend runner checks them)."""
    path = light_model_path(name)
    ir = forge.from_onnx(path)
    out = tmp_path / name
    ir.compile(output_path=out)
    assert sorted(os.listdir(out)) == ["model_library.so"]
    x = light_input(onnx.load(str(path)))
    (output,), report = run_in_fresh_process(out, [x], tmp_path)
    np.testing.assert_allclose(output, light_reference(name), rtol=1e-3, atol=1e-5)
    assert report["frameworks"] == []  # the runtime needs no frontend


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
def test_every_opt_level_keeps_the_numbers(conv_ir, conv_expected, tmp_path, opt_level):
    (y,), _ = compile_and_run(conv_ir, tmp_path, [X], opt_level=opt_level)
    # opt_level 4 uses fast-math approximations
    tolerance = 1e-4 if opt_level == 4 else 1e-5
    np.testing.assert_allclose(y, conv_expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("bad", [-1, 5, "3", 3.0, True, None])
def test_opt_level_is_validated(conv_ir, tmp_path, bad):
    with pytest.raises(ValueError, match="opt_level must be an integer from 0 to 4"):
        conv_ir.compile(output_path=tmp_path / "a", opt_level=bad)
    assert not (tmp_path / "a").exists()


def test_float16_stays_within_tolerance_of_float32(conv_ir, conv_expected, tmp_path):
    (y,), out = compile_and_run(conv_ir, tmp_path, [X], set_float16=True, export_relay=True)
    # fp16 storage, fp32 accumulation: 1e-2 relative to the output's scale
    scale = float(np.abs(conv_expected).max())
    np.testing.assert_allclose(y, conv_expected, rtol=1e-2, atol=1e-2 * scale)
    assert y.dtype == np.float32
    runtime = forge.Runtime(out)
    assert runtime.input_dtypes == ["float32"] and runtime.output_dtypes == ["float32"]
    assert runtime.get_metadata()["precision"] == "float16"
    assert "float16" in (out / "model_relay.txt").read_text()


@pytest.mark.parametrize("layout, data_layout", [("first", "NCHW"), ("last", "NHWC")])
def test_channel_layouts_keep_the_numbers(conv_ir, conv_expected, tmp_path, layout, data_layout):
    (y,), out = compile_and_run(conv_ir, tmp_path, [X], set_channel_layout=layout, export_relay=True)
    np.testing.assert_allclose(y, conv_expected, rtol=1e-5, atol=1e-5)
    ir_text = (out / "model_relay.txt").read_text()
    assert f'data_layout="{data_layout}"' in ir_text
    assert 'data_layout="NCHW"' not in ir_text or layout == "first"
    assert forge.Runtime(out).get_metadata()["channel_layout"] == layout


def test_channel_layout_is_validated(conv_ir, tmp_path):
    with pytest.raises(ValueError, match="set_channel_layout must be 'first', 'last' or None, given 'middle'"):
        conv_ir.compile(output_path=tmp_path / "a", set_channel_layout="middle")


def test_options_combined(tmp_path):
    ir = forge.from_onnx(conv_bn_net(seed=9))
    expected = ir.get_inference_function()(X)
    chosen = "123e4567-e89b-12d3-a456-426614174000"
    (y,), out = compile_and_run(ir, tmp_path, [X], set_float16=True, set_channel_layout="last", opt_level=4,
                                export_relay=True, export_metadata=True, uuid=chosen)
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(y, expected, rtol=1e-2, atol=1e-2 * scale)
    assert sorted(os.listdir(out)) == ["model_library.so", "model_metadata.json", "model_relay.txt"]
    meta = json.loads((out / "model_metadata.json").read_text())
    assert (meta["uuid"], meta["precision"], meta["channel_layout"], meta["opt_level"]) == (
        chosen, "float16", "last", 4)


def test_two_inputs_two_outputs_through_an_artifact(tmp_path):
    ir = forge.from_onnx(two_io_net(seed=3))
    a = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    ids = np.array([1, 2, 3, 19], np.int64)
    expected = ir.get_inference_function()(a, ids)
    ys, out = compile_and_run(ir, tmp_path, [a, ids])
    for y, e in zip(ys, expected):
        np.testing.assert_allclose(y, e, rtol=1e-6, atol=1e-6)
    runtime = forge.Runtime(out)
    assert runtime.input_names == ["a", "ids"] and runtime.input_dtypes == ["float32", "int64"]
    assert runtime.output_names == ["probs", "act"] and runtime.output_shapes == [(4, 8), (4, 8)]


def test_dynamic_batch_artifact(tmp_path):
    ir = forge.from_onnx(conv_bn_net(seed=2, batch="N"))
    run = ir.get_inference_function()
    out = tmp_path / "dyn"
    ir.compile(output_path=out)
    runtime = forge.Runtime(out)
    assert runtime.input_shapes == [(-1, 3, 16, 16)]
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        np.testing.assert_allclose(runtime.infer(x)[0], run(x), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ir = forge.from_onnx(conv_bn_net(seed=4))
    out = tmp_path_factory.mktemp("meta") / "artifact"
    ir.compile(target="llvm -mcpu=skylake", output_path=out, export_metadata=True, export_relay=True)
    return ir, out


class TestMetadata:
    def test_schema(self, artifact):
        _, out = artifact
        meta = json.loads((out / "model_metadata.json").read_text())
        jsonschema.validate(meta, schema.JSON_SCHEMA)
        assert list(meta)[0] == "forge_artifact"
        assert set(schema.REQUIRED_KEYS) <= set(meta)

    def test_contents(self, artifact):
        import tvm

        ir, out = artifact
        meta = json.loads((out / "model_metadata.json").read_text())
        assert meta["forge_version"] == forge.__version__ and meta["tvm_version"] == tvm.__version__
        assert meta["fingerprint"] == ir.fingerprint
        assert int(meta["structural_hash"], 16) == hash(ir) & 0xFFFFFFFFFFFFFFFF
        assert meta["target"]["string"] == "llvm -mcpu=skylake" and meta["host"] is None
        assert meta["target"]["config"]["mcpu"] == "skylake"
        assert meta["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32", "layout": "NCHW"}]
        assert meta["outputs"] == [{"name": "y", "shape": [1, 10], "dtype": "float32", "layout": None}]
        assert (meta["precision"], meta["opt_level"], meta["encrypted"]) == ("float32", 3, False)
        import hashlib

        library = (out / "model_library.so").read_bytes()
        assert meta["library"] == {"file": "model_library.so", "sha256": hashlib.sha256(library).hexdigest()}
        uuid_lib.UUID(meta["uuid"])

    def test_embedded_copy_matches_the_file(self, artifact):
        _, out = artifact
        meta = json.loads((out / "model_metadata.json").read_text())
        embedded = forge.Runtime(out).get_metadata()
        assert {k: v for k, v in embedded.items() if k != "library"} == {
            k: v for k, v in meta.items() if k != "library"}
        assert embedded["library"]["sha256"] == meta["library"]["sha256"]

    def test_ir_text_is_the_final_ir(self, artifact):
        _, out = artifact
        text = (out / "model_relay.txt").read_text()
        assert "def main(" in text and "R.nn.conv2d" in text


def test_uuid_is_inside_the_library_without_the_json(tmp_path, conv_ir):
    chosen = str(uuid_lib.uuid4())
    out = tmp_path / "a"
    conv_ir.compile(output_path=out, uuid=chosen)
    assert not (out / "model_metadata.json").exists()
    assert forge.Runtime(out).uuid == chosen


def test_default_uuid_is_a_random_uuid4(tmp_path, conv_ir):
    conv_ir.compile(output_path=tmp_path / "a")
    conv_ir.compile(output_path=tmp_path / "b")
    a, b = forge.Runtime(tmp_path / "a").uuid, forge.Runtime(tmp_path / "b").uuid
    assert a != b and uuid_lib.UUID(a).version == 4


def test_invalid_uuid(tmp_path, conv_ir):
    with pytest.raises(ValueError, match="uuid must be a UUID.*given 'not-a-uuid'"):
        conv_ir.compile(output_path=tmp_path / "a", uuid="not-a-uuid")


class TestOutputPath:
    def test_directory_is_created(self, tmp_path, conv_ir):
        out = tmp_path / "deep" / "er" / "artifact"
        conv_ir.compile(output_path=out)
        assert (out / "model_library.so").is_file()

    def test_empty_existing_directory_is_used(self, tmp_path, conv_ir):
        out = tmp_path / "empty"
        out.mkdir()
        conv_ir.compile(output_path=out)
        assert (out / "model_library.so").is_file()

    def test_non_empty_directory_needs_force(self, tmp_path, conv_ir):
        out = tmp_path / "full"
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        with pytest.raises(ValueError, match="exists and is not empty; pass force_overwrite=True"):
            conv_ir.compile(output_path=out)
        assert os.listdir(out) == ["keep.txt"]

    def test_a_file_is_not_a_directory(self, tmp_path, conv_ir):
        out = tmp_path / "file"
        out.write_text("x")
        with pytest.raises(ValueError, match="is not a directory"):
            conv_ir.compile(output_path=out)

    def test_force_replaces_the_whole_directory(self, tmp_path, conv_ir):
        out = tmp_path / "a"
        conv_ir.compile(output_path=out, export_relay=True, export_metadata=True)
        conv_ir.compile(output_path=out, force_overwrite=True)
        assert os.listdir(out) == ["model_library.so"]
        assert sorted(os.listdir(tmp_path)) == ["a"]

    def test_a_compile_failing_at_link_time_leaves_the_old_artifact(self, tmp_path, conv_ir, monkeypatch):
        out = tmp_path / "artifact"
        conv_ir.compile(target="raspberry-pi/5", output_path=out, export_metadata=True)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        # A cross linker that fails: the failure comes after the whole build, while writing the library.
        tools = tmp_path / "bin"
        tools.mkdir()
        linker = tools / "aarch64-linux-gnu-gcc"
        linker.write_text("#!/bin/sh\necho 'ld: cannot find -lbroken' >&2\nexit 1\n")
        linker.chmod(linker.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
        with pytest.raises(forge.CompilationError, match=r"(?s)Writing library .* failed.*cannot find -lbroken"):
            conv_ir.compile(target="raspberry-pi/5", output_path=out, force_overwrite=True, export_metadata=True)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(os.listdir(tmp_path)) == ["artifact", "bin"]  # no temporary directory left

    def test_android_without_an_ndk_names_it_and_writes_nothing(self, tmp_path, conv_ir):
        with pytest.raises(forge.CompilationError, match="ANDROID_NDK_HOME"):
            conv_ir.compile(target="android/cpu", output_path=tmp_path / "android")
        assert os.listdir(tmp_path) == []
