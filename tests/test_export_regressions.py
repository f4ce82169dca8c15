"""Constructs seen failing in real exports, each against onnxruntime or torch on random inputs.

* ``ConstantOfShape`` of the empty shape (a scalar): transformers 5 emits one in every BERT-family export.
* ``Size`` of a shape value, in an ``If`` branch and in the main graph (dynamic shapes).
* Shape arithmetic on dynamic dims: ``Range(0, sequence)`` keeps the sequence's dim, so that GPT-2's and
  T5's dynamic exports (positions, causal masks, relative position buckets) import.

The fused PyTorch fast paths in TorchScript are tested in ``test_torch_fast_paths.py``.
"""

from __future__ import annotations


import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import forge

TOLERANCE = 1e-5


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "regression", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def run_both(model, feeds):
    """(onnxruntime's outputs, Forge's inference function's outputs), as lists."""
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = forge.from_onnx(model).get_inference_function()(*feeds.values())
    return expected, got if isinstance(got, list) else [got]


def assert_matches(model, feeds, tolerance=TOLERANCE):
    expected, got = run_both(model, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance)


@pytest.fixture
def rng():
    return np.random.default_rng(11)


# -- ConstantOfShape of the empty shape --------------------------------------------------------


@pytest.mark.parametrize("value, dtype", [(2.5, TensorProto.FLOAT), (None, TensorProto.FLOAT), (3, TensorProto.INT64)],
                         ids=["float-value", "default-zero", "int64-value"])
def test_constant_of_shape_of_the_empty_shape_is_a_scalar(rng, value, dtype):
    attrs = {} if value is None else {"value": helper.make_tensor("v", dtype, [1], [value])}
    numpy_type = helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [
        helper.make_node("ConstantOfShape", ["empty"], ["scalar"], **attrs),
        helper.make_node("Cast", ["x"], ["x_cast"], to=dtype),
        helper.make_node("Add", ["x_cast", "scalar"], ["y"]),
    ]
    model = make_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", dtype, [3, 4]), helper.make_tensor_value_info("scalar", dtype, [])],
        [helper.make_tensor("empty", TensorProto.INT64, [0], [])])
    x = (rng.standard_normal((3, 4)) * 10).astype(np.float32)
    expected, got = run_both(model, {"x": x})
    assert got[1].shape == () and got[1].dtype == numpy_type
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=TOLERANCE, atol=TOLERANCE)


def test_constant_of_shape_of_a_dynamic_shape(rng):
    """The shape operand is Shape(x) of a dynamic input: a broadcast, run at two sizes."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["fill"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.75])),
        helper.make_node("Mul", ["x", "fill"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])])
    for rows in (2, 7):
        assert_matches(model, {"x": rng.standard_normal((rows, 5)).astype(np.float32)})


def test_constant_of_shape_rejects_a_value_of_several_elements():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["y"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]))]
    graph = helper.make_graph(nodes, "bad", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              initializer=[helper.make_tensor("shape", TensorProto.INT64, [1], [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(forge.OperatorConversionError, match=r"ConstantOfShape.*value must hold one element"):
        forge.from_onnx(model)


# -- Size of a shape value -----------------------------------------------------------------------


def _size_in_if_model(rows):
    """k = If(sum(x) > 0, Size(Shape(x)), Size(x)); y = x * k."""
    def branch(name, nodes, output):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.INT64, [])])

    then_branch = branch("then", [helper.make_node("Shape", ["x"], ["s"], name="then_shape"),
                                  helper.make_node("Size", ["s"], ["rank"], name="then_size")], "rank")
    else_branch = branch("else", [helper.make_node("Size", ["x"], ["count"], name="else_size")], "count")
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["k"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Cast", ["k"], ["k_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "k_float"], ["y"]),
    ]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3])],
                      [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])


@pytest.mark.parametrize("rows", ["n", 4], ids=["dynamic", "static"])
def test_if_branch_computing_size_of_a_shape(rng, rows):
    """TVM failed with "size expects a tensor input, but received R.Shape" for the dynamic case."""
    model = _size_in_if_model(rows)
    for count in ((3, 4) if rows == "n" else (4,)):
        x = rng.standard_normal((count, 3)).astype(np.float32)
        for sign in (1.0, -1.0):  # both branches
            value = np.abs(x) * sign
            assert_matches(model, {"x": value.astype(np.float32)})


def test_shape_values_reach_operators_that_take_tensors_only(rng):
    """Size(Shape(x)) and Mul(Shape(x), 2) in the main graph, x dynamic (TVM: "cannot handle ShapeExpr inputs")."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Size", ["s"], ["rank"]),
        helper.make_node("Mul", ["s", "two"], ["doubled"]),
        helper.make_node("ReduceSum", ["doubled"], ["total"], keepdims=0),
        helper.make_node("Mul", ["rank", "total"], ["k"]),
        helper.make_node("Cast", ["k"], ["k_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "k_float"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                       [helper.make_tensor("two", TensorProto.INT64, [], [2])])
    for rows in (1, 5):
        assert_matches(model, {"x": rng.standard_normal((rows, 3)).astype(np.float32)})


# -- Range over the sequence length ------------------------------------------------------------------


def test_range_over_a_dynamic_length_keeps_the_sequence_dim(rng):
    """positions = Range(0, Shape(x)[1]) added to x[..., :1]; a causal mask from two such ranges."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["length"], axis=0),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "last"], ["column"]),
        helper.make_node("LessOrEqual", ["positions", "column"], ["causal"]),  # (seq, seq)
        helper.make_node("Cast", ["causal"], ["causal_float"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["causal_float", "x"], ["cumulative"]),  # (batch, seq, features)
        helper.make_node("Cast", ["column"], ["column_float"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["cumulative", "column_float"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])],
                       [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
                        helper.make_tensor("one", TensorProto.INT64, [], [1]),
                        helper.make_tensor("last", TensorProto.INT64, [1], [1])])
    ir = forge.from_onnx(model)
    assert ir.output_shapes == [(-1, -1, 4)]
    assert "sequence" in str(ir.mod["main"].ret_ty)  # positions took the input's own dim
    for batch, sequence in ((2, 6), (1, 9)):
        assert_matches(model, {"x": rng.standard_normal((batch, sequence, 4)).astype(np.float32)})


def test_expand_to_a_shape_read_at_run_time_broadcasts_both_ways(rng):
    """Expand's shape a graph input: a 1 in it keeps the input's dim (TVM gave (2, 1, 6) for (2, 3, 6))."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["d0", "d1", "d2"])])
    x = rng.standard_normal((3, 1)).astype(np.float32)
    for shape in ([2, 1, 6], [1, 3, 1], [4, 3, 2]):
        assert_matches(model, {"x": x, "shape": np.array(shape, dtype=np.int64)})
