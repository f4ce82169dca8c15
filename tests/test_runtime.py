"""The light runtime: loading, running, metadata, errors, and two libraries in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from model_factory import conv_bn_net, make_model, two_io_net
from onnx import TensorProto, helper, numpy_helper

import forge
from forge_core.runtime import Runtime
from forge_core.runtime.profiling import fallback_share, format_profile

X = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    ir = forge.from_onnx(conv_bn_net(seed=21))
    out = tmp_path_factory.mktemp("rt") / "artifact"
    ir.compile(output_path=out, uuid="00000000-0000-4000-8000-000000000001")
    return ir, out


def test_infer_and_call(compiled):
    ir, out = compiled
    runtime = Runtime(out)
    expected = ir.get_inference_function()(X)
    (y,) = runtime.infer(X)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(runtime(X)[0], y)


def test_library_path_or_directory(compiled):
    _, out = compiled
    assert Runtime(out / "model_library.so").uuid == Runtime(out).uuid


def test_introspection(compiled):
    _, out = compiled
    runtime = Runtime(out)
    assert runtime.uuid == "00000000-0000-4000-8000-000000000001"
    assert runtime.input_names == ["x"] and runtime.input_shapes == [(1, 3, 16, 16)]
    assert runtime.input_dtypes == ["float32"]
    assert runtime.output_shapes == [(1, 10)] and runtime.output_dtypes == ["float32"]
    assert runtime.device_type == "cpu"
    meta = runtime.get_metadata()
    assert meta["uuid"] == runtime.uuid and len(meta["library"]["sha256"]) == 64
    meta["uuid"] = "changed"
    assert runtime.get_metadata()["uuid"] == runtime.uuid  # a copy


def test_warm_up(compiled):
    _, out = compiled
    runtime = Runtime(out)
    runtime.warm_up(3)
    runtime.warm_up(0)
    with pytest.raises(ValueError, match="non-negative"):
        runtime.warm_up(-1)


def test_warm_up_runs_the_inputs_given(compiled, monkeypatch):
    """``forge run --input`` warms up on its inputs: the random ones set a dynamic dim to 1, which a detector
    whose sizes must be multiples of its stride refuses (``forge run dbnet --input x.npy`` failed so)."""
    _, out = compiled
    runtime = Runtime(out)
    given = [np.full(shape, 0.5, dtype) for shape, dtype in zip(runtime.input_shapes, runtime.input_dtypes)]
    seen: list[list[np.ndarray]] = []
    monkeypatch.setattr(runtime, "infer", lambda *arrays: seen.append(list(arrays)))
    runtime.warm_up(2, given)
    assert len(seen) == 2 and all(a is b for run in seen for a, b in zip(run, given))


def test_uses_every_core_unless_told(compiled, monkeypatch):
    _, out = compiled
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("FORGE_NUM_THREADS", raising=False)
    assert Runtime(out).num_threads == len(os.sched_getaffinity(0))
    monkeypatch.setenv("FORGE_NUM_THREADS", "1")
    assert Runtime(out).num_threads == 1


@pytest.mark.parametrize(
    "inputs, message",
    [
        ((), r"takes 1 input \('x'\); 0 were given"),
        ((X.astype(np.float64),), r"Input 'x' \(#0\): expected dtype float32, given float64"),
        ((X[:, :2],), r"Input 'x' \(#0\): expected shape \(1, 3, 16, 16\), given \(1, 2, 16, 16\)"),
        ((X, X), r"takes 1 input \('x'\); 2 were given"),
    ],
)
def test_wrong_inputs(compiled, inputs, message):
    _, out = compiled
    with pytest.raises(forge.InputError, match=message):
        Runtime(out).infer(*inputs)


def test_missing_library(tmp_path):
    with pytest.raises(FileNotFoundError, match="No compiled library"):
        Runtime(tmp_path / "nothing")


def test_not_a_forge_library(tmp_path):
    fake = tmp_path / "model_library.so"
    fake.write_bytes(b"\x7fELF" + os.urandom(256))
    with pytest.raises(forge.ForgeError, match="not a Forge library"):
        Runtime(fake)


def test_two_libraries_live_in_one_process(tmp_path):
    a = forge.from_onnx(conv_bn_net(seed=1))
    b = forge.from_onnx(two_io_net(seed=2))
    a.compile(output_path=tmp_path / "a")
    b.compile(output_path=tmp_path / "b")
    ra, rb = Runtime(tmp_path / "a"), Runtime(tmp_path / "b")
    ids = np.array([0, 1, 2, 3], np.int64)
    inputs_b = (np.ones((4, 16), np.float32), ids)
    np.testing.assert_allclose(ra.infer(X)[0], a.get_inference_function()(X), rtol=1e-5, atol=1e-5)
    for got, want in zip(rb.infer(*inputs_b), b.get_inference_function()(*inputs_b)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ra.infer(X)[0], a.get_inference_function()(X), rtol=1e-5, atol=1e-5)


def test_a_recompiled_library_at_the_same_path_is_not_stale(tmp_path):
    """dlopen caches by path: the second load of a rewritten file must still get the new code."""
    out = tmp_path / "same"
    first = forge.from_onnx(conv_bn_net(seed=1))
    second = forge.from_onnx(conv_bn_net(seed=2))
    first.compile(output_path=out)
    runtime_first = Runtime(out)
    second.compile(output_path=out, force_overwrite=True)
    runtime_second = Runtime(out)
    np.testing.assert_allclose(runtime_second.infer(X)[0], second.get_inference_function()(X), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runtime_first.infer(X)[0], first.get_inference_function()(X), rtol=1e-5, atol=1e-5)
    assert not np.allclose(runtime_first.infer(X)[0], runtime_second.infer(X)[0])


def test_the_runtime_imports_no_frontend(compiled):
    _, out = compiled
    code = (
        "import sys, numpy as np\n"
        "from forge_core.runtime import Runtime\n"
        f"r = Runtime({str(out)!r}); r.infer(*r.example_inputs())\n"
        "print(sorted(m for m in ('onnx', 'onnxruntime', 'torch', 'tensorflow', 'forge_onnx', 'forge',"
        " 'forge_core.ir', 'forge_core.compiler') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_artifact_records_each_kernels_schedule_and_the_profile_its_fallback_share(tmp_path):
    # A convolution network (scheduled kernels) followed by TopK and CumSum (no schedule takes them).
    conv = conv_bn_net(seed=22)
    graph = conv.graph
    graph.node.extend([helper.make_node("TopK", [graph.output[0].name, "k"], ["top", "top_index"], axis=-1),
                       helper.make_node("CumSum", ["top", "axis"], ["summed"])])
    graph.initializer.extend([numpy_helper.from_array(np.array([4], np.int64), "k"),
                              numpy_helper.from_array(np.array(1, np.int64), "axis")])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("summed", TensorProto.FLOAT, [1, 4]))
    ir = forge.from_onnx(conv)
    ir.compile(output_path=tmp_path / "a", export_metadata=True)
    runtime = Runtime(tmp_path / "a")
    schedules = runtime.get_metadata()["schedules"]
    assert schedules["fallbacks"] == ["cumsum", "topk"]
    assert {schedules["rules"][name] for name in ("cumsum", "topk")} == {"unscheduled"}
    assert any(rule not in ("unscheduled", "Generic") for rule in schedules["rules"].values())
    file_document = json.loads((tmp_path / "a" / "model_metadata.json").read_text())
    assert file_document["schedules"] == schedules
    rows = runtime.profile(repeat=3)
    kernels = {row.name: row for row in rows if row.rule is not None}
    # Every kernel called has its rule (a reshape may become the VM's builtin view, and is then not called).
    assert {row.name for row in rows if not row.name.startswith("vm.builtin.")} == set(kernels)
    assert set(kernels) <= set(schedules["rules"]) and any(name.startswith("fused_conv2d") for name in kernels)
    assert kernels["topk"].fallback and kernels["cumsum"].fallback
    assert not any(row.fallback for name, row in kernels.items() if name not in ("topk", "cumsum"))
    share = fallback_share(rows)
    assert share == pytest.approx(kernels["topk"].share + kernels["cumsum"].share) and 0 < share < 1
    text = format_profile(rows)
    assert "topk" in text and "unscheduled (fallback)" in text and f"{100 * share:.1f}%" in text


def test_inputs_and_outputs_never_share_memory_whatever_the_alignment(tmp_path):
    # Inputs go to the VM through DLPack (shared when 64-byte aligned and writable, else copied once);
    # outputs are always copied out. An Identity-like model must not hand back the caller's memory, an
    # unaligned, strided or read-only input must work, and an earlier result must survive later calls.
    model = make_model([helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 40])],
                       [helper.make_tensor_value_info("same", TensorProto.FLOAT, [3, 40]),
                        helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 40])])
    forge.from_onnx(model).compile(output_path=tmp_path / "a")
    runtime = Runtime(tmp_path / "a")
    rng = np.random.default_rng(3)
    raw = np.empty(3 * 40 * 4 + 64 + 4, np.uint8)
    for offset in (-raw.ctypes.data % 64, -raw.ctypes.data % 64 + 4):  # aligned, then 4 bytes off
        x = raw[offset:offset + 480].view(np.float32).reshape(3, 40)
        x[...] = rng.standard_normal((3, 40))
        want = x.copy()
        same, y = runtime.infer(x)
        np.testing.assert_array_equal(same, want)
        np.testing.assert_array_equal(y, np.maximum(want, 0))
        assert not np.shares_memory(same, x) and not np.shares_memory(y, x)
        x[...] = 7.0
        runtime.infer(x)
        np.testing.assert_array_equal(same, want)  # the earlier result is the caller's
    strided = rng.standard_normal((3, 80)).astype(np.float32)[:, ::2]
    np.testing.assert_array_equal(runtime.infer(strided)[0], strided)
    read_only = rng.standard_normal((3, 40)).astype(np.float32)
    read_only.flags.writeable = False
    np.testing.assert_array_equal(runtime.infer(read_only)[1], np.maximum(read_only, 0))


@pytest.mark.parametrize("array", [
    np.zeros((0, 3), np.float32),                                   # empty (ONNX's reduce_sum_empty_set, tril_zero)
    np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:2],          # C-contiguous to numpy, strides not compact
    np.ones((1, 1, 5), np.float16), np.array([True, False]), np.array(3, np.int64),
], ids=["empty", "size-1-axis-strides", "float16", "bool", "scalar"])
def test_every_array_reaches_the_vm_and_comes_back_unchanged(array):
    import tvm

    from forge_core.runtime.outputs import outputs_to_numpy, to_device

    (back,) = outputs_to_numpy(to_device(array, tvm.cpu()))
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_a_gpus_profile_waits_for_each_kernel(tmp_path, monkeypatch):
    """A GPU runs a kernel after its launch returns: the profile synchronizes the device around every call (its
    rows held launch times before). Checked here on the CPU with the runtime's device taken for a GPU."""
    from forge_core.runtime import engine

    forge.from_onnx(conv_bn_net(seed=23)).compile(output_path=tmp_path / "a")
    runtime = Runtime(tmp_path / "a")
    waited: list[tuple] = []
    real = engine.tvm_ffi.get_global_func

    def get_global_func(name, *args, **kwargs):
        if name == "runtime.Device_StreamSync":
            return lambda device, stream: waited.append((device, stream))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(engine.tvm_ffi, "get_global_func", get_global_func)
    assert runtime.profile(repeat=2) and not waited  # a CPU: nothing to wait for
    monkeypatch.setattr(engine, "CPU_DEVICE_TYPE", -1)  # any device is now "not the CPU"
    rows = runtime.profile(repeat=2)
    calls = sum(row.calls for row in rows) * 2
    assert len(waited) == 2 * calls  # before and after every call of both runs
