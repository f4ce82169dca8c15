"""Tuning smoke test: a few trials into a database; compiling again applies it with no trials.

Real tuning budgets and the speed they buy are measured in benchmarks/, not here.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess

import numpy as np
import onnx
import pytest
from cpu_features import requires_isa
from model_factory import conv_bn_net

import forge
from forge_core.tuning.database import RECORDS, WORKLOADS


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    ir = forge.from_onnx(conv_bn_net(seed=2, channels=16))
    database = tmp_path_factory.mktemp("tune") / "db"
    report = ir.tune(work_dir=database, trials=4, time_budget=300, progress=False)
    return ir, database, report


def test_tuning_writes_a_database_and_reports(tuned):
    ir, database, report = tuned
    assert (database / WORKLOADS).is_file() and (database / RECORDS).is_file()
    assert report.database == database and len(report.tasks) >= 4
    assert 0 < report.trials <= 8  # one batch of candidates
    assert all(task.default_ms is not None and task.best_ms is not None for task in report.tasks)
    assert all(task.best_ms <= task.default_ms * 1.0001 for task in report.tasks)  # defaults seed the database
    assert "Tuned" in report.summary() and ir.tuning_database == database


def test_compiling_with_the_database_applies_it_and_keeps_the_numbers(tuned, tmp_path, caplog):
    ir, database, _ = tuned
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        ir.compile(output_path=tmp_path / "tuned")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("schedules:"))
    assert "Tuned" in line
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(forge.Runtime(tmp_path / "tuned").infer(x)[0], ir.get_inference_function()(x),
                               rtol=1e-5, atol=1e-5)


def test_a_fresh_module_reuses_the_database(tuned, tmp_path, caplog):
    _, database, _ = tuned
    ir = forge.from_onnx(conv_bn_net(seed=2, channels=16))
    ir.tuning_database = database
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        ir.compile(output_path=tmp_path / "again")
    assert any("Tuned" in r.getMessage() for r in caplog.records)


class _TimingOutBuilder:
    """The real builder, except that the first ``times`` builds of the first default time out (as builds did
    on a loaded CI machine)."""

    def __init__(self, builder, times):
        self.builder, self.times = builder, times

    def build(self, inputs):
        from tvm.s_tir import meta_schedule as ms

        results = list(self.builder.build(inputs))
        if self.times:
            self.times -= 1
            results[0] = ms.builder.BuilderResult(None, "LocalBuilder: Timeout, killed after 30.0 seconds\n")
        return results


@pytest.mark.parametrize("times", [1, 2])
def test_a_default_that_fails_to_build_is_measured_again_then_reported(tmp_path, monkeypatch, caplog, times):
    """A default schedule whose build timed out once is built again and seeds the database (the search had given
    such a task no candidate: no record, on CI); one that fails twice is counted, named and logged."""
    from forge_core.tuning import session

    make_builder = session.make_builder
    monkeypatch.setattr(session, "make_builder", lambda *a: _TimingOutBuilder(make_builder(*a), times))
    ir = forge.from_onnx(conv_bn_net(seed=2, channels=8))
    with caplog.at_level(logging.WARNING, logger="forge"):
        report = ir.tune(work_dir=tmp_path / "db", trials=0, progress=False)
    failed = [task for task in report.tasks if task.default_ms is None]
    if times == 1:
        assert not failed and report.failed == 0 and report.records == len(report.tasks)
        assert not [r for r in caplog.records if "failed to build or run" in r.getMessage()]
    else:
        assert len(failed) == 1 and report.failed == 1 and "Timeout" in report.first_failure
        assert "1 candidates failed" in report.summary() and report.records == len(report.tasks) - 1
        (warning,) = [r.getMessage() for r in caplog.records if "failed to build or run" in r.getMessage()]
        assert failed[0].name in warning and "Timeout" in warning


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=x86-64-v3 -num-cores=2"])
def test_tuning_a_quantized_model_keeps_onnxruntimes_int8_numbers(tmp_path, caplog, monkeypatch, target):
    """onnxruntime's QDQ model of a conv net: its integer kernels (the integer rules' schedules seed the
    database: VNNI's, or AVX2's vpmaddwd with weights held as int16) are tuned and compiled from the database,
    and the output is still onnxruntime's int8 output."""
    from cpu_features import can_run
    from model_factory import onnxruntime_int8_references, onnxruntime_quantized

    from forge_core.targets.parsing import resolve_target

    if not can_run(resolve_target(target)):
        pytest.skip(f"tuning measures candidates on this CPU, which cannot run {target} code")
    rng = np.random.default_rng(3)
    samples = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(5)]
    path = onnxruntime_quantized(conv_bn_net(seed=2, channels=16), samples[:4], tmp_path, "QUInt8")
    monkeypatch.setenv("FORGE_INT8_LOWERING", "integer")  # integer kernels on any CPU (without AVX2: float32 else)
    ir = forge.from_onnx(path)
    report = ir.tune(target=target, work_dir=tmp_path / "db", trials=4, time_budget=300, progress=False)
    assert report.tasks and all(task.best_ms is not None for task in report.tasks), report.summary()
    with caplog.at_level(logging.INFO, logger="forge"):
        ir.compile(target=target, output_path=str(tmp_path / "q"))
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("integer lowering: ") and "0 quantized" not in m for m in messages), messages
    assert any(m.startswith("schedules: Tuned") for m in messages), messages
    x = samples[4]["x"]
    got = forge.Runtime(str(tmp_path / "q")).infer(x)[0]
    for expected in onnxruntime_int8_references(path, {"x": x}):  # exact on this CPU (no saturating kernel)
        assert (got == expected).mean() >= 0.99 and np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()


X86_INTRINSICS = [("dot_16x4_vnni", "znver4"), ("dot_16x4_avx512", "skylake-avx512")]


def _tensorized_dot(intrinsic: str, mcpu: str):
    """A uint8 x int8 -> int32 dot tensorized with ``intrinsic`` as the search does, built for ``mcpu``."""
    import tvm
    from tvm import s_tir
    from tvm.script import tirx as T

    from forge_core.tuning.intrinsics import cpu_tensor_intrinsics

    @T.prim_func(s_tir=True)
    def dot(a: T.Buffer((8, 64), "uint8"), b: T.Buffer((2, 16, 16, 4), "int8"),
            c: T.Buffer((8, 32), "int32")) -> None:
        # b packed as the search's layout rewrite packs it: [N/16, K/4, 16, 4]
        for i, j, k in T.grid(8, 32, 64):
            with T.sblock("dot"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    c[vi, vj] = 0
                c[vi, vj] = c[vi, vj] + T.cast(a[vi, vk], "int32") * T.cast(b[vj // 16, vk // 4, vj % 16, vk % 4],
                                                                           "int32")

    sch = s_tir.Schedule(dot)
    block = sch.get_sblock("dot")
    i, j, k = sch.get_loops(block)
    j_outer, j_inner = sch.split(j, [None, 16])
    k_outer, k_inner = sch.split(k, [None, 4])
    sch.reorder(i, j_outer, k_outer, j_inner, k_inner)
    sch.decompose_reduction(block, k_outer)
    with cpu_tensor_intrinsics():
        sch.tensorize(j_inner, intrinsic)
        return tvm.compile(sch.mod, target=tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))


@pytest.mark.parametrize("intrinsic,mcpu", X86_INTRINSICS)
def test_tvms_x86_intrinsics_the_search_tensorizes_with_compile_to_exact_dot_products(intrinsic, mcpu):
    """Compiled only, on any host: ``dot_16x4_vnni`` becomes ``vpdpbusd`` on zmm (Forge's exact dot product),
    ``dot_16x4_avx512`` exact int32 multiply-adds; neither the saturating ``vpmaddubsw``."""
    asm = _tensorized_dot(intrinsic, mcpu).mod.inspect_source("asm")
    assert "vpmaddubsw" not in asm
    dots = [line for line in asm.splitlines() if "vpdpbusd" in line]
    if intrinsic == "dot_16x4_vnni":
        assert dots and all("zmm" in line for line in dots), dots[:3]
    else:
        assert not dots and ("vpmaddwd" in asm or "vpmulld" in asm)  # bytes widened: products exact in int32


@requires_isa("avx512f", "avx512bw", "avx512vl", "avx512_vnni", why="to run the tensorized dot products on")
@pytest.mark.parametrize("intrinsic,mcpu", X86_INTRINSICS)
def test_tvms_x86_intrinsics_the_search_tensorizes_with_are_exact_on_full_range_bytes(intrinsic, mcpu):
    """MetaSchedule's x86 design spaces tensorize uint8 x int8 blocks with TVM's ``dot_16x4_vnni`` (which LLVM
    22 rejects) and ``dot_16x4_avx512`` (``pmaddubsw``, which saturates): within the search, and when records are
    applied, both names compute exactly. Run where this CPU has AVX-512 VNNI."""
    import tvm

    kernel = _tensorized_dot(intrinsic, mcpu)
    rng = np.random.default_rng(0)
    a = np.full((8, 64), 255, np.uint8)  # pmaddubsw's worst case: 255 * 127 + 255 * 127 > 32767
    a[4:] = rng.integers(0, 256, (4, 64))
    b = np.where(rng.random((32, 64)) < 0.5, 127, -128).astype(np.int8)
    c = tvm.runtime.tensor(np.zeros((8, 32), np.int32))
    packed = b.reshape(2, 16, 16, 4).transpose(0, 2, 1, 3).copy()
    kernel(tvm.runtime.tensor(a), tvm.runtime.tensor(packed), c)
    np.testing.assert_array_equal(c.numpy(), a.astype(np.int64) @ b.astype(np.int64).T)


def test_time_budget_and_argument_errors(tmp_path):
    ir = forge.from_onnx(conv_bn_net(seed=2))
    with pytest.raises(ValueError, match="trials must be a non-negative integer"):
        ir.tune(work_dir=tmp_path / "a", trials=-1, progress=False)
    with pytest.raises(ValueError, match="time_budget must be a positive"):
        ir.tune(work_dir=tmp_path / "a", time_budget=0, progress=False)
    with pytest.raises(forge.ForgeError, match="tunes CPU"):
        ir.tune(target="cuda", work_dir=tmp_path / "a", progress=False)
    ir.tuning_database = tmp_path / "missing"
    with pytest.raises(forge.ForgeError, match="holds no tuning database"):
        ir.compile(output_path=tmp_path / "out")


def test_the_time_budget_keeps_every_batch_already_measured(tmp_path):
    # MetaSchedule builds one batch per task before it collects any; the budget is
    # checked when the first is collected. The others must still reach the database.
    ir = forge.from_onnx(conv_bn_net(seed=4, channels=8))
    database = tmp_path / "db"
    report = ir.tune(work_dir=database, trials=64, time_budget=0.5, progress=False)
    assert report.stopped_by_time
    per_workload: dict[int, int] = {}
    for line in (database / RECORDS).read_text().splitlines():
        index = json.loads(line)[0]
        per_workload[index] = per_workload.get(index, 0) + 1
    tasks = len((database / WORKLOADS).read_text().splitlines())
    assert len(per_workload) == tasks >= 2
    # A default record per task, plus the measured batches: not only the one batch
    # MetaSchedule collected itself (a task whose few schedules are all measured
    # already sends none).
    measured = [index for index, count in per_workload.items() if count >= 2]
    assert len(measured) >= 2, per_workload
    assert report.trials > 32


def test_a_missing_search_package_names_the_extra(tmp_path, monkeypatch):
    from forge_core.tuning import session

    monkeypatch.setattr(session, "_SEARCH_PACKAGES", ("psutil", "forge_no_such_package"))
    ir = forge.from_onnx(conv_bn_net(seed=2))
    with pytest.raises(forge.ForgeError, match=r"forge_no_such_package .*pip install 'forge-core\[tune\]'"):
        ir.tune(work_dir=tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()


def test_forge_tune_command(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_net(seed=5), str(path))
    forge_bin = os.path.join(os.path.dirname(os.sys.executable), "forge")
    done = subprocess.run([forge_bin, "tune", str(path), "--db", str(tmp_path / "db"), "--trials", "2",
                           "--minutes", "5"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Tuned" in done.stdout and "--tuning-db" in done.stdout
    done = subprocess.run([forge_bin, "compile", str(path), "-o", str(tmp_path / "out"), "--tuning-db",
                           str(tmp_path / "db"), "--export-metadata"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "model_metadata.json").read_text())["opt_level"] == 3


@requires_isa("avx2", "fma", why="to measure AVX2 (x86-64-v3) candidates")
def test_a_rule_that_rebuilds_its_function_keeps_its_schedule_through_tuning(tmp_path, caplog):
    """PaddedPointwiseConv2dNCHW rebuilds a 1x1 convolution on a 7x7 map: its schedule's trace cannot replay on the
    task's function, so the task is not tuned (a tuned record, measured against no default, had replaced it: 7x
    slower), while the 3x3 convolution after it is."""
    from onnx import TensorProto, helper, numpy_helper
    from model_factory import make_model

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((40, 256, 1, 1)) / 16).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((16, 40, 3, 3)) / 19).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="pointwise"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv3x3", pads=[1, 1, 1, 1])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 7, 7])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 7, 7])], inits)
    target = "llvm -mcpu=x86-64-v3 -num-cores=2"
    ir = forge.from_onnx(model)
    with caplog.at_level(logging.INFO, logger="forge.tune"):
        report = ir.tune(target, work_dir=tmp_path / "db", trials=4, time_budget=300, progress=False)
    assert any("keep Forge's default schedule" in r.getMessage() and "fused_conv2d_add_relu" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert [task.name for task in report.tasks] == ["conv2d1"], report.tasks
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        ir.compile(output_path=tmp_path / "tuned", target=target)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("schedules:"))
    assert "PaddedPointwiseConv2dNCHW 1" in line and "Tuned 1" in line, line
    x = rng.standard_normal((1, 256, 7, 7)).astype(np.float32)
    expected = onnxruntime_run(model, x)
    np.testing.assert_allclose(forge.Runtime(tmp_path / "tuned").infer(x)[0], expected, rtol=1e-4, atol=1e-4)


def onnxruntime_run(model, x):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
