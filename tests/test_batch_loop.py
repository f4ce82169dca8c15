"""Kernels over a dynamic batch scheduled as one static batch item in a loop (forge_core/schedules/batch_loop.py).

Which kernels qualify (every item computed from that item alone), which do not (the batch moved, reduced,
broadcast, or a second dynamic dim), and the scheduled kernels against their unscheduled form at several batches,
with and without an epilogue, at odd sizes, on the rules that repack weights (the repacking runs once, before the
loop). End to end, the dynamic-batch models of test_dynamic_shapes.py and the fuzzer's dynamic-batch packs
(test_schedule_fuzz.py) check them against onnxruntime.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx, topi

from forge_core.schedules.apply import RULE_ATTR, apply_rules, default_rules
from forge_core.schedules.batch_loop import BATCH_LOOP_ATTR, batch_var, per_batch_item
from forge_core.targets.isa import runnable_here

TARGET = runnable_here(tvm.target.Target.from_device(tvm.cpu()))


def _func(tensors) -> tirx.PrimFunc:
    return te.create_prim_func(tensors).with_attr("global_symbol", "main")


def _schedule(func: tirx.PrimFunc) -> tirx.PrimFunc:
    mod = apply_rules(tvm.IRModule({"main": func}), TARGET, default_rules())
    return mod["main"]


def _run(func: tirx.PrimFunc, arrays: list[np.ndarray]) -> np.ndarray:
    library = tvm.compile(tvm.IRModule({"main": func}), target=TARGET)
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    library["main"](*tensors)
    return tensors[-1].numpy()


def _conv(n, c_in, c_out, size, kernel, stride, epilogue):
    """The fused PrimFunc Relax legalizes a convolution (and its bias + clip epilogue) into: int64 dims, as in a
    model; returns it with its inputs' and output's shapes (``n`` where the batch is)."""
    rng = np.random.default_rng(c_in * c_out)
    x = relax.Var("x", relax.TensorType([n, c_in, size, size], "float32"))
    w = relax.Var("w", relax.TensorType([c_out, c_in, kernel, kernel], "float32"))
    b = relax.Var("b", relax.TensorType([1, c_out, 1, 1], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b] if epilogue else [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=kernel // 2))
            if epilogue:
                y = bb.emit(relax.op.clip(relax.op.add(y, b), 0.0, 6.0))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(mod)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    shapes = [list(p.ty.shape) for p in func.params]
    del rng
    return func.with_attr("global_symbol", "main"), shapes


CONVS = {
    # name: (c_in, c_out, size, kernel, stride, epilogue)
    "3x3-bias-clip": (8, 16, 14, 3, 1, True),
    "3x3-odd-no-epilogue": (5, 7, 13, 3, 2, False),
    "1x1-bias-clip": (32, 24, 9, 1, 1, True),  # the pointwise rule
    "large-3x3-bias-clip": (32, 64, 28, 3, 1, True),  # the rule that repacks its weights
}


@pytest.mark.parametrize("case", list(CONVS))
def test_a_convolution_over_a_dynamic_batch_is_scheduled_per_item_and_computes_its_unscheduled_values(case):
    n = tirx.Var("n", "int64")
    func, shapes = _conv(n, *CONVS[case])
    assert str(batch_var(func).name) == "n"
    scheduled = _schedule(func)
    assert scheduled.attrs[BATCH_LOOP_ATTR] == "n"
    static, _ = _conv(1, *CONVS[case])
    assert str(scheduled.attrs[RULE_ATTR]) == str(_schedule(static).attrs[RULE_ATTR])  # the rule a batch of 1 gets
    rng = np.random.default_rng(len(case))
    for batch in (1, 3, 4):
        dims = [[batch if isinstance(d, tirx.Var) else int(d) for d in shape] for shape in shapes]
        arrays = [rng.standard_normal(d).astype("float32") for d in dims[:-1]]
        want = _run(func, [*arrays, np.zeros(dims[-1], "float32")])
        got = _run(scheduled, [*arrays, np.full(dims[-1], np.nan, "float32")])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_the_weight_repacking_stage_runs_once_before_the_loop():
    func, _ = _conv(tirx.Var("n", "int64"), *CONVS["large-3x3-bias-clip"])
    scheduled = _schedule(func)
    root = scheduled.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    loops = [s for s in stmts if isinstance(s, tirx.For) and s.loop_var.name == "batch_item"]
    assert len(loops) == 1 and stmts[-1].same_as(loops[0])
    assert len(stmts) == 2 and "batch_item" not in stmts[0].script()  # the rule's repacking, outside the loop


def _declined(build) -> None:
    n = tirx.Var("n", "int64")
    assert batch_var(_func(build(n))) is None


def test_a_kernel_whose_items_are_not_independent_is_left_to_the_symbolic_path():
    def transposed(n):  # the batch moves to another axis
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, te.compute((6, n), lambda i, j: x[j, i], name="t")]

    def summed(n):  # a reduction over the batch
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, topi.sum(x, axis=0)]

    def first_item(n):  # every item reads item 0
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, te.compute((n, 6), lambda i, j: x[i, j] + x[0, j], name="y")]

    def shifted(n):  # item i reads item i // 2
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, te.compute((n, 6), lambda i, j: x[i // 2, j], name="y")]

    def two_dims(n):  # a second dynamic dim
        m = tirx.Var("m", "int64")
        x = te.placeholder((n, m), "float32", name="x")
        return [x, te.compute((n, m), lambda i, j: x[i, j] * 2.0, name="y")]

    def flattened(n):  # the batch folded into another dim
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, topi.reshape(x, (n * 6,))]

    def first_slice(n):  # x[0:1], a static output read from item 0: a loop would leave the last item in it
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, te.compute((1, 6), lambda i, j: x[i, j], name="y")]

    def indexed(n):  # the item's index is a value computed (arange, and x * arange once fused)
        x = te.placeholder((n,), "float32", name="x")
        return [x, te.compute((n,), lambda i: x[i] * i.astype("float32"), name="y")]

    def masked(n):  # a triangular mask over the item axis
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, te.compute((n, 6), lambda i, j: tirx.Select(j > i, x[i, j], 0.0), name="y")]

    def batch_size_as_value(n):  # the batch size itself a value (shape_to_tensor fused in): per item it is 1
        x = te.placeholder((n, 6), "float32", name="x")
        return [x, te.compute((n, 6), lambda i, j: x[i, j] / n.astype("float32"), name="y")]

    for build in (transposed, summed, first_item, shifted, two_dims, flattened, first_slice, indexed, masked,
                  batch_size_as_value):
        _declined(build)


def test_a_range_over_a_dynamic_dim_computes_each_index_compiled_and_in_the_inference_function():
    """Range(0, n) times x over a 1D dynamic input: the kernel's item index is a value, so a loop over items
    computed 0 for every item (a wrong number, compiled and in the inference function) until batch_var
    checked for it."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto
    from onnx import helper as oh

    import forge
    from forge_core.compiler.compile import compile_to_function

    nodes = [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Squeeze", ["s"], ["n"]),
             oh.make_node("Range", ["zero", "n", "one"], ["r"]),
             oh.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT), oh.make_node("Mul", ["x", "rf"], ["y"])]
    graph = oh.make_graph(nodes, "range", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
                          [oh.make_tensor("zero", TensorProto.INT64, [], [0]),
                           oh.make_tensor("one", TensorProto.INT64, [], [1])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    ir = forge.from_onnx(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in (1, 7, 40):
        x = np.random.default_rng(size).standard_normal(size).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(compile_to_function(ir)(x), want, rtol=1e-6)
        np.testing.assert_allclose(ir.get_inference_function()(x), want, rtol=1e-6)


def test_a_static_kernel_has_no_batch():
    x = te.placeholder((2, 6), "float32", name="x")
    assert batch_var(_func([x, topi.exp(x)])) is None
    assert per_batch_item(_func([x, topi.exp(x)]), _schedule) is None


def test_an_int8_model_with_a_dynamic_batch_computes_per_item_and_builds_for_vnni(tmp_path, monkeypatch):
    """int8 convolutions over a dynamic batch, per item (verified at a batch of 3 in this compile), against the
    fake-quantized module at batches 3 and 1; and the build for AVX-512 VNNI, whose tensorized stages match the
    weights with 64-byte alignment (an item view has the alignment of its offset: that build failed, and
    AVX-VNNI's, on the classifier's int8 matmuls until views carried it). A static bucket at batch 3 gave the same
    bits as the loop (checked by hand on MobileNetV2)."""
    import io

    import forge

    torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")
    nn = torch.nn
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU(),
                          nn.Conv2d(64, 128, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    buffer = io.BytesIO()
    torch.onnx.export(model.eval(), (torch.randn(1, 3, 16, 16),), buffer, input_names=["x"], opset_version=17,
                      dynamo=False, dynamic_axes={"x": {0: "batch"}})
    ir = forge.from_onnx(buffer.getvalue())
    rng = np.random.default_rng(5)
    ir.calibrate([rng.standard_normal((b, 3, 16, 16)).astype("float32") for b in (1, 2)])
    ir.quantize()
    ir.compile(output_path=tmp_path / "host")
    runtime = forge.Runtime(tmp_path / "host")
    reference = ir.get_inference_function()
    for batch in (3, 1):
        x = rng.standard_normal((batch, 3, 16, 16)).astype("float32")
        want = reference(x)
        assert np.abs(runtime.infer(x)[0] - want).max() <= 0.02 * np.abs(want).max()
    # A build check (the VNNI kernels' numbers are test_int8_kernels.py's): without verification, which would
    # rebuild every kernel for this host.
    monkeypatch.delenv("FORGE_VERIFY")
    ir.compile(target={"kind": "llvm", "mcpu": "cascadelake"}, output_path=tmp_path / "cascadelake")
