"""Verification mode, and the bare 1x1 convolution that computed wrong numbers without it.

The suite runs with ``FORGE_VERIFY=1`` (conftest.py): every model it compiles has
each scheduled function checked against its unscheduled form.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from model_factory import make_model
from onnx import TensorProto, helper, numpy_helper
from tvm import te
from tvm.script import tirx as T

import forge
from forge_core.compiler.compile import compile_to_function
from forge_core.hookspecs import hookimpl
from forge_core.plugin_manager import get_plugin_manager
from forge_core.schedules.apply import RULE_ATTR, SCHEDULED_ATTR
from forge_core.schedules.verify import ScheduleVerificationError, verification_enabled, verify_function, verifying

RNG = np.random.default_rng(11)
FORGE = str(Path(sys.executable).with_name("forge"))


def bare_pointwise(channels_in: int, channels_out: int, size: int) -> onnx.ModelProto:
    """One bias-free 1x1 Conv whose own block writes the model output (nothing fused after it)."""
    w = (RNG.standard_normal((channels_out, channels_in, 1, 1)) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    return make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, size, size])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels_out, size, size])],
                      [numpy_helper.from_array(w, "w")])


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("channels_in, channels_out, size", [(96, 24, 40), (16, 24, 56), (24, 48, 80), (32, 16, 20),
                                                              (40, 8, 7)])
@pytest.mark.parametrize("opt_level", [0, 3])
def test_bare_pointwise_conv_matches_onnxruntime(channels_in, channels_out, size, opt_level):
    # The register tile holds 2-3 vectors of 16 pixels and straddles the 40-, 56- and 80-pixel
    # rows: the write-back used to copy whole rows of the tile's bounding box, most never computed.
    model = bare_pointwise(channels_in, channels_out, size)
    x = RNG.standard_normal((1, channels_in, size, size)).astype(np.float32)
    (expected,) = ort_run(model, {"x": x})
    run = compile_to_function(forge.from_onnx(model), opt_level=opt_level)
    np.testing.assert_allclose(run(x), expected, rtol=1e-4, atol=1e-4)


def test_the_suite_runs_in_verification_mode():
    assert os.environ.get("FORGE_VERIFY") == "1" and verification_enabled()


@T.prim_func(s_tir=True)
def _add_reference(a: T.Buffer((4, 16), "float32"), b: T.Buffer((4, 16), "float32"),
                   out: T.Buffer((4, 16), "float32")):
    for i, j in T.grid(4, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = a[vi, vj] + b[vi, vj]


@T.prim_func(s_tir=True)
def _add_missing_last_row(a: T.Buffer((4, 16), "float32"), b: T.Buffer((4, 16), "float32"),
                          out: T.Buffer((4, 16), "float32")):
    for i, j in T.grid(3, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = a[vi, vj] + b[vi, vj]


def test_an_output_element_the_schedule_never_writes_is_a_mismatch():
    # Both runs see the same inputs; the scheduled run's output starts as NaN, so an
    # unwritten element cannot pass for the reference's value.
    with pytest.raises(ScheduleVerificationError, match=r"'add_fn' as scheduled by Broken .*output 'out'"):
        verify_function("add_fn", "Broken", _add_reference, _add_missing_last_row, tvm.target.Target("llvm"))
    assert verify_function("add_fn", "Same", _add_reference, _add_reference, tvm.target.Target("llvm")) is None


@T.prim_func(s_tir=True)
def _divide(a: T.Buffer((4, 16), "int32"), b: T.Buffer((4, 16), "int32"), out: T.Buffer((4, 16), "int32")):
    for i, j in T.grid(4, 16):
        with T.sblock("divide"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = T.truncdiv(a[vi, vj], b[vi, vj])


@T.prim_func(s_tir=True)
def _gather_divide(a: T.Buffer((4, 16), "int32"), index: T.Buffer((4,), "int64"), out: T.Buffer((4, 16), "int32")):
    for i, j in T.grid(4, 16):
        with T.sblock("gather_divide"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = T.floordiv(a[vi, vj], a[index[vi], vj])


@T.prim_func(s_tir=True)
def _float_addressed(a: T.Buffer((16,), "float32"), where: T.Buffer((4,), "float32"), out: T.Buffer((4,), "float32")):
    for i in range(4):
        with T.sblock("sample"):
            vi = T.axis.spatial(4, i)
            out[vi] = a[T.Cast("int32", where[vi] * T.float32(4))]


def test_functions_that_address_memory_from_float_data_are_not_verified():
    # RoiAlign: random boxes address outside the image; both runs would read garbage (found on ONNX's
    # test_roialign_aligned_false).
    assert verify_function("sample", "Same", _float_addressed, _float_addressed,
                           tvm.target.Target("llvm")) == "it computes addresses from floating-point data"


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_a_float_to_integer_cast_is_verified_on_floats_the_integer_type_holds(dtype):
    """A quantize's cast standing alone (opt_level 0). LLVM leaves fptoui of -0.7 undefined, and scalar and
    vectorized code disagreed on such inputs on an Intel Xeon (max error 255, no bug in the schedule: the
    opt_level 0 cases of test_int8_kernels and test_quantization failed there). Verification now feeds
    such functions floats every integer type holds: a correct schedule passes, a wrong one is still caught."""
    from forge_core.schedules.elementwise import Elementwise

    x = te.placeholder((7, 67), name="x")
    original = te.create_prim_func([x, te.compute((7, 67), lambda i, j: x[i, j].astype(dtype), name="cast")])
    target = tvm.target.Target("llvm")
    with target:
        scheduled = Elementwise().apply(original, target, False).mod["main"]
    assert verify_function(f"cast_{dtype}", "Elementwise", original, scheduled, target) is None
    wrong = te.create_prim_func([x, te.compute((7, 67), lambda i, j: (x[i, j] + 1.0).astype(dtype), name="cast")])
    with pytest.raises(ScheduleVerificationError, match=f"'cast_{dtype}_wrong' as scheduled by Broken"):
        verify_function(f"cast_{dtype}_wrong", "Broken", original, wrong, target)


def _resize_index(rows: float) -> tvm.tirx.PrimFunc:
    """A nearest resize's source index as SLANet's fused kernel computes it: the output coordinate over the scale
    (``rows`` over the input's size), floored and clamped to the input, then cast to int64."""
    size = te.placeholder((1,), name="size")
    coordinate = te.placeholder((3,), name="coordinate")

    def index(i):
        scale = tvm.tirx.const(rows, "float32") / size[0]
        source = tvm.tirx.floor((coordinate[i] - 1.0) / scale)
        return tvm.te.min(tvm.te.max(source, 0.0), size[0] - 1.0).astype("int64")

    return te.create_prim_func([size, coordinate, te.compute((3,), index, name="index")])


def test_a_resize_index_computed_with_a_wrong_size_is_caught_though_its_clamp_takes_most_draws():
    """SLANet with its dims dynamic, compiled: a per-item kernel computed a resize's index with its batch item's 1
    where its reference has the batch's 3, and verification passed it (floats from 0 to 100: the clamp to the
    input's size took every element). A function converting floats to integers now runs on twelve draws from 0
    to 100, 16, 8 and 4: a wrong size, each of five, is caught."""
    target = tvm.target.Target("llvm")
    original = _resize_index(3.0)
    assert verify_function("resize_index", "Same", original, original, target) is None
    for rows in (1.0, 2.0, 4.0, 5.0, 6.0):
        with pytest.raises(ScheduleVerificationError, match="'resize_index' as scheduled by Broken"):
            verify_function("resize_index", "Broken", original, _resize_index(rows), target)


def _strided_map(scale: float) -> tvm.tirx.PrimFunc:
    """``x * scale`` over a map of ``n`` items whose width is computed from a dim passed by value
    (``(h - 1) // 32 + 1``: a stride-32 feature map of a detector with its dims dynamic, as SLANet's fused kernels
    take it)."""
    n, h = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("h", "int64")
    shape = (n, 8, (h - 1) // 32 + 1)
    x = te.placeholder(shape, name="x")
    y = te.compute(shape, lambda a, b, c: x[a, b, c] * tvm.tirx.const(scale, "float32"), name="y")
    return te.create_prim_func([x, h, y])


def test_a_function_with_dynamic_dims_and_a_dim_passed_by_value_is_verified_with_each_bound():
    """Verification had checked only the rules over symbolic dims: any other function of a model with its dims
    dynamic was reported as 'symbolic shapes', and one whose dims are computed from a scalar parameter could not
    be bound (SLANet with dims dynamic: 92 of 199 scheduled functions verified, now 194). Every dim, and every
    dim passed by value, is now bound (in rounds: the computed width once ``h`` is bound, then ``n``)."""
    from forge_core.schedules.verify import verify_schedules

    function = tvm.ir.GlobalVar("scaled")
    before = tvm.IRModule({function: _strided_map(2.0)})
    target = tvm.target.Target("llvm")
    same = tvm.IRModule({function: _strided_map(2.0).with_attr(RULE_ATTR, "Same")})
    report = verify_schedules(before, same, target, "default")
    assert report.verified == ["scaled"] and not report.skipped, report
    wrong = tvm.IRModule({function: _strided_map(2.5).with_attr(RULE_ATTR, "Broken")})
    with pytest.raises(ScheduleVerificationError, match="'scaled' as scheduled by Broken at 19 .* output 'y'"):
        verify_schedules(before, wrong, target, "default")


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT8])
def test_integer_division_by_loaded_values_is_not_verified_and_never_traps(dtype, opt_level, tmp_path):
    # Wider integers are 0 in verification (indices): an integer Div trapped with SIGFPE and took the process
    # down (ONNX's test_div_int32_trunc and test_div_uint*). Nonzero inputs instead read out of range where
    # the same integers shape an index (test_tile). Such functions are logged as not verified.
    model = make_model([helper.make_node("Div", ["a", "b"], ["y"], name="div")],
                       [helper.make_tensor_value_info(n, dtype, [3, 33]) for n in ("a", "b")],
                       [helper.make_tensor_value_info("y", dtype, [3, 33])])
    numpy_type = helper.tensor_dtype_to_np_dtype(dtype)
    a = RNG.integers(0, 120, (3, 33)).astype(numpy_type)
    b = RNG.integers(1, 9, (3, 33)).astype(numpy_type)
    (expected,) = ort_run(model, {"a": a, "b": b})
    np.testing.assert_array_equal(compile_to_function(forge.from_onnx(model), opt_level=opt_level)(a, b), expected)
    for name, func in (("divide", _divide), ("gather_divide", _gather_divide)):
        assert verify_function(name, "Same", func, func, tvm.target.Target("llvm")) == "it divides by integers it loads"


class _SubtractInsteadOfAdd:
    """A third-party schedule pass with a bug: it replaces every ``add`` function by a subtraction."""

    @staticmethod
    def wrong_schedule(mod: tvm.IRModule, context) -> tvm.IRModule:
        result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint == "add":
                a, b, _ = func.params
                x = te.placeholder([int(d) for d in a.shape], a.dtype, "x")
                y = te.placeholder([int(d) for d in b.shape], b.dtype, "y")
                z = te.compute(x.shape, lambda *i: x(*i) - y(*i), name="sub")
                result[gv] = te.create_prim_func([x, y, z]).with_attr(SCHEDULED_ATTR, True).with_attr(
                    RULE_ATTR, "SubtractRule")
        return result

    @hookimpl
    def register_passes(self, register):
        register("subtract_schedule", self.wrong_schedule, stage="schedule", description="a wrong schedule")


def test_a_wrong_third_party_schedule_fails_the_compile(fresh_plugins, tmp_path, caplog):
    manager = get_plugin_manager()
    manager.register(_SubtractInsteadOfAdd(), "subtract-plugin")
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                       [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ("a", "b")],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    with pytest.raises(ScheduleVerificationError) as info:
        forge.from_onnx(model).compile(output_path=tmp_path / "a", opt_level=0)
    error = info.value
    assert (error.function, error.rule, error.output) == ("add", "SubtractRule", "T_add")
    assert error.max_error > 1 and "SubtractRule" in str(error)
    assert not (tmp_path / "a").exists()  # nothing half-written


def test_verification_reports_what_it_checked(tmp_path, caplog):
    model = bare_pointwise(16, 24, 40)
    with caplog.at_level(logging.INFO, logger="forge.verify"):
        forge.from_onnx(model).compile(output_path=tmp_path / "a")
    assert any("verified 1 scheduled function" in r.getMessage() for r in caplog.records)


def test_verifying_context_turns_it_on(monkeypatch):
    monkeypatch.delenv("FORGE_VERIFY")
    assert not verification_enabled()
    with verifying():
        assert verification_enabled()
    assert not verification_enabled()


def test_cli_compile_verify(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(bare_pointwise(16, 24, 40), str(path))
    env = {k: v for k, v in os.environ.items() if k != "FORGE_VERIFY"}
    done = subprocess.run([FORGE, "--debug", "compile", str(path), "-o", str(tmp_path / "a"), "--verify"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "forge.verify: verified 1 scheduled function" in done.stderr
    done = subprocess.run([FORGE, "--debug", "compile", str(path), "-o", str(tmp_path / "b")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and "forge.verify" not in done.stderr


@pytest.mark.parametrize("opt_level", [0, 3])
def test_bool_stages_are_not_vectorized(opt_level):
    # ViT's attention mask: any(x != -inf) along the keys, as Equal, Not, Cast, ReduceMax. Vectorized
    # stores of bool gave -1 where 1 was right (found by verification mode on the corpus).
    x = RNG.standard_normal((2, 4, 17, 17)).astype(np.float32)
    x[0, 1, 2, :] = -np.inf
    nodes = [helper.make_node("Equal", ["x", "minus_inf"], ["eq"]), helper.make_node("Not", ["eq"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["as_int"], to=TensorProto.INT8),
             helper.make_node("ReduceMax", ["as_int"], ["y"], axes=[-1], keepdims=1)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                       [helper.make_tensor_value_info("y", TensorProto.INT8, [2, 4, 17, 1])],
                       [numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf")])
    (expected,) = ort_run(model, {"x": x})
    np.testing.assert_array_equal(compile_to_function(forge.from_onnx(model), opt_level=opt_level)(x), expected)
