"""Indices read at run time are checked as onnxruntime and TFLite's interpreter check them: ONNX's Gather,
GatherElements, GatherND, ScatterElements and ScatterND, TFLite's GATHER. In range (negative ones too, where
ONNX allows them), Forge gives the reference's numbers; out of range, both refuse the run, Forge with an InputError
naming the node and the extent, where TVM's kernels had read past the data (a wrong number, or a segfault for a
far index) and the TFLite path had clamped the index."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forge

RNG = np.random.default_rng(7)
DATA = RNG.standard_normal((6, 5)).astype(np.float32)


def _model(node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], output_shape: list,
           initializers: list[onnx.TensorProto] = (), dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph([node], "indexing", inputs, [helper.make_tensor_value_info("y", dtype, output_shape)],
                              list(initializers))
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(node.domain, 1)] if node.domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    onnx.checker.check_model(model, full_check=not node.domain)  # ONNX has no schema of onnxruntime's contrib ops
    return model


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _data_input(shape=("rows", 5)):
    return helper.make_tensor_value_info("data", TensorProto.FLOAT, list(shape))


def _index_input(shape, dtype=TensorProto.INT64):
    return helper.make_tensor_value_info("idx", dtype, list(shape))


CASES = {
    # name: (model, feeds in range (negative ones included), the indices out of range, the message's extent)
    "gather-axis0": (
        _model(helper.make_node("Gather", ["data", "idx"], ["y"], axis=0, name="rows"),
               [_data_input(), _index_input(["n"])], ["n", 5]),
        {"idx": np.array([0, 5, -1, -6, 2], np.int64)}, np.array([1, 6], np.int64), r"\[-n, n-1\] of n = 6,"),
    "gather-axis1-int32": (
        _model(helper.make_node("Gather", ["data", "idx"], ["y"], axis=-1, name="columns"),
               [_data_input((6, 5)), _index_input([2, 2], TensorProto.INT32)], [6, 2, 2]),
        {"idx": np.array([[0, 4], [-5, -1]], np.int32)}, np.array([[0, -6], [1, 2]], np.int32), r"\[-5, 4\]"),
    "gather-elements": (
        _model(helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=1, name="elements"),
               [_data_input((6, 5)), _index_input([6, 3])], [6, 3]),
        {"idx": RNG.integers(-5, 5, (6, 3))}, np.full((6, 3), 5, np.int64), r"\[-5, 4\]"),
    "gather-nd-batch-dims": (
        _model(helper.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=1, name="nd"),
               [_data_input((6, 5)), _index_input([6, 2, 1])], [6, 2]),
        {"idx": RNG.integers(-5, 5, (6, 2, 1))}, np.full((6, 2, 1), -6, np.int64), r"\[-5, 4\], the extent of data's axis 1"),
    "gather-nd-microsoft": (  # onnxruntime's contrib GatherND, which its transformer exports still hold
        _model(helper.make_node("GatherND", ["data", "idx"], ["y"], domain="com.microsoft", name="contrib_nd"),
               [_data_input((6, 5)), _index_input([3, 2])], [3]),
        {"idx": np.array([[0, 0], [5, 4], [-6, -5]], np.int64)}, np.array([[0, 0], [6, 4], [1, 1]], np.int64),
        r"n = \[6, 5\], the extent of data's axes 0 to 1"),
    "scatter-elements": (
        _model(helper.make_node("ScatterElements", ["data", "idx", "updates"], ["y"], axis=0, name="scatter"),
               [_data_input((6, 5)), _index_input([1, 5]),
                helper.make_tensor_value_info("updates", TensorProto.FLOAT, [1, 5])], [6, 5]),
        {"idx": np.array([[0, 5, -1, -6, 3]], np.int64)}, np.array([[0, 1, 2, 3, 60]], np.int64), r"\[-6, 5\]"),
    "scatter-nd": (
        _model(helper.make_node("ScatterND", ["data", "idx", "updates"], ["y"], name="scatter_nd"),
               [_data_input((6, 5)), _index_input([3, 2]),
                helper.make_tensor_value_info("updates", TensorProto.FLOAT, [3])], [6, 5]),
        {"idx": np.array([[0, 0], [5, 4], [-1, -2]], np.int64)}, np.array([[0, 0], [2, 5], [1, 1]], np.int64),
        r"n = \[6, 5\]"),
}


def _feeds(name: str, indices: dict) -> dict:
    feeds = {"data": DATA, **indices}
    if name.startswith("scatter"):
        count = 5 if name == "scatter-elements" else 3
        feeds["updates"] = RNG.standard_normal((1, 5) if name == "scatter-elements" else (count,)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", sorted(CASES))
def test_indices_in_range_give_onnxruntimes_numbers_and_out_of_range_are_refused(name, tmp_path):
    model, indices, outside, extent = CASES[name]
    feeds = _feeds(name, indices)
    expected = _ort(model, feeds)
    ir = forge.from_onnx(model)
    names = [spec.name for spec in ir.input_specs] if hasattr(ir, "input_specs") else list(feeds)
    function = ir.get_inference_function()
    np.testing.assert_array_equal(function(*[feeds[n] for n in names]), expected)
    artifact = tmp_path / "artifact"
    ir.compile(output_path=artifact)
    runtime = forge.Runtime(artifact)
    np.testing.assert_array_equal(runtime.infer(*[feeds[n] for n in names])[0], expected)

    bad = {**feeds, "idx": outside}
    with pytest.raises(Exception, match="(?i)out of (data )?bounds|out of range|invalid"):
        _ort(model, bad)
    node = model.graph.node[0]
    pattern = rf"{node.op_type} '{node.name}': \d+ of its indices lie outside .*{extent}"
    with pytest.raises(forge.InputError, match=pattern):
        runtime.infer(*[bad[n] for n in names])
    with pytest.raises(forge.InputError, match=pattern):
        function(*[bad[n] for n in names])


def test_a_far_index_is_refused_where_it_segfaulted():
    """Row 100000000 of a 6-row table: TVM's fast take read far past the data and the process died."""
    model, _, _, _ = CASES["gather-axis0"]
    function = forge.from_onnx(model).get_inference_function()
    with pytest.raises(forge.InputError, match=r"Gather 'rows': 2 of its indices lie outside"):
        function(DATA, np.array([100_000_000, -100_000_000, 0], np.int64))


def test_a_token_id_past_the_vocabulary_is_refused():
    """An embedding lookup (BERT's word embeddings) with an id >= the vocabulary's size."""
    table = numpy_helper.from_array(RNG.standard_normal((30, 8)).astype(np.float32), "table")
    model = _model(helper.make_node("Gather", ["table", "ids"], ["y"], name="word_embeddings"),
                   [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
                   ["batch", "sequence", 8], [table])
    function = forge.from_onnx(model).get_inference_function()
    ids = RNG.integers(0, 30, (2, 7))
    np.testing.assert_array_equal(function(ids), _ort(model, {"ids": ids}))
    ids[1, 3] = 30
    with pytest.raises(forge.InputError, match=r"word_embeddings.*outside \[-30, 29\], the extent of data's axis 0"):
        function(ids)


def test_constant_indices_in_range_add_no_check():
    indices = numpy_helper.from_array(np.array([0, -1, 3], np.int64), "idx")
    model = _model(helper.make_node("Gather", ["data", "idx"], ["y"], axis=0, name="rows"), [_data_input((6, 5))],
                   [3, 5], [indices])
    ir = forge.from_onnx(model)
    assert "assert_op" not in ir.mod.script()
    np.testing.assert_array_equal(ir.get_inference_function()(DATA), _ort(model, {"data": DATA}))


def test_an_out_of_range_gather_in_the_branch_not_taken_runs():
    """onnxruntime runs only the branch taken; Forge runs both branches' bindings, and checks indices only in
    the branch taken (an index beyond the data in the other is no error)."""
    then_graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "far"], ["picked"], axis=0, name="far_rows")], "then", [],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(np.array([50], np.int64), "far")])
    else_graph = helper.make_graph(
        [helper.make_node("Slice", ["data", "start", "end"], ["first"], name="first_row")], "else", [],
        [helper.make_tensor_value_info("first", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(np.array([0], np.int64), "start"),
         numpy_helper.from_array(np.array([1], np.int64), "end")])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then_graph, else_branch=else_graph, name="choose")],
        "branches", [_data_input((6, 5)), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    flag = np.array(False)
    function = forge.from_onnx(model).get_inference_function()
    np.testing.assert_array_equal(function(DATA, flag), _ort(model, {"data": DATA, "flag": flag}))
    with pytest.raises(forge.InputError, match=r"Gather 'far_rows': 1 of its indices lie outside \[-6, 5\]"):
        function(DATA, np.array(True))


def _tflite_gather(axis: int) -> bytes:
    import tensorflow as tf

    table = tf.constant(RNG.standard_normal((6, 5)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([3], tf.int32, name="ids")])
    def lookup(ids):
        return tf.gather(table, ids, axis=axis)

    converter = tf.lite.TFLiteConverter.from_concrete_functions([lookup.get_concrete_function()], lookup)
    return converter.convert()


@pytest.mark.parametrize("axis", [0, 1])
def test_a_tflite_gather_out_of_range_is_refused_where_it_was_clamped(axis):
    """TFLite's interpreter raises on an index outside [0, n); Forge had clamped it (the last row's numbers)."""
    from tf_models import Interpreter

    data = _tflite_gather(axis)
    ids = np.array([0, 4, 2], np.int32)
    function = forge.from_tflite(data).get_inference_function()
    np.testing.assert_array_equal(function(ids), Interpreter(data)(ids)[0])
    extent = 6 if axis == 0 else 5
    for bad in ([0, extent, 1], [-1, 2, 0]):
        with pytest.raises(Exception, match="out of bounds"):
            Interpreter(data)(np.array(bad, np.int32))
        with pytest.raises(forge.InputError, match=rf"GATHER '.*': 1 of its indices lie outside \[0, {extent - 1}\]"):
            function(np.array(bad, np.int32))


def test_the_light_runtime_runs_the_checks(tmp_path):
    """In a process with TVM's runtime library alone (a board), where TVM's Python registers no
    ``relax.run.assert_op``: an artifact holding a check had failed to run at all."""
    import subprocess
    import sys

    from artifacts import run_in_fresh_process

    model, indices, _, _ = CASES["gather-axis0"]
    artifact = tmp_path / "artifact"
    forge.from_onnx(model).compile(output_path=artifact)
    outputs, report = run_in_fresh_process(artifact, [DATA, indices["idx"]], tmp_path, runtime_only=True)
    assert not report["compiler_loaded"] and not report["tvm_imported"], report
    np.testing.assert_array_equal(outputs[0], _ort(model, {"data": DATA, **indices}))
    script = ("import sys, numpy as np\n"
              "from forge_core.runtime import Runtime\n"
              "from forge_core.errors import InputError\n"
              "try:\n"
              "    Runtime(sys.argv[1]).infer(np.ones((6, 5), np.float32), np.array([0, 6], np.int64))\n"
              "except InputError as error:\n"
              "    print(error)\n")
    done = subprocess.run([sys.executable, "-c", script, str(artifact)], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "TVM_USE_RUNTIME_LIB": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Gather 'rows': 1 of its indices lie outside [-n, n-1] of n = 6, the extent of data's axis 0" in done.stdout, done.stdout


def test_from_torch_indexes_from_the_end_and_refuses_what_pytorch_refuses():
    """``t[ids]`` takes Python's negative indices (TVM's converter had read before the table: a wrong number);
    ``nn.Embedding`` and ``index_select`` refuse an index outside ``[0, n)``, as PyTorch does."""
    import torch

    class Lookups(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(10, 4)
            self.register_buffer("rows", torch.randn(10, 4, generator=torch.Generator().manual_seed(3)))

        def forward(self, ids: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
            return self.rows[ids] + self.table(positive) + torch.index_select(self.rows, 0, positive)

    module = Lookups().eval()
    function = forge.from_torch(module, [("ids", ((3,), "int64")), ("positive", ((3,), "int64"))]) \
        .get_inference_function()
    ids, positive = np.array([-1, 2, -10]), np.array([0, 9, 4])
    with torch.no_grad():
        want = module(torch.from_numpy(ids), torch.from_numpy(positive)).numpy()
    np.testing.assert_allclose(function(ids, positive), want, rtol=1e-6, atol=1e-6)
    for bad_ids, bad_positive in ((np.array([1, 2, 10]), positive), (np.array([-11, 0, 0]), positive),
                                  (ids, np.array([0, 10, 1])), (ids, np.array([0, -1, 1]))):
        with pytest.raises((IndexError, RuntimeError)):
            module(torch.from_numpy(bad_ids), torch.from_numpy(bad_positive))
        with pytest.raises(forge.InputError, match=r"1 of its indices lie outside \[0, 9\], the extent of axis 0 "
                                                   r"\(PyTorch refuses such indices too\)"):
            function(bad_ids, bad_positive)


@pytest.mark.parametrize("compiled", [False, True])
def test_from_torch_advanced_indexing_on_two_axes_refuses_what_pytorch_refuses(compiled):
    """``t[i, j]`` (Relax's ``index_tensor``): an index past an axis had given numbers from other memory, and a
    far one a segfault, where PyTorch raises. Each index tensor is now checked against its axis; Python's
    negative indices still read from the end, as in PyTorch."""
    import torch

    from forge_core.compiler.compile import compile_to_function

    class Pick(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(5)))

        def forward(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
            return self.table[i, j]

    module = Pick().eval()
    ir = forge.from_torch(module, [("i", ((3,), "int64")), ("j", ((3,), "int64"))])
    function = compile_to_function(ir) if compiled else ir.get_inference_function()
    for i, j in (([0, 4, 2], [1, 6, 0]), ([-1, 0, -5], [-7, 2, -1])):
        want = module(torch.tensor(i), torch.tensor(j)).numpy()
        np.testing.assert_array_equal(function(np.array(i), np.array(j)), want)
    for i, j, axis, last in (([0, 5, 1], [0, 0, 0], 0, 4), ([0, 1, -6], [0, 0, 0], 0, 4), ([0, 1, 1], [0, 7, 0], 1, 6),
                             ([0, 400000, 1], [0, 7000000, 0], 0, 4)):
        with pytest.raises(IndexError):
            module(torch.tensor(i), torch.tensor(j))
        with pytest.raises(forge.InputError, match=rf"an index \(index_tensor\) into a tensor of shape \(5, 7, 3\): "
                                                   rf"1 of its indices lie outside \[0, {last}\], the extent of axis "
                                                   rf"{axis} \(PyTorch refuses such indices too\)"):
            function(np.array(i), np.array(j))


def test_a_shape_bucket_keeps_the_check(tmp_path):
    """A bucket is a static copy of the model's function: it shared the check's variables with the dynamic one,
    and fusion refused the module ("appears at multiple definition sites")."""
    model, indices, outside, _ = CASES["gather-axis0"]
    artifact = tmp_path / "artifact"
    forge.from_onnx(model).compile(output_path=artifact, shape_buckets=[{"data": (6, 5), "idx": (5,)}])
    runtime = forge.Runtime(artifact)
    np.testing.assert_array_equal(runtime.infer(DATA, indices["idx"])[0], _ort(model, {"data": DATA, **indices}))
    with pytest.raises(forge.InputError, match=r"Gather 'rows': 1 of its indices lie outside \[-n, n-1\] of n = 6,"):
        runtime.infer(DATA, np.array([0, 1, 2, 3, 6], np.int64))
    with pytest.raises(forge.InputError, match=r"Gather 'rows': 1 of its indices lie outside"):
        runtime.infer(DATA, outside)


def test_lookups_are_taken_in_clip_mode_and_tvm_no_longer_warns_of_segfaults(tmp_path):
    """Every take is bounded (``clamped_takes``) once the importers have put their checks before it: the same
    numbers for the in-range indices the checks let through, and TVM's C++ warning "Fast mode segfaults when
    there are out-of-bounds indices", printed at import and at every build of a model with a lookup (a
    BERT: four lines), is gone. TVM writes it to the process's stderr: a subprocess reads it."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import numpy as np, onnx, torch, forge
        from onnx import TensorProto, helper, numpy_helper
        table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((50, 8)).astype("float32"), "t")
        graph = helper.make_graph([helper.make_node("Gather", ["t", "i"], ["y"], axis=0)], "g",
                                  [helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [table])
        ir = forge.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
        assert 'mode="fast"' not in ir.mod.script() and 'mode="clip"' in ir.mod.script()
        i = np.array([0, 49, -1, -50], "int64")
        want = numpy_helper.to_array(table)[[0, 49, 49, 0]]
        assert np.array_equal(ir.get_inference_function()(i), want)
        ir.compile(output_path={str(tmp_path / "onnx")!r})
        assert np.array_equal(forge.Runtime({str(tmp_path / "onnx")!r}).infer(i)[0], want)
        embedding = torch.nn.Embedding(30, 4).eval()
        tokens = torch.tensor([[0, 29, 7]])
        tir = forge.from_torch(embedding, [("ids", ((1, 3), "int64"))])
        tir.compile(output_path={str(tmp_path / "torch")!r})
        got = forge.Runtime({str(tmp_path / "torch")!r}).infer(tokens.numpy())[0]
        assert np.array_equal(got, embedding(tokens).detach().numpy())
        print("ran")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-3000:]
    assert "Fast mode segfaults" not in done.stderr, done.stderr[-3000:]
