"""The runtime under load: one Runtime shared by threads, and many runtimes loaded and dropped.

TVM's virtual machine is not re-entrant (eight threads in one VM fail with
``Mismatched type on argument #0`` or mix tensors), TVM starts a worker pool
in every thread that runs a kernel and never stops it, and
``tvm.runtime.load_module`` never unloads a library. These tests hold
Forge's answers to the three (see ``forge_core/runtime/vm_threads.py`` and
``library_file._load_shared_library``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net, make_model
from onnx import TensorProto, helper, numpy_helper

import forge
from forge_core.runtime import Runtime

CHURN = Path(__file__).with_name("runtime_churn.py")
PASSWORD = "churn-password-1"


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_names() -> list[str]:
    """Every OS thread of this process, by name (for a failure's message)."""
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:  # it exited meanwhile
            pass
    return names


def os_threads_settled(at_most: int, seconds: float = 5.0) -> int:
    """The OS thread count, given the threads just joined time to leave the kernel's list.

    ``Thread.join()`` returns when the thread's Python state is released, a moment before the OS thread
    exits: counted at once, one of them could still be listed (seen once in 869 tests).
    """
    deadline = time.monotonic() + seconds
    while (count := os_threads()) > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def call_from_threads(function, inputs: list[np.ndarray], threads: int = 8, calls: int = 24) -> list[tuple]:
    """Each thread calls ``function`` on ``calls`` of the inputs, all starting together: ``[(index, output)]``."""
    barrier = threading.Barrier(threads)
    results: list[tuple] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        barrier.wait()
        try:
            for r in range(calls):
                index = (k * 5 + r) % len(inputs)
                results.append((index, function(inputs[index])))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors[:3]
    assert len(results) == threads * calls
    return results


@pytest.fixture(scope="module")
def conv_net(tmp_path_factory):
    model = conv_bn_net(seed=3, batch=1, channels=16)
    out = tmp_path_factory.mktemp("threads") / "artifact"
    forge.from_onnx(model).compile(output_path=str(out), opt_level=3)
    rng = np.random.default_rng(7)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(12)]
    return model, out, inputs


def test_one_runtime_shared_by_eight_threads_gives_one_threads_results(conv_net):
    model, out, inputs = conv_net
    runtime = Runtime(out)
    alone = [runtime.infer(x)[0] for x in inputs]
    name = model.graph.input[0].name
    for x, got in zip(inputs, alone):
        np.testing.assert_allclose(got, onnxruntime_outputs(model, {name: x})[0], rtol=1e-4, atol=1e-5)
    for index, (output,) in call_from_threads(runtime.infer, inputs):
        np.testing.assert_array_equal(output, alone[index])


def test_threads_that_come_and_go_leave_no_tvm_workers_behind(conv_net):
    """Each thread that ran a kernel used to keep its TVM pool's workers: 2 OS threads each, for ever."""
    _, out, inputs = conv_net
    runtime = Runtime(out)
    runtime.infer(inputs[0])
    call_from_threads(runtime.infer, inputs, threads=8, calls=2)  # the inference thread starts once
    settled = os_threads()
    for _ in range(4):
        call_from_threads(runtime.infer, inputs, threads=8, calls=2)
    assert os_threads_settled(settled) <= settled, (settled, thread_names())


def test_main_thread_and_other_threads_run_the_model_at_once(conv_net):
    """The main thread calls while 4 threads call: every output stays exact."""
    _, out, inputs = conv_net
    runtime = Runtime(out)
    alone = [runtime.infer(x)[0] for x in inputs]
    from_threads: list = []
    background = threading.Thread(
        target=lambda: from_threads.extend(call_from_threads(runtime.infer, inputs, threads=4, calls=30)))
    background.start()
    mismatches, count = [], 0
    while background.is_alive() or count < 20:
        index = count % len(inputs)
        if not np.array_equal(runtime.infer(inputs[index])[0], alone[index]):
            mismatches.append(index)
        count += 1
    background.join()
    assert not mismatches
    assert len(from_threads) == 4 * 30  # an error or a short count in the threads fails here
    for index, (output,) in from_threads:
        np.testing.assert_array_equal(output, alone[index])


def test_an_inference_function_is_shared_by_threads_as_well(conv_net):
    model, _, inputs = conv_net
    function = forge.from_onnx(model).get_inference_function()
    alone = [function(x) for x in inputs]
    for index, output in call_from_threads(function, inputs):
        np.testing.assert_array_equal(output, alone[index])


def test_a_runtime_made_in_a_thread_runs_in_the_main_thread(conv_net):
    _, out, inputs = conv_net
    made: list[Runtime] = []
    maker = threading.Thread(target=lambda: made.append(Runtime(out)))
    maker.start()
    maker.join()
    np.testing.assert_array_equal(made[0].infer(inputs[0])[0], Runtime(out).infer(inputs[0])[0])


def _tiny_artifacts(directory: Path, count: int) -> list[dict]:
    """``count`` different artifacts (a MatMul of another width and weights each, Relu), every opt_level,
    every fifth encrypted; each checked against onnxruntime, its exact output recorded."""
    rng = np.random.default_rng(11)
    artifacts = []
    for k in range(count):
        width = 4 + k
        weight = numpy_helper.from_array(rng.standard_normal((width, 3)).astype(np.float32), "w")
        model = make_model(
            [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, width])],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], [weight])
        out = directory / f"artifact_{k}"
        encrypted = k % 5 == 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            forge.from_onnx(model).compile(output_path=str(out), opt_level=k % 4,
                                           **({"encrypt_password": PASSWORD} if encrypted else {}))
        x = rng.standard_normal((2, width)).astype(np.float32)
        key = {"key": str(out / "modelKey.bin"), "password": PASSWORD} if encrypted else {}
        (got,) = Runtime(out, key.get("key"), key.get("password")).infer(x)
        np.testing.assert_allclose(got, onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
        np.save(out / "x.npy", x)
        np.save(out / "y.npy", got)
        artifacts.append({"library": str(out), "input": str(out / "x.npy"), "expected": str(out / "y.npy")} | key)
    return artifacts


def test_fifty_runtimes_loaded_and_dropped_leak_nothing(tmp_path):
    """150 loads of 50 artifacts in a fresh process: no descriptor, thread, mapping or temporary file is
    left, and the resident size stays put after the first round.

    Measured: 0.1 MiB from the first round's end to the third's (100 loads). Before Forge loaded libraries
    without TVM's process-wide keep-alive list, each load kept 4 mappings and 26 KiB (1.3 MiB a round)."""
    artifacts = _tiny_artifacts(tmp_path, 50)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"artifacts": artifacts, "rounds": 3}))
    temporary = tmp_path / "tmpdir"
    temporary.mkdir()
    done = subprocess.run([sys.executable, str(CHURN), str(plan)], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"TMPDIR": str(temporary)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print({"before": report["before"], "rounds": report["rounds"]})
    assert report["loads"] == 150 and not report["mismatches"], report["mismatches"]
    before, rounds = report["before"], report["rounds"]
    for sample in rounds:
        assert sample["fds"] == before["fds"], (before, sample)
        assert sample["tmp_files"] == [], sample["tmp_files"]
        assert sample["library_mappings"] == 0, sample
        assert sample["threads"] <= rounds[0]["threads"], (rounds[0], sample)
    growth_kib = rounds[-1]["rss_kib"] - rounds[0]["rss_kib"]
    assert growth_kib < 1024, f"resident size grew {growth_kib} KiB over 100 loads after the first round"


def test_a_one_thread_runtime_leaves_the_process_on_every_core(conv_net):
    """TVM pins a one-thread pool's calling thread to core 0 for good: several FORGE_NUM_THREADS=1 processes
    then share one core. Forge leaves threads unpinned unless TVM_BIND_THREADS=1 asks."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives the process one core: nothing to lose")
    _, artifact, _ = conv_net
    script = (
        "import os, sys, numpy as np\n"
        "from forge_core.runtime import Runtime\n"
        "before = sorted(os.sched_getaffinity(0))\n"
        "runtime = Runtime(sys.argv[1])\n"
        "runtime.infer(np.zeros(runtime.input_shapes[0], runtime.input_dtypes[0]))\n"
        "print(before == sorted(os.sched_getaffinity(0)), before, sorted(os.sched_getaffinity(0)))\n")
    env = {k: v for k, v in os.environ.items() if k != "TVM_BIND_THREADS"}
    result = subprocess.run([sys.executable, "-c", script, str(artifact)], capture_output=True,
                            text=True, env={**env, "FORGE_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("True"), result.stdout


def test_forge_runtime_runs_where_tvm_loaded_its_runtime_library_alone(conv_net, tmp_path):
    """``import forge; forge.Runtime(...)`` with ``TVM_USE_RUNTIME_LIB=1`` (as on a board without the 260 MB
    compiler library): the facade imports its compiler side only when it is used, the compiler library is never
    mapped, the numbers are this process's, and the compiler side says what it needs."""
    model, artifact, inputs = conv_net
    np.save(tmp_path / "x.npy", inputs[0])
    script = (
        "import json, sys, time\n"
        "started = time.perf_counter()\n"
        "import numpy as np\n"
        "import forge\n"
        "imported = time.perf_counter() - started\n"
        "y = forge.Runtime(sys.argv[1]).infer(np.load(sys.argv[2]))[0]\n"
        "np.save(sys.argv[3], y)\n"
        "try:\n"
        "    forge.from_onnx\n"
        "    refusal = None\n"
        "except forge.ForgeError as exc:\n"
        "    refusal = str(exc)\n"
        "maps = open('/proc/self/maps').read()\n"
        "rss = int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) // 1024\n"
        "print(json.dumps({'compiler': 'libtvm_compiler' in maps, 'refusal': refusal, 'import_s': imported,"
        " 'rss_mb': rss}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TVM_")}
    done = subprocess.run([sys.executable, "-c", script, str(artifact), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True,
                          env={**env, "TVM_USE_RUNTIME_LIB": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["compiler"] is False
    assert "forge.from_onnx needs TVM's compiler library" in report["refusal"]
    assert "TVM_USE_RUNTIME_LIB" in report["refusal"]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), forge.Runtime(artifact).infer(inputs[0])[0])


def _masked_rows() -> onnx.ModelProto:
    """``where(keep, x * 2, -x)`` and ``keep`` itself, over a dynamic row count: bool in and out."""
    graph = helper.make_graph([
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Neg", ["x"], ["negated"]),
        helper.make_node("Where", ["keep", "doubled", "negated"], ["y"]),
        helper.make_node("Not", ["keep"], ["dropped"]),
    ], "masked_rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
                       helper.make_tensor_value_info("keep", TensorProto.BOOL, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("dropped", TensorProto.BOOL, ["n", 3])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_bool_and_empty_tensors_cross_the_light_runtime_without_tvms_python(tmp_path):
    """With TVM's runtime library alone: a bool input and output, and a batch of no rows, go through TVM's
    runtime functions (not ``tvm.runtime.tensor``, which imported TVM's Python package: +0.23 s), and the
    numbers are onnxruntime's."""
    from artifacts import run_in_fresh_process

    model = _masked_rows()
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact")
    rng = np.random.default_rng(12)
    for rows in (5, 0):
        feeds = {"x": rng.standard_normal((rows, 3)).astype(np.float32), "keep": rng.random((rows, 3)) < 0.5}
        workdir = tmp_path / f"rows{rows}"
        workdir.mkdir()
        outputs, report = run_in_fresh_process(tmp_path / "artifact", [feeds["x"], feeds["keep"]], workdir,
                                               runtime_only=True)
        assert not report["compiler_loaded"] and not report["tvm_imported"], report
        for got, want in zip(outputs, onnxruntime_outputs(model, feeds), strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
            np.testing.assert_array_equal(got, want)


def test_tensors_copied_by_tvms_runtime_functions_keep_their_elements():
    """The copies that a GPU's tensors take (``outputs._copied_in`` / ``_copied_out``: TVM's runtime library copies
    them from any device), checked on the CPU for every dtype the runtime moves that way."""
    import tvm_ffi

    from forge_core.runtime.outputs import _copied_in, _copied_out

    rng = np.random.default_rng(3)
    cpu = tvm_ffi.device("cpu", 0)
    cases = [rng.random((4, 5)) < 0.5, np.zeros((0, 7), np.float32),
             rng.standard_normal((3, 1, 5)).astype(np.float16),
             np.asfortranarray(rng.integers(-9, 9, (6, 4)).astype(np.int64)), np.array(3.5, np.float32)]
    for array in cases:
        tensor = _copied_in(array, cpu)
        assert tuple(tensor.shape) == array.shape and str(tensor.dtype) == str(array.dtype)
        back = _copied_out(tensor)
        assert back.dtype == array.dtype and back.shape == array.shape
        np.testing.assert_array_equal(back, array)
