"""``compile(shape_buckets=...)``: a dynamic model's artifact with static copies for the sizes the user names.

Each model (from ``test_dynamic_shapes``: a detector with dynamic batch, height and width, a CRNN recognizer with
dynamic batch and width, a conv1d+LSTM voice-activity model with dynamic frames) is compiled once with two buckets;
the artifact must give onnxruntime's numbers at both bucket sizes and at a third size that no bucket holds (the
generic code), run the bucket's own kernels at a bucket's size, and refuse what the model refuses. Then the
options' errors, each naming the input and what the model takes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extra")

import forge  # noqa: E402
from forge_core.runtime import metadata as schema  # noqa: E402
from test_dynamic_shapes import CASES, TinyDetector, benchmark_models, close, export, references  # noqa: E402

BUCKETED = ["detector", "recognizer", "voice-activity"]


def _kernels(runtime: forge.Runtime, x: np.ndarray) -> set[str]:
    return {row.name for row in runtime.profile(x, repeat=1)}


@pytest.mark.parametrize("case", BUCKETED)
def test_buckets_and_the_generic_code_match_onnxruntime(case, tmp_path):
    factory, example_shape, axes, sizes, _, refused = CASES[case]
    data = export(benchmark_models.randomized(factory(), seed=3), torch.randn(example_shape), axes)
    buckets = [{"x": sizes[0]}, {"x": sizes[2]}]
    forge.from_onnx(data).compile(output_path=tmp_path / "artifact", shape_buckets=buckets)
    runtime = forge.Runtime(tmp_path / "artifact")
    recorded = runtime.get_metadata()["shape_buckets"]
    assert [entry["inputs"] for entry in recorded] == [{"x": list(sizes[0])}, {"x": list(sizes[2])}]
    assert runtime.input_shapes == [tuple(-1 if axis in axes else d for axis, d in enumerate(sizes[0]))]
    for x, want in references(data, sizes):
        close(runtime.infer(x)[0], want)
    pairs = references(data, sizes)
    in_bucket, generic = _kernels(runtime, pairs[0][0]), _kernels(runtime, pairs[1][0])
    assert in_bucket - generic, "the bucket's size ran the generic code's kernels only"
    with pytest.raises(forge.InputError) as refusal:
        runtime.infer(np.zeros(refused, "float32"))
    assert "x" in str(refusal.value)


@pytest.mark.parametrize("opt_level", [0, 1, 2, 4])
def test_detector_bucket_at_every_opt_level(opt_level, tmp_path):
    """At opt_level 3 (the test above) ``fast_math`` leaves a sigmoid over the dynamic extents; the other levels
    fuse and fold differently, and a bucket must build and match at each. At opt_level 2 the artifact is also
    encrypted (one compile for both)."""
    factory, example_shape, axes, sizes, _, _ = CASES["detector"]
    data = export(benchmark_models.randomized(factory(), seed=5), torch.randn(example_shape), axes)
    encrypted = opt_level == 2
    password = "correct horse battery staple" if encrypted else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", forge.WeakPasswordWarning)
        forge.from_onnx(data).compile(output_path=tmp_path / "a", opt_level=opt_level,
                                      shape_buckets=[{"x": sizes[1]}], encrypt_password=password)
    runtime = (forge.Runtime(tmp_path / "a", tmp_path / "a" / "modelKey.bin", password) if encrypted
               else forge.Runtime(tmp_path / "a"))
    assert runtime.get_metadata()["shape_buckets"][0]["function"] == "main_bucket0"
    for x, want in references(data, sizes[:2]):
        close(runtime.infer(x)[0], want)


@pytest.fixture(scope="module")
def detector():
    data = export(benchmark_models.randomized(TinyDetector()), torch.randn(1, 3, 32, 32),
                  {0: "batch", 2: "height", 3: "width"})
    return forge.from_onnx(data)


@pytest.mark.parametrize("buckets, message", [
    ({"x": (1, 3, 32, 32)}, r"shape_buckets must be a list of \{input name: shape\} dicts"),
    ([{"image": (1, 3, 32, 32)}], r"shape_buckets\[0\] names 'image', which is not an input of the model; its "
                                  r"inputs: x: \(batch, 3, height, width\)"),
    ([{"x": (1, 3, 32, 32)}, {}], r"shape_buckets\[1\] leaves out input x: \(batch, 3, height, width\)"),
    ([{"x": (1, 4, 32, 32)}], r"gives input 'x' the shape \(1, 4, 32, 32\), which the model does not take: "
                              r"x: \(batch, 3, height, width\)"),
    ([{"x": (1, 3, 32)}], r"the shape \(1, 3, 32\), which the model does not take"),
    ([{"x": (1, 3, -32, 32)}], r"must be a tuple of non-negative integers, given \(1, 3, -32, 32\)"),
    ([{"x": (1, 3, 32, 32)}, {"x": [1, 3, 32, 32]}], r"shape_buckets\[1\] repeats an earlier bucket"),
])
def test_bucket_errors_name_the_input_and_its_shapes(detector, buckets, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        detector.compile(output_path=tmp_path / "never", shape_buckets=buckets)
    assert not (tmp_path / "never").exists()


def test_bucket_must_agree_on_a_dim_inputs_share(tmp_path):
    from onnx import TensorProto
    from onnx import helper as oh

    graph = oh.make_graph([oh.make_node("Add", ["a", "b"], ["y"], name="add")], "shared",
                          [oh.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
                           oh.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    ir = forge.from_onnx(model.SerializeToString())
    with pytest.raises(ValueError, match=r"its dim 'n' is 2 in another input of the bucket"):
        ir.compile(output_path=tmp_path / "never", shape_buckets=[{"a": (2, 4), "b": (3, 4)}])
    ir.compile(output_path=tmp_path / "ok", shape_buckets=[{"a": (3, 4), "b": (3, 4)}])
    runtime = forge.Runtime(tmp_path / "ok")
    a, b = np.random.default_rng(0).standard_normal((2, 3, 4)).astype("float32")
    np.testing.assert_array_equal(runtime.infer(a, b)[0], a + b)


def test_static_model_bucket_warns_and_is_dropped(tmp_path):
    data = export(benchmark_models.randomized(TinyDetector()), torch.randn(1, 3, 32, 32), {})
    ir = forge.from_onnx(data)
    with pytest.warns(UserWarning, match=r"shape_buckets\[0\] fixes no dynamic dim"):
        ir.compile(output_path=tmp_path / "a", shape_buckets=[{"x": (1, 3, 32, 32)}])
    assert "shape_buckets" not in forge.Runtime(tmp_path / "a").get_metadata()


def test_cli_shape_bucket(tmp_path):
    factory, example_shape, axes, sizes, _, _ = CASES["recognizer"]
    data = export(benchmark_models.randomized(factory()), torch.randn(example_shape), axes)
    (tmp_path / "rec.onnx").write_bytes(data)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    bucket = "x=" + ",".join(map(str, sizes[1]))
    done = subprocess.run([sys.executable, "-m", "forge_core.cli", "compile", str(tmp_path / "rec.onnx"), "-o",
                           str(tmp_path / "out"), "--export-metadata", "--shape-bucket", bucket],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    metadata = json.loads((tmp_path / "out" / "model_metadata.json").read_text())
    jsonschema.validate(metadata, schema.JSON_SCHEMA)
    assert metadata["shape_buckets"] == [{"function": "main_bucket0", "inputs": {"x": list(sizes[1])}}]
    wrong = {**metadata, "shape_buckets": [{"function": "main_bucket0", "inputs": {"x": [1, -3]}}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema.JSON_SCHEMA)
    info = subprocess.run([sys.executable, "-m", "forge_core.cli", "info", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, check=False)
    assert info.returncode == 0, info.stderr[-2000:]
    assert re.search(r"shape bucket\s+x=" + "x".join(map(str, sizes[1])) + r" \(main_bucket0\)", info.stdout)
    bad = subprocess.run([sys.executable, "-m", "forge_core.cli", "compile", str(tmp_path / "rec.onnx"), "-o",
                          str(tmp_path / "bad"), "--shape-bucket", "x=1,3,32"], capture_output=True, text=True,
                         env=env, check=False)
    assert bad.returncode == 1
    assert "the shape (1, 3, 32), which the model does not take: x: (batch, 3, 32, width)" in bad.stderr


def test_bucketed_detector_builds_for_cuda_and_its_kernels_compile_with_nvcc(tmp_path):
    """On GPUs TVM's dlight rules schedule the bucket's static kernels beside the generic ones; a bucket's
    kernels take no dynamic extent. nvcc compiles them all into the library's fatbin."""
    from cuda_checks import check_cuda_library

    factory, example_shape, axes, sizes, _, _ = CASES["detector"]
    data = export(benchmark_models.randomized(factory()), torch.randn(example_shape), axes)
    forge.from_onnx(data).compile(target="cuda -arch=sm_90", output_path=tmp_path / "cuda",
                                  shape_buckets=[{"x": sizes[2]}], export_metadata=True)
    metadata = json.loads((tmp_path / "cuda" / "model_metadata.json").read_text())
    assert metadata["shape_buckets"][0]["function"] == "main_bucket0"
    kernels = check_cuda_library(tmp_path / "cuda" / "model_library.so", "sm_90")
    assert any(name.endswith("_static_kernel") for name in kernels), kernels  # the bucket's
    assert any(not name.endswith("_static_kernel") for name in kernels), kernels


def test_bucketed_recognizer_builds_for_aarch64(tmp_path):
    import shutil

    from forge_core.runtime.library_file import elf_machine

    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc is not installed (./scripts/setup installs Debian's gcc-aarch64-linux-gnu)")
    factory, example_shape, axes, sizes, _, _ = CASES["recognizer"]
    data = export(benchmark_models.randomized(factory()), torch.randn(example_shape), axes)
    forge.from_onnx(data).compile(target="llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76",
                                  output_path=tmp_path / "arm", shape_buckets=[{"x": sizes[0]}])
    assert elf_machine((tmp_path / "arm" / "model_library.so").read_bytes()) == "aarch64"


def test_bucket_checks_a_dim_that_is_an_expression_of_another():
    """An importer may give an input a dim computed from another (``2 * n``): the bucket's size for it must be
    that value."""
    import tvm
    from tvm import relax

    from forge_core.compiler.buckets import bucket_bindings
    from forge_core.runtime.signature import TensorSpec

    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, n * 2], "float32"))
    spec = TensorSpec("x", (-1, -1), "float32", ("n", "n * 2"))
    ((values, shapes),) = bucket_bindings([x], [spec], [{"x": (3, 6)}])
    assert {var.name: size for var, size in values.items()} == {"n": 3} and shapes == {"x": [3, 6]}
    with pytest.raises(ValueError, match=r"the shape \(3, 5\), which the model does not take: x: \(n, n \* 2\)"):
        bucket_bindings([x], [spec], [{"x": (3, 5)}])
