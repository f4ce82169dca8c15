"""Remote boards through TVM's RPC tracker, all on this machine's loopback.

A real tracker and real RPC servers run as subprocesses (``tests/rpc_farm.py``);
this machine's CPU stands in for the boards. Every process a test starts is
killed when its farm closes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net, make_model
from onnx import TensorProto, helper, numpy_helper
from rpc_farm import RPCFarm, free_port

import forge
from forge_core.tuning import runners
from forge_core.tuning.database import RECORDS, check_written
from forge_core.tuning.session import tune_module

FORGE = shutil.which("forge", path=os.path.dirname(sys.executable)) or "forge"
KEY = "loopback-board"


@pytest.fixture(scope="module")
def farm():
    with RPCFarm() as farm:
        farm.add_server(KEY)
        farm.add_server(KEY)
        yield farm


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A light model compiled for this machine, its local outputs, and onnxruntime's."""
    model = conv_bn_net(seed=31)
    directory = tmp_path_factory.mktemp("remote")
    forge.from_onnx(model).compile(output_path=directory / "artifact")
    x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: x})
    return directory / "artifact", x, forge.Runtime(directory / "artifact").infer(x), reference


def small_dense(seed: int = 0) -> onnx.ModelProto:
    """MatMul, bias and ReLU (one tuning task), random weights."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((96, 80)).astype(np.float32) * 0.1, "w")
    bias = numpy_helper.from_array(rng.standard_normal(80).astype(np.float32), "b")
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 80])], [weight, bias])


def forge_cli(*args, timeout=300):
    return subprocess.run([FORGE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


# -- running remotely -----------------------------------------------------------


def test_a_light_model_runs_on_a_remote_device_as_it_runs_here(farm, artifact):
    path, x, local, reference = artifact
    with forge.Runtime.remote(path, farm.tracker, KEY) as remote:
        assert remote.input_names == forge.Runtime(path).input_names and remote.uuid == forge.Runtime(path).uuid
        outputs = remote.infer(x)
        for got, here, expected in zip(outputs, local, reference):
            np.testing.assert_array_equal(got, here)  # the same library on the same CPU: the same bits
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        latencies = remote.latencies(x, repeat=7)
        assert latencies.shape == (7,) and np.all(latencies > 0) and np.all(np.isfinite(latencies))
        rows = remote.profile(x, repeat=3)  # forge rpc-server times each function on the device
    kernels = [row for row in rows if row.rule is not None]
    assert kernels and any(row.rule == "Conv2dNCHW" for row in kernels)
    assert abs(sum(row.share for row in rows) - 1) < 1e-6 and all(row.total_ms >= 0 for row in rows)


def test_forge_run_on_a_remote_device(farm, artifact, tmp_path):
    path, x, local, _ = artifact
    np.save(tmp_path / "x.npy", x)
    done = forge_cli("run", path, "--input", tmp_path / "x.npy", "--repeat", 5, "--json", "--save-outputs",
                     tmp_path / "out", "--rpc-tracker", farm.tracker, "--rpc-key", KEY)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["remote"] == {"tracker": farm.tracker, "key": KEY} and report["latency_ms"]["runs"] == 5
    assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "output_0.npy"), local[0])

    done = forge_cli("run", path, "--repeat", 3, "--profile", "--rpc-tracker", farm.tracker, "--rpc-key", KEY)
    assert done.returncode == 0, done.stderr
    assert f"of a device of key {KEY!r}" in done.stdout and "Conv2dNCHW" in done.stdout


def test_tvms_own_server_runs_the_model_and_says_what_profiling_needs(farm, artifact):
    path, x, local, _ = artifact
    server = farm.add_server("tvm-board", forge=False)
    try:
        with forge.Runtime.remote(path, farm.tracker, "tvm-board") as remote:
            np.testing.assert_array_equal(remote.infer(x)[0], local[0])
            assert remote.latencies(x, repeat=3).shape == (3,)
            with pytest.raises(forge.RemoteDeviceError, match="forge rpc-server --tracker"):
                remote.profile(x)
    finally:
        server.kill()


def test_a_key_without_devices_fails_at_once_naming_the_keys_there_are(farm, artifact):
    started = time.monotonic()
    with pytest.raises(forge.RemoteDeviceError, match=f"no device of key 'rpi5'.*{KEY}"):
        forge.Runtime.remote(artifact[0], farm.tracker, "rpi5")
    assert time.monotonic() - started < 10


def test_encrypted_artifacts_are_refused_before_anything_is_sent(farm, tmp_path):
    forge.from_onnx(conv_bn_net(seed=3, channels=4)).compile(output_path=tmp_path / "sealed",
                                                             encrypt_password="a long passphrase 42")
    with pytest.raises(forge.ForgeError, match="encrypted artifacts do not run through RPC"):
        forge.Runtime.remote(tmp_path / "sealed", farm.tracker, KEY)
    done = forge_cli("run", tmp_path / "sealed", "--key", tmp_path / "sealed" / "modelKey.bin",
                     "--rpc-tracker", farm.tracker, "--rpc-key", KEY)
    assert done.returncode == 1 and "encrypted artifacts do not run through RPC" in done.stderr


# -- the tracker out of reach ---------------------------------------------------------


def test_an_unreachable_tracker_is_a_clear_error_within_the_timeout(artifact):
    refused = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(forge.TrackerUnreachableError, match=f"127.0.0.1:{refused}: connection refused"):
        forge.Runtime.remote(artifact[0], f"127.0.0.1:{refused}", KEY, timeout=3)
    assert time.monotonic() - started < 3

    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(forge.TrackerUnreachableError, match="no answer within 1.5 s.*--rpc-timeout"):
            forge.Runtime.remote(artifact[0], address, KEY, timeout=1.5)
        assert 1.4 < time.monotonic() - started < 6
        ir = forge.from_onnx(small_dense())
        with pytest.raises(forge.TrackerUnreachableError, match="no answer within 1 s"):
            ir.tune(work_dir=Path(artifact[0]).parent / "never", trials=4, progress=False,
                    rpc={"tracker": address, "key": KEY, "timeout": 1})
        assert not (Path(artifact[0]).parent / "never").exists()
        done = forge_cli("run", artifact[0], "--rpc-tracker", address, "--rpc-key", KEY, "--rpc-timeout", 1)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"forge: error: cannot reach the RPC tracker at {address}: no answer within 1 s. Start one with "
        f"`python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port {address.rsplit(':', 1)[1]}`, or check the "
        "address; Forge waits 1 s for it (--rpc-timeout, or timeout=)."]


@pytest.mark.parametrize("args, message", [
    (["--rpc-key", KEY], "--rpc-key needs --rpc-tracker HOST:PORT"),
    (["--rpc-tracker", "127.0.0.1:9190"], "--rpc-tracker needs --rpc-key"),
    (["--rpc-tracker", "localhost", "--rpc-key", KEY], "must be HOST:PORT"),
    (["--rpc-tracker", "localhost:99999", "--rpc-key", KEY], "port from 1 to 65535, given 'localhost:99999'"),
    (["--rpc-tracker", "127.0.0.1:9190", "--rpc-key", KEY, "--rpc-timeout", "0"], "--rpc-timeout must be"),
])
def test_rpc_options_are_checked_before_any_work(args, message, tmp_path):
    done = forge_cli("run", tmp_path / "absent", *args)
    assert done.returncode == 1 and message in done.stderr, done.stderr


def test_remote_devices_arguments():
    with pytest.raises(forge.InputError, match="tracker and key required"):
        forge.RemoteDevices.of({"tracker": "h:1"})
    with pytest.raises(forge.InputError, match="given devcies, key, tracker"):
        forge.RemoteDevices.of({"tracker": "h:1", "key": "k", "devcies": 2})
    with pytest.raises(forge.InputError, match="devices must be a positive integer"):
        forge.RemoteDevices.of(forge.RemoteDevices("h:1", "k", devices=0))
    assert forge.RemoteDevices.of({"tracker": "h:1", "key": "k"}).timeout == 10.0


# -- tuning on the devices ----------------------------------------------------------


def _records(database: Path) -> int:
    return sum(1 for line in (database / RECORDS).read_text().splitlines() if line.strip())


def test_tuning_measures_candidates_on_both_devices(farm, tmp_path):
    ir = forge.from_onnx(small_dense(seed=1))
    before = [server.sessions() for server in farm.processes[1:3]]
    report = ir.tune(work_dir=tmp_path / "db", trials=8, progress=False,
                     rpc=forge.RemoteDevices(farm.tracker, KEY))
    after = [server.sessions() for server in farm.processes[1:3]]
    assert report.devices == f"2 devices of key {KEY!r} ({farm.tracker})" and report.failed == 0
    assert report.trials == 8 and all(a > b for a, b in zip(after, before)), (before, after)
    assert sum(after) - sum(before) >= 9  # the default schedule, then the 8 candidates: one session each
    assert _records(tmp_path / "db") == report.records >= 9
    x = np.random.default_rng(2).standard_normal((16, 96)).astype(np.float32)
    ir.compile(output_path=tmp_path / "tuned")
    np.testing.assert_allclose(forge.Runtime(tmp_path / "tuned").infer(x)[0], ir.get_inference_function()(x),
                               rtol=1e-5, atol=1e-5)


def test_a_device_lost_mid_tuning_fails_its_candidate_and_tuning_goes_on(tmp_path, monkeypatch):
    # Each measurement lasts a second on the device (a slow board's), so the kill lands inside one.
    monkeypatch.setitem(runners.EVALUATOR, "min_repeat_ms", 1000)
    with RPCFarm() as farm:
        survivor, victim = farm.add_server("pair"), farm.add_server("pair")
        ir = forge.from_onnx(small_dense(seed=2))
        result: dict = {}

        def tune():
            try:
                result["report"] = ir.tune(work_dir=tmp_path / "db", trials=8, progress=False,
                                           rpc={"tracker": farm.tracker, "key": "pair", "session_timeout": 30})
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                result["error"] = exc

        worker = threading.Thread(target=tune)
        worker.start()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the victim measuring a candidate: loaded, not finished
            text = victim.text()
            if text.count("load_module") >= 2 and text.count("load_module") > text.count("finish serving"):
                break
            time.sleep(0.005)
        else:
            pytest.fail("the victim never held a session")
        victim.kill()
        served_by_survivor = survivor.sessions()
        worker.join(600)
        assert not worker.is_alive() and "error" not in result, result.get("error")
        report = result["report"]
        served_after = survivor.sessions()  # the farm's logs go when it closes
    assert report.trials == 8 and report.failed >= 1, report.summary()
    assert "RPCRunner" in report.first_failure and f"{report.failed} candidates failed" in report.summary()
    assert served_after > served_by_survivor  # the rest went to the device still there
    assert _records(tmp_path / "db") == report.records >= 1 + 8 - report.failed
    check_written(tmp_path / "db", report.records, tmp_path / "db")


def test_a_session_stopped_early_keeps_what_it_measured(tmp_path):
    """The database is written as results arrive: Ctrl-C after the first batch keeps that batch."""
    ir = forge.from_onnx(small_dense(seed=3))
    database = tmp_path / "db"
    ir.tune(work_dir=database, trials=0, progress=False)  # the default schedule: one record
    assert _records(database) == 1

    def interrupt(done, total, message):
        if done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune_module(ir, "llvm", work_dir=database, trials=16, progress=interrupt)
    kept = _records(database)
    assert kept >= 2 + 16  # the old record, the default measured again, and the first batch
    check_written(database, kept, database)
    assert [p.name for p in tmp_path.iterdir()] == ["db"]  # no staging copy left beside it


def test_candidates_for_a_board_are_linked_here_for_its_machine(tmp_path):
    """A board needs no compiler: its candidates arrive as shared libraries built for its CPU."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from forge_core.runtime.library_file import elf_machine
    from forge_core.targets.parsing import resolve_target
    from forge_core.tuning.builder import make_builder

    x = tvm.te.placeholder((64,), name="x")
    func = tvm.te.create_prim_func([x, tvm.te.compute((64,), lambda i: x[i] * 2.0, name="y")])
    target = resolve_target("raspberry-pi/5")
    (built,) = make_builder(target, str(tmp_path), remote=True).build(
        [ms.builder.BuilderInput(tvm.IRModule({"main": func}), target)])
    assert built.error_msg is None, built.error_msg
    assert built.artifact_path.endswith(".so") and elf_machine(Path(built.artifact_path).read_bytes()) == "aarch64"


def test_forge_tune_checks_its_rpc_options_and_the_tracker_before_tuning(tmp_path):
    onnx.save(small_dense(), str(tmp_path / "dense.onnx"))
    done = forge_cli("tune", tmp_path / "dense.onnx", "--devices", 2, "--db", tmp_path / "db")
    assert done.returncode == 1 and "--devices needs --rpc-tracker HOST:PORT" in done.stderr, done.stderr
    refused = free_port()
    done = forge_cli("tune", tmp_path / "dense.onnx", "--db", tmp_path / "db", "--trials", 4,
                     "--rpc-tracker", f"127.0.0.1:{refused}", "--rpc-key", KEY, "--rpc-timeout", 2)
    assert done.returncode == 1, done.stderr
    assert f"forge: error: cannot reach the RPC tracker at 127.0.0.1:{refused}: connection refused" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense.onnx"]  # no database begun
