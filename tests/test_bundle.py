"""``forge bundle``: an artifact and its runtime for a board with Python 3 and numpy alone (``forge_core.deploy``).

The bundles run in a Python that has numpy and nothing else: this machine's
Python with ``-S`` (no site-packages) and numpy alone on its path, and, for
aarch64, Debian's arm64 Python 3.11 and numpy under ``qemu-aarch64`` (a root
extracted once by ``mmdebstrap`` into the cache). Outputs are compared with
onnxruntime on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net

import forge
from forge_core.deploy import wheels

ROOT_ENV = "FORGE_ARM64_ROOT"
PASSWORD = "bundle-password-2026!"
X = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype("float32")


@pytest.fixture(scope="module")
def model() -> bytes:
    return conv_bn_net(seed=21).SerializeToString()


@pytest.fixture(scope="module")
def want(model) -> np.ndarray:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


@pytest.fixture(scope="module")
def numpy_only(tmp_path_factory) -> Path:
    """A directory holding numpy alone, for a Python started with -S."""
    directory = tmp_path_factory.mktemp("numpy-only")
    source = Path(np.__file__).parent
    (directory / "numpy").symlink_to(source)
    if (source.parent / "numpy.libs").is_dir():
        (directory / "numpy.libs").symlink_to(source.parent / "numpy.libs")
    return directory


def run_bundle(bundle: Path, command: list[str], tmp_path: Path, env: dict[str, str]) -> tuple[np.ndarray, str]:
    np.save(tmp_path / "x.npy", X)
    done = subprocess.run([*command, "-m", "forge_runtime", "--input", str(tmp_path / "x.npy"), "--output",
                           str(tmp_path / "y.npy")], cwd=bundle, capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(tmp_path / "y.npy"), done.stdout


def host_env(numpy_only: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_", "FORGE_"))}
    return {**env, "PYTHONPATH": str(numpy_only), **extra}


def test_an_x86_64_bundle_runs_with_python_and_numpy_alone(model, want, numpy_only, tmp_path):
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact")
    out = forge.bundle(tmp_path / "artifact", "linux-x86_64", tmp_path / "bundle")
    description = json.loads((out / "bundle.json").read_text())
    assert description["platform"] == "linux-x86_64" and not description["encrypted"]
    assert description["runtime_bytes"] < 15 * 2**20, description["runtime_bytes"]
    names = {p.name for p in (out / "lib").rglob("*")}
    assert "libtvm_runtime.so" in names and "libtvm_compiler.so" not in names and "cryptography" not in names
    got, stdout = run_bundle(out, [sys.executable, "-S"], tmp_path, host_env(numpy_only))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert f"TVM runtime from {out.resolve() / 'lib' / 'tvm'}" in stdout


def test_an_encrypted_bundle_carries_its_key_and_cryptography(model, want, numpy_only, tmp_path):
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact", encrypt_password=PASSWORD)
    out = forge.bundle(tmp_path / "artifact", "linux-x86_64", tmp_path / "bundle")
    assert (out / "model" / "modelKey.bin").is_file() and (out / "lib" / "cryptography").is_dir()
    got, _ = run_bundle(out, [sys.executable, "-S"], tmp_path, host_env(numpy_only, FORGE_PASSWORD=PASSWORD))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    done = subprocess.run([sys.executable, "-S", "-m", "forge_runtime"], cwd=out, capture_output=True, text=True,
                          env=host_env(numpy_only), timeout=300)
    assert done.returncode != 0 and "the model is encrypted: give its password" in done.stderr


def test_a_bundle_for_another_machine_is_refused_and_nothing_is_written(model, tmp_path):
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact")
    with pytest.raises(forge.ForgeError, match=r"built for x86_64, and the bundle's platform linux-aarch64 runs "
                                               r"aarch64"):
        forge.bundle(tmp_path / "artifact", "linux-aarch64", tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()
    with pytest.raises(ValueError, match="python must be one of 3.11, 3.12"):
        forge.bundle(tmp_path / "artifact", "linux-x86_64", tmp_path / "bundle", python="3.9")


def test_an_encrypted_cuda_artifact_bundles_with_the_cuda_runtime(model, tmp_path):
    """The machine of an encrypted library comes from its metadata (its host's CPU features: a CUDA target's host
    is TVM's default CPU); the bundle carries TVM's CUDA runtime library beside the CPU one. (Run on an H200
    by hand: the README's deployment section.)"""
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file():
        pytest.skip("nvcc is not installed: no CUDA artifact can be built here")
    forge.from_onnx(model).compile(target="cuda -arch=sm_80", output_path=tmp_path / "artifact",
                                   encrypt_password=PASSWORD)
    out = forge.bundle(tmp_path / "artifact", "linux-x86_64", tmp_path / "bundle", python="3.12")
    description = json.loads((out / "bundle.json").read_text())
    assert description["device"] == "cuda" and description["python"] == "3.12" and description["encrypted"]
    libraries = {p.name for p in (out / "lib" / "tvm" / "lib").iterdir()}
    assert libraries == {"libtvm_runtime.so", "libtvm_runtime_cuda.so"}
    assert any(p.name.startswith("core.cpython-312") for p in (out / "lib" / "tvm_ffi").iterdir())


def test_a_wheel_whose_hash_is_not_pinned_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path / "cache"))
    name = next(iter(wheels.PINNED["typing-extensions==4.16.0"]))
    monkeypatch.setitem(wheels.PINNED, "typing-extensions==4.16.0", {name: "0" * 64})
    with pytest.raises(forge.ForgeError, match="its SHA-256 is not the pinned one"):
        wheels.wheel("typing-extensions==4.16.0", "linux-aarch64", "3.11")
    assert not list((tmp_path / "cache").rglob("*.whl"))


# --- aarch64 under qemu ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def arm64_root() -> Path:
    """Debian 12's arm64 Python 3.11 and numpy, extracted once (mmdebstrap, no chroot) into the cache."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    for tool in ("qemu-aarch64", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (./scripts/setup installs Debian's qemu-user and mmdebstrap)")
    root = wheels.cache_dir().parent / "arm64-bookworm"
    if not (root / "usr" / "bin" / "python3.11").is_file():
        partial = root.with_name(root.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        root.parent.mkdir(parents=True, exist_ok=True)  # mmdebstrap needs the target's directory to exist
        done = subprocess.run(["mmdebstrap", "--mode=auto", "--variant=extract", "--architectures=arm64",
                               "--include=python3.11,python3-numpy,libstdc++6", "bookworm", str(partial)],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    return root


def qemu_python(root: Path) -> list[str]:
    blas = "/usr/lib/aarch64-linux-gnu/blas:/usr/lib/aarch64-linux-gnu/lapack"  # extract runs no alternatives
    return ["qemu-aarch64", "-cpu", "max", "-L", str(root), "-E", f"LD_LIBRARY_PATH={blas}",
            str(root / "usr" / "bin" / "python3.11")]


def run_under_qemu(root: Path, tmp_path: Path, *args: Path) -> np.lib.npyio.NpzFile:
    """``tmp_path/runner.py ARGS... tmp_path/outputs.npz`` in Debian's arm64 Python; the outputs it saved."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_", "FORGE_"))}
    done = subprocess.run([*qemu_python(root), str(tmp_path / "runner.py"), *map(str, args),
                           str(tmp_path / "outputs.npz")], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(tmp_path / "outputs.npz")


@pytest.mark.parametrize("case", ["raspberry-pi/5", "raspberry-pi/4", "raspberry-pi/5-int8"])
def test_an_aarch64_bundle_runs_under_qemu(case, model, want, arm64_root, tmp_path):
    """Compiled for the board's tag, bundled with the CLI, run by Debian's arm64 Python under qemu: the first
    Forge aarch64 artifacts that ran anywhere. The int8 model (calibrated, quantized) holds the dot-product
    instructions (``sdot``/``udot``, which ``-cpu max`` emulates) and gives the numbers of its inference
    function on this machine."""
    tag = case.removesuffix("-int8")
    ir = forge.from_onnx(model)
    if case.endswith("-int8"):
        rng = np.random.default_rng(5)
        ir.calibrate([rng.standard_normal((1, 3, 16, 16)).astype("float32") for _ in range(4)])
        ir.quantize()
        want = ir.get_inference_function()(X)
    ir.compile(target=tag, output_path=tmp_path / "artifact")
    if case.endswith("-int8") and shutil.which("aarch64-linux-gnu-objdump"):
        code = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(tmp_path / "artifact" / "model_library.so")],
                              capture_output=True, text=True, check=True).stdout
        assert "sdot" in code or "udot" in code
    forge_bin = os.path.join(os.path.dirname(sys.executable), "forge")
    done = subprocess.run([forge_bin, "bundle", str(tmp_path / "artifact"), "--platform", "linux-aarch64", "-o",
                           str(tmp_path / "bundle")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Bundled for linux-aarch64 (Python 3.11)" in done.stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_", "FORGE_"))}
    got, stdout = run_bundle(tmp_path / "bundle", qemu_python(arm64_root), tmp_path, env)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert "platform linux-aarch64" in stdout


# Run inside Debian's arm64 Python: every artifact of the sweep through one bundle's runtime, in one process
# (an emulated Python with numpy takes seconds to start).
_SWEEP_RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import forge_runtime
x = np.load(sys.argv[2])
artifacts = json.loads(open(sys.argv[3]).read())
np.savez(sys.argv[4], **{name: forge_runtime.Runtime(path).infer(x)[0] for name, path in artifacts.items()})
"""


def _dynamic_detector() -> bytes:
    """A detector over any batch, height and width, built with onnx.helper: a strided convolution, a depthwise
    one, a max pool, a 1x1 convolution and a transposed convolution back up, random weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype("float32"),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w3"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("ConvTranspose", ["c3", "w4", "b4"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    inits = [weight("w1", 8, 3, 3, 3), weight("b1", 8), weight("w2", 8, 1, 3, 3), weight("w3", 16, 8, 1, 1),
             weight("w4", 16, 4, 2, 2), weight("b4", 4),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    graph = helper.make_graph(nodes, "dynamic-detector",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, None, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


_DYNAMIC_RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import forge_runtime
runtime = forge_runtime.Runtime(sys.argv[2])
inputs = np.load(sys.argv[3])
np.savez(sys.argv[4], **{name: runtime.infer(inputs[name])[0] for name in inputs.files})
"""


def test_a_model_with_a_dynamic_height_and_width_runs_at_any_size_under_qemu(arm64_root, tmp_path):
    """One raspberry-pi/5 artifact over a dynamic batch, height and width (the dynamic rules' clamped tiles on
    NEON's 4 lanes: convolution, depthwise, pooling, transposed convolution), run at three sizes by Debian's
    arm64 Python: onnxruntime's numbers at each."""
    model = _dynamic_detector()
    forge.from_onnx(model).compile(target="raspberry-pi/5", output_path=tmp_path / "artifact", export_metadata=True)
    rules = set(json.loads((tmp_path / "artifact" / "model_metadata.json").read_text())["schedules"]["rules"].values())
    assert {"DynamicConv2dNCHW", "DynamicGroupedConv2dNCHW", "DynamicWindowPoolNCX", "ConvTransposeNCHW"} <= rules
    forge.bundle(tmp_path / "artifact", "linux-aarch64", tmp_path / "bundle")
    rng = np.random.default_rng(4)
    inputs = {f"x{i}": rng.standard_normal(size).astype("float32")
              for i, size in enumerate([(1, 3, 32, 48), (2, 3, 20, 12), (1, 3, 4, 44)])}
    np.savez(tmp_path / "inputs.npz", **inputs)
    (tmp_path / "runner.py").write_text(_DYNAMIC_RUNNER)
    outputs = run_under_qemu(arm64_root, tmp_path, tmp_path / "bundle", tmp_path / "artifact",
                             tmp_path / "inputs.npz")
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for name, x in inputs.items():
        np.testing.assert_allclose(outputs[name], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5,
                                   err_msg=str(x.shape))


def test_an_encrypted_aarch64_bundle_runs_under_qemu(model, want, arm64_root, tmp_path):
    """An encrypted raspberry-pi/5 artifact: the bundle carries its key and cryptography's aarch64 wheel (pinned),
    and Debian's arm64 Python decrypts and runs it with the password from FORGE_PASSWORD."""
    forge.from_onnx(model).compile(target="raspberry-pi/5", output_path=tmp_path / "artifact",
                                   encrypt_password=PASSWORD)
    out = forge.bundle(tmp_path / "artifact", "linux-aarch64", tmp_path / "bundle")
    assert (out / "model" / "modelKey.bin").is_file() and (out / "lib" / "cryptography").is_dir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_", "FORGE_"))}
    got, _ = run_bundle(out, qemu_python(arm64_root), tmp_path, {**env, "FORGE_PASSWORD": PASSWORD})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_every_arm_and_raspberry_pi_tag_compiles_and_every_aarch64_linux_one_runs_under_qemu(arm64_root, tmp_path):
    """The tag list's boards, each compiling MobileNetV2 (width 0.5, 32x32) once: the aarch64 Linux ones
    (Cortex-A53 to Neoverse-V1, SVE and i8mm included, which ``-cpu max`` emulates) run in Debian's arm64 Python and
    give onnxruntime's numbers (within 1e-4 of the output's range); the 32-bit Arm and Android ones need a
    toolchain this machine lacks, and say which."""
    from forge_core.targets.listing import tags_in
    from forge_core.targets.parsing import resolve_target

    model, image = _small_mobilenetv2()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": image})[0]
    tags = [t for t in tags_in() if t.name.startswith(("arm/", "raspberry-pi/"))]
    aarch64 = {}
    for tag in tags:
        triple = str(resolve_target(tag.name).attrs.get("mtriple", ""))
        ir = forge.from_onnx(model)
        out = tmp_path / "artifacts" / tag.name.replace("/", "_")
        if triple.startswith("aarch64-linux"):
            ir.compile(target=tag.name, output_path=out)
            aarch64[tag.name.replace("/", "_").replace("-", "_")] = str(out)
            continue
        needs = "Android NDK" if "android" in triple else "arm-linux-gnueabihf-gcc"
        try:
            ir.compile(target=tag.name, output_path=out)
        except forge.CompilationError as exc:
            assert needs in str(exc), (tag.name, str(exc))
            assert not out.exists()
    assert len(aarch64) >= 16, sorted(aarch64)
    forge.bundle(next(iter(aarch64.values())), "linux-aarch64", tmp_path / "bundle")
    (tmp_path / "artifacts.json").write_text(json.dumps(aarch64))
    (tmp_path / "runner.py").write_text(_SWEEP_RUNNER)
    np.save(tmp_path / "x.npy", image)
    outputs = run_under_qemu(arm64_root, tmp_path, tmp_path / "bundle", tmp_path / "x.npy",
                             tmp_path / "artifacts.json")
    assert sorted(outputs.files) == sorted(aarch64)
    for name in outputs.files:
        np.testing.assert_allclose(outputs[name], want, rtol=0, atol=1e-4 * float(np.abs(want).max()), err_msg=name)


def _small_mobilenetv2() -> tuple[bytes, np.ndarray]:
    """MobileNetV2's layers at width 0.5 (``test_isa_matrix.MobileNetV2``, random weights and statistics) as
    ONNX for a 32x32 image, and an image."""
    import torch
    from model_factory import export_torch
    from test_isa_matrix import MobileNetV2

    torch.manual_seed(35)
    model = export_torch(MobileNetV2().eval(), (torch.randn(1, 3, 32, 32),), ["x"])
    return model.SerializeToString(), np.random.default_rng(35).standard_normal((1, 3, 32, 32)).astype(np.float32)


def test_an_emulated_raspberry_pi_serves_forge_run_through_the_rpc_tracker(model, want, arm64_root, tmp_path):
    """The bundle's ``forge_runtime.rpc_server`` in Debian's arm64 Python under qemu is the board; ``forge run
    --rpc-tracker`` on this machine uploads the raspberry-pi/5 library to it, runs it there and brings the outputs
    back. (qemu-user cannot start an aarch64 child by itself, so the board's Python is a script that starts it
    under qemu: TVM's server runs each session in a child process.)"""
    from rpc_farm import RPCFarm

    ir = forge.from_onnx(model)
    ir.compile(target="raspberry-pi/5", output_path=tmp_path / "artifact")
    board = forge.bundle(tmp_path / "artifact", "linux-aarch64", tmp_path / "bundle")
    python = tmp_path / "python3-aarch64"
    python.write_text("#!/bin/sh\nexec " + " ".join(qemu_python(arm64_root)) + ' "$@"\n')
    python.chmod(0o755)
    start = (f"import runpy, sys; sys.executable = {str(python)!r}; "
             "runpy.run_module('forge_runtime.rpc_server', run_name='__main__', alter_sys=True)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_", "FORGE_"))}
    np.save(tmp_path / "x.npy", X)
    with RPCFarm() as farm:
        farm.add_board("pi5", [str(python), "-c", start], env=env, cwd=board)
        forge_bin = os.path.join(os.path.dirname(sys.executable), "forge")
        done = subprocess.run([forge_bin, "run", str(tmp_path / "artifact"), "--input", str(tmp_path / "x.npy"),
                               "--rpc-tracker", farm.tracker, "--rpc-key", "pi5", "--rpc-timeout", "300",
                               "--repeat", "2", "--save-outputs", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "load_module" in farm.processes[-1].text()  # the board loaded the library
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output_0.npy"), want, rtol=1e-5, atol=1e-5)


_LOOP_RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import forge_runtime
runtime = forge_runtime.Runtime(sys.argv[2])
cases = np.load(sys.argv[3])
outputs = {}
for case in sorted({name.split("/")[0] for name in cases.files}):
    got = runtime.infer(*[cases[f"{case}/{name}"] for name in ("x0", "M", "go", "b")])
    outputs.update({f"{case}/{i}": value for i, value in enumerate(got)})
np.savez(sys.argv[4], **outputs)
"""


def test_an_onnx_loop_runs_under_qemu(arm64_root, tmp_path):
    """A Loop (forge_onnx/loops.py: a Relax function calling itself, in chunks) compiled for raspberry-pi/5 and
    run by Debian's arm64 Python, 0 to 20 000 iterations, a dynamic row count: onnxruntime's numbers."""
    from test_onnx_loops import _affine_loop

    model = _affine_loop()
    forge.from_onnx(model).compile(target="raspberry-pi/5", output_path=tmp_path / "artifact")
    forge.bundle(tmp_path / "artifact", "linux-aarch64", tmp_path / "bundle")
    rng = np.random.default_rng(6)
    cases = {}
    for index, (rows, trips) in enumerate([(2, 0), (3, 7), (1, 20_000)]):
        # a of the model is (1.1, 0.9, 1.05): with b small, |x| stays under the limit for all 20 000 steps
        scale = 1e-3 if trips > 100 else 1.0
        cases.update({f"c{index}/x0": (scale * rng.standard_normal((rows, 3))).astype(np.float32),
                      f"c{index}/M": np.array(trips, np.int64), f"c{index}/go": np.array(True),
                      f"c{index}/b": (scale * rng.standard_normal((rows, 3))).astype(np.float32)})
    np.savez(tmp_path / "cases.npz", **cases)
    (tmp_path / "runner.py").write_text(_LOOP_RUNNER)
    outputs = run_under_qemu(arm64_root, tmp_path, tmp_path / "bundle", tmp_path / "artifact", tmp_path / "cases.npz")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for index in range(3):
        feeds = {name: cases[f"c{index}/{name}"] for name in ("x0", "M", "go", "b")}
        for position, want in enumerate(session.run(None, feeds)):
            got = outputs[f"c{index}/{position}"]
            if want.size == 0:
                assert got.size == 0
                continue
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()),
                                       err_msg=f"case {index}, output {position}")


_MODELS_RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import forge_runtime
cases = json.loads(open(sys.argv[2]).read())
inputs = np.load(sys.argv[3])
outputs = {}
for name, (path, feeds) in cases.items():
    for index, value in enumerate(forge_runtime.Runtime(path).infer(*[inputs[f] for f in feeds])):
        outputs[f"{name}/{index}"] = value
np.savez(sys.argv[4], **outputs)
"""


def _grouped_pointwise() -> onnx.ModelProto:
    """ShuffleNet's grouped 1x1 convolutions (4 groups) over 28x28, 14x14 and 7x7: on NEON PointwiseConv2dNCHW's
    tiles within a group, whole vectors (28x28), the last pixel tile clamped (14x14: 49 vectors of 4 lanes), and
    pixels that are not whole vectors, the channel tiles in parallel (7x7)."""
    from model_factory import make_model
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(36)
    shapes = {"w0": (80, 16), "w1": (64, 20), "w2": (64, 16)}
    inits = [numpy_helper.from_array((rng.standard_normal((*shape, 1, 1)) / 4).astype(np.float32), name)
             for name, shape in shapes.items()]
    inits += [numpy_helper.from_array(rng.standard_normal(80).astype(np.float32), "b0")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], group=4, name="g28"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu"),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2], name="pool0"),
             helper.make_node("Conv", ["p0", "w1"], ["c1"], group=4, name="g14"),
             helper.make_node("MaxPool", ["c1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             helper.make_node("Conv", ["p1", "w2"], ["y"], group=4, name="g7")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 28, 28])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 7, 7])], inits)


def test_mobilenetv2_a_bert_encoder_and_an_int8_model_run_under_qemu(arm64_root, tmp_path):
    """Real architectures for the boards, run by Debian's arm64 Python: MobileNetV2 (width 0.5, 32x32) for
    raspberry-pi/5 and raspberry-pi/4, a BERT encoder (transformers, 2 layers, 16 tokens) and grouped 1x1
    convolutions for raspberry-pi/5, each against onnxruntime on this machine (rel err <= 1e-4 of the output's
    range); a model onnxruntime quantized in its QOperator format (QLinearConv, QLinearAdd, QGemm...) for
    raspberry-pi/5 within one quantization step of onnxruntime; MobileNetV2 quantized by Forge (per channel,
    ``sdot``) against its own x86 build on this machine (SQNR >= 40 dB where the kernels round differently, and
    the same class)."""
    import onnx
    from hf_models import ARCHITECTURES
    from model_factory import export_torch
    from test_onnx_qoperator import _assert_steps, _quantized_net

    serialized, _ = _small_mobilenetv2()
    mobilenet = onnx.load_from_string(serialized)
    arch = ARCHITECTURES["bert"]
    names = list(arch.input_names)
    bert = export_torch(arch.build(seed=35), arch.inputs(batch=1, length=16, seed=0), names)
    rng = np.random.default_rng(35)
    images = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(6)]
    tokens = {n: t.numpy() for n, t in zip(names, arch.inputs(batch=1, length=16, seed=1), strict=True)}
    grouped = _grouped_pointwise()
    qoperator = _quantized_net(tmp_path, True, "QUInt8")
    maps = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    small = rng.standard_normal((1, 3, 18, 18)).astype(np.float32)
    feeds = {"image": images[5], **{f"bert_{n}": v for n, v in tokens.items()}, "maps": maps, "small": small}
    quantized = forge.from_onnx(mobilenet)
    quantized.calibrate(images[:4])
    quantized.quantize(per_channel=True)
    quantized.compile(output_path=tmp_path / "int8-x86")  # this machine's build: the int8 reference
    cases = {"mobilenetv2_pi5": (mobilenet, "raspberry-pi/5", ["image"]),
             "mobilenetv2_pi4": (mobilenet, "raspberry-pi/4", ["image"]),
             "bert_pi5": (bert, "raspberry-pi/5", [f"bert_{n}" for n in names]),
             "mobilenetv2_int8_pi5": (quantized, "raspberry-pi/5", ["image"]),
             "grouped_pi5": (grouped, "raspberry-pi/5", ["maps"]),
             "qoperator_pi5": (qoperator, "raspberry-pi/5", ["small"])}
    plan = {}
    for name, (source, tag, inputs) in cases.items():
        ir = source if isinstance(source, forge.IRModule) else forge.from_onnx(source)
        ir.compile(target=tag, output_path=tmp_path / name)
        plan[name] = (str(tmp_path / name), inputs)
    forge.bundle(tmp_path / "mobilenetv2_pi5", "linux-aarch64", tmp_path / "bundle")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    np.savez(tmp_path / "inputs.npz", **feeds)
    (tmp_path / "runner.py").write_text(_MODELS_RUNNER)
    outputs = run_under_qemu(arm64_root, tmp_path, tmp_path / "bundle", tmp_path / "plan.json",
                             tmp_path / "inputs.npz")

    def onnxruntime(model: onnx.ModelProto, given: dict[str, np.ndarray]) -> list[np.ndarray]:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, given)

    wants = {"mobilenetv2_pi5": onnxruntime(mobilenet, {"x": images[5]}),
             "mobilenetv2_pi4": onnxruntime(mobilenet, {"x": images[5]}),
             "bert_pi5": onnxruntime(bert, tokens),
             "grouped_pi5": onnxruntime(grouped, {"x": maps})}
    last = next(n for n in reversed(qoperator.graph.node) if n.op_type == "DequantizeLinear")
    step = float(onnx.numpy_helper.to_array(next(i for i in qoperator.graph.initializer if i.name == last.input[1])))
    _assert_steps([outputs["qoperator_pi5/0"]], onnxruntime(qoperator, {"x": small}), [step])
    for name, want in wants.items():
        for index, expected in enumerate(want):
            got = outputs[f"{name}/{index}"]
            scale = float(np.abs(expected).max())
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * scale, err_msg=f"{name} output {index}")
    reference = forge.Runtime(tmp_path / "int8-x86").infer(images[5])[0]
    got = outputs["mobilenetv2_int8_pi5/0"]
    noise = float(np.sum((got - reference) ** 2))
    sqnr = 10 * np.log10(float(np.sum(reference ** 2)) / noise) if noise else np.inf
    assert sqnr >= 40, f"int8 MobileNetV2 on raspberry-pi/5 against this machine's build: SQNR {sqnr:.1f} dB"
    assert got.argmax() == reference.argmax()
