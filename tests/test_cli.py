"""The ``forge`` command, through a real subprocess."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_factory import conv_bn_net, light_model_path, unsupported_ops_net

import forge

FORGE = shutil.which("forge", path=os.path.dirname(sys.executable)) or "forge"
FIXTURES = Path(__file__).parent / "fixtures"


def forge_cli(*args, env=None, check=True):
    done = subprocess.run([FORGE, *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "conv.onnx"
    onnx.save(conv_bn_net(seed=12), str(path))
    return path


def test_info_prints_the_summary_and_op_table():
    done = forge_cli("info", light_model_path("squeezenet"))
    assert "data_0: (1, 3, 224, 224) float32" in done.stdout
    assert "nn.conv2d" in done.stdout and "26" in done.stdout


def test_info_with_a_shape_override(model_path):
    done = forge_cli("info", model_path, "--shape", "x=-1,3,16,16")
    assert "x: (?, 3, 16, 16) float32" in done.stdout


def test_info_on_a_cuda_artifact_names_its_arch(model_path, tmp_path):
    """A user cannot tell what a CUDA library holds from its file: ``forge info`` says the arch it was built
    for and how its kernels are stored."""
    forge_cli("compile", model_path, "-o", tmp_path / "cuda", "--target", "cuda -arch=sm_80")
    done = forge_cli("info", tmp_path / "cuda")
    assert re.search(r"gpu arch\s+sm_80; kernels as a fatbin of sm_80 \+ compute_80, built by nvcc 1[23]\.\d",
                     done.stdout), done.stdout


def test_compile_then_run_with_inputs(model_path, tmp_path):
    out = tmp_path / "artifact"
    forge_cli("compile", model_path, "-o", out, "--target", "llvm", "--opt-level", "2", "--export-metadata",
              "--export-relay", "--uuid", "123e4567-e89b-12d3-a456-426614174000")
    assert sorted(os.listdir(out)) == ["model_library.so", "model_metadata.json", "model_relay.txt"]
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    done = forge_cli("run", out, "--input", tmp_path / "x.npy", "--repeat", "5", "--save-outputs", tmp_path / "o")
    assert "123e4567-e89b-12d3-a456-426614174000" in done.stdout
    assert "p50" in done.stdout and "p90" in done.stdout and "p99" in done.stdout
    expected = forge.from_onnx(model_path).get_inference_function()(x)
    np.testing.assert_allclose(np.load(tmp_path / "o" / "output_0.npy"), expected, rtol=1e-5, atol=1e-5)


def test_compile_options_reach_the_artifact(model_path, tmp_path):
    out = tmp_path / "a"
    forge_cli("compile", model_path, "-o", out, "--float16", "--channel-layout", "last", "--opt-level", "4",
              "--export-metadata")
    meta = json.loads((out / "model_metadata.json").read_text())
    assert (meta["precision"], meta["channel_layout"], meta["opt_level"]) == ("float16", "last", 4)
    forge_cli("compile", model_path, "-o", out, "--force", "--target", "raspberry-pi/5")
    assert os.listdir(out) == ["model_library.so"]  # the second compile replaced the directory


def test_run_with_random_inputs_as_json(model_path, tmp_path):
    out = tmp_path / "a"
    forge_cli("compile", model_path, "-o", out)
    report = json.loads(forge_cli("run", out, "--json", "--repeat", "3").stdout)
    assert report["outputs"] == [{"name": "y", "shape": [1, 10], "dtype": "float32"}]
    assert report["latency_ms"]["runs"] == 3 and report["latency_ms"]["p50"] > 0


def test_tags_and_categories():
    names = forge_cli("tags", "--category", "arm").stdout.split()
    assert "raspberry-pi/5" in names and all("/" in n for n in names)
    verbose = forge_cli("tags", "--category", "android", "--verbose").stdout
    assert "android/cpu" in verbose and "aarch64-linux-android" in verbose
    done = forge_cli("tags", "--category", "nope", check=False)
    assert done.returncode == 1 and "categories: " in done.stderr


def test_plugins():
    listing = json.loads(forge_cli("plugins", "--json").stdout)
    names = {p["name"] for p in listing}
    assert {"folding_passes", "target_tags", "exporters", "onnx"} <= names
    by_name = {p["name"]: p for p in listing}
    assert by_name["onnx"]["registers"]["frontends"] == 1 and by_name["onnx"]["registers"]["converters"] > 10
    assert by_name["exporters"]["registers"] == {"exporters": 3}
    table = forge_cli("plugins").stdout
    assert "register_frontends" in table and "3 exporters" in table


@pytest.mark.parametrize(
    "args, message",
    [
        (("compile", "missing.onnx", "-o", "x"), "Model 'missing.onnx' does not exist"),
        (("compile", "{model}", "-o", "{tmp}/a", "--target", "rasberry-pi/5"), "Did you mean: raspberry-pi/5"),
        (("compile", "{model}", "-o", "{tmp}/a", "--uuid", "nope"), "uuid must be a UUID"),
        (("run", "{tmp}/nothing"), "No compiled library"),
        (("info", "{unsupported}"), "com.acme.FancyOp: 2 nodes"),
        (("info", "{model}", "--shape", "x:1,2"), "--shape 'x:1,2' must look like NAME=D0,D1"),
    ],
)
def test_errors_are_one_line_without_traceback(model_path, tmp_path, args, message):
    unsupported = tmp_path / "unsupported.onnx"
    onnx.save(unsupported_ops_net(), str(unsupported))
    args = [a.format(model=model_path, tmp=tmp_path, unsupported=unsupported) for a in args]
    done = forge_cli(*args, check=False)
    assert done.returncode == 1
    assert done.stderr.startswith("forge: error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_debug_shows_the_traceback(tmp_path):
    done = forge_cli("--debug", "run", tmp_path / "nothing", check=False)
    assert done.returncode != 0 and "Traceback" in done.stderr


def test_existing_output_needs_force(model_path, tmp_path):
    out = tmp_path / "a"
    forge_cli("compile", model_path, "-o", out)
    done = forge_cli("compile", model_path, "-o", out, check=False)
    assert done.returncode == 1 and "exists and is not empty" in done.stderr


def test_password_comes_from_the_environment_never_the_command_line(model_path, tmp_path):
    done = subprocess.run([FORGE, "compile", str(model_path), "-o", str(tmp_path / "e"), "--encrypt"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={k: v for k, v in os.environ.items() if k != "FORGE_ENCRYPT_PASSWORD"})
    assert done.returncode == 1 and "set FORGE_ENCRYPT_PASSWORD" in done.stderr
    usage = forge_cli("compile", model_path, "-o", tmp_path / "e", "--password", "x", check=False)
    assert usage.returncode == 2 and "unrecognized arguments: --password" in usage.stderr


def test_a_third_party_tag_plugin_installed_with_pip(model_path, tmp_path):
    site = tmp_path / "site"
    source = tmp_path / "forge_acme_tags"  # pip builds in place: keep the checkout clean
    shutil.copytree(FIXTURES / "forge_acme_tags", source)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    listing = forge_cli("tags", "--category", "acme", "--verbose", env=env).stdout
    assert "acme/edge-1" in listing and "acme/edge-2" in listing and "cortex-a55" in listing
    plugins = json.loads(forge_cli("plugins", "--json", env=env).stdout)
    acme = next(p for p in plugins if p["name"] == "acme_tags")
    assert acme["distribution"] == "forge-acme-tags" and acme["version"] == "1.0.0"
    assert acme["registers"] == {"target tags": 2}
    if shutil.which("aarch64-linux-gnu-gcc"):
        forge_cli("compile", model_path, "-o", tmp_path / "acme", "--target", "acme/edge-1", env=env)
        assert (tmp_path / "acme" / "model_library.so").read_bytes()[18] == 183  # EM_AARCH64


# ----------------------------------------------------------------------
# forge quantize
# ----------------------------------------------------------------------

QUANT_SHAPE = (1, 3, 12, 12)


@pytest.fixture(scope="module")
def quant_model(tmp_path_factory):
    """A tiny conv-relu-conv ONNX model (input "x" of QUANT_SHAPE), exported with torch."""
    import torch

    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(8, 4, 3, padding=1)

        def forward(self, x):
            return self.conv2(torch.relu(self.conv1(x)))

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("quant") / "convnet.onnx"
    torch.onnx.export(ConvNet().eval(), (torch.randn(*QUANT_SHAPE),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"])
    return path


def _samples(count, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(QUANT_SHAPE).astype(np.float32) for _ in range(count)]


def _assert_close_to_float(model, artifact, key=None, password=None):
    runtime = forge.Runtime(artifact, key, password)
    float_fn = forge.from_onnx(model).get_inference_function()
    for x in _samples(3, seed=99):
        want = np.asarray(float_fn(x))
        got = runtime.infer(x)[0]
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_quantize_a_directory_of_npy_with_the_report(quant_model, tmp_path):
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, sample in enumerate(_samples(6)):
        np.save(calib / f"sample_{index}.npy", sample)
    out = tmp_path / "int8"
    done = forge_cli("quantize", quant_model, "--calib", calib, "-o", out, "--max-samples", "5", "--report",
                     "--report-json", tmp_path / "report.json")
    assert "Calibrated on 5 samples" in done.stdout and "Quantized 2 layers (static" in done.stdout
    assert os.listdir(out) == ["model_library.so"] and str(out) in done.stdout
    _assert_close_to_float(quant_model, out)
    rows = re.findall(r"│\s*(\S+)\s*│\s*conv\s*│\s*(-?\d+\.\d+)\s*│\s*(\d\S*)\s*│", done.stdout)
    assert len(rows) == 2 and all(float(sqnr) > 15 for _, sqnr, _ in rows), done.stdout
    assert "Lowest SQNR: " in done.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["num_samples"] == 5 and list(report["outputs"]) == ["y"]
    assert [row["name"] for row in report["layers"]] == [name for name, _, _ in rows]
    assert all(row["kind"] == "conv" and row["input_scale"] > 0 for row in report["layers"])


def test_quantize_a_stacked_npz_per_channel(quant_model, tmp_path):
    stacked = np.concatenate(_samples(4))  # (4, 3, 12, 12): sample i is x[i:i+1]
    np.savez(tmp_path / "calib.npz", x=stacked)
    out = tmp_path / "uint8"
    done = forge_cli("quantize", quant_model, "--calib", tmp_path / "calib.npz", "-o", out, "--per-channel",
                     "--activation-dtype", "uint8", "--method", "percentile", "--percentile", "99.9", "--encrypt",
                     env={"FORGE_ENCRYPT_PASSWORD": "quantized-and-encrypted"})
    assert "Calibrated on 4 samples (stacked by input name)" in done.stdout
    assert "activations uint8, kernels uint8 per-channel, percentile" in done.stdout
    assert "modelKey.bin" in done.stdout
    _assert_close_to_float(quant_model, out, out / "modelKey.bin", "quantized-and-encrypted")


@pytest.mark.parametrize(
    "calib, message",
    [
        ("missing", "--calib: '{tmp}/missing' does not exist"),
        ("empty", "--calib: the directory '{tmp}/empty' is empty"),
        ("notes", "--calib: '{tmp}/notes/readme.txt' is not a .npy or .npz file"),
        ("wrong_shape", "calibration sample 2: Input 'x' (#0): expected shape (1, 3, 12, 12), given (1, 3, 8, 8) "
                        "(from {tmp}/wrong_shape/s_10.npy)"),
    ],
)
def test_quantize_calibration_errors(quant_model, tmp_path, calib, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    np.save(tmp_path / "notes" / "s_0.npy", _samples(1)[0])
    (tmp_path / "notes" / "readme.txt").write_text("samples")
    (tmp_path / "wrong_shape").mkdir()
    for name, sample in zip(["s_1", "s_2", "s_10"], _samples(2) + [np.zeros((1, 3, 8, 8), np.float32)]):
        np.save(tmp_path / "wrong_shape" / f"{name}.npy", sample)  # natural order: s_10 is sample 2
    done = forge_cli("quantize", quant_model, "--calib", tmp_path / calib, "-o", tmp_path / "out", check=False)
    last_line = done.stderr.strip().splitlines()[-1]  # a progress bar may come before the error
    assert done.returncode == 1 and last_line.startswith("forge: error: ")
    assert message.format(tmp=tmp_path) in last_line
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
