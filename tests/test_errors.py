"""Every error path of loading and running gives a clear error naming the problem."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from model_factory import IR_VERSION, OPSET, conv_bn_net, two_io_net, unsupported_ops_net
from onnx import TensorProto, helper

import forge
from forge_core.errors import OperatorConversionError


def test_unsupported_operators_are_listed_with_counts_and_a_node_each():
    with pytest.raises(forge.UnsupportedOperatorError) as info:
        forge.from_onnx(unsupported_ops_net())
    err = info.value
    assert err.unsupported == {"com.acme.FancyOp": (2, "fancy_1"), "com.acme.OtherOp": (1, "other")}
    message = str(err)
    assert "com.acme.FancyOp: 2 nodes, e.g. 'fancy_1'" in message
    assert "com.acme.OtherOp: 1 node, e.g. 'other'" in message
    assert "A plugin can supply a converter" in message and 'register("onnx", op_type, converter, domain=' in message
    assert isinstance(err, forge.ModelImportError) and not isinstance(err, AssertionError)


def test_unsupported_operator_inside_a_subgraph_is_found():
    then_graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["t"], name="inner_mystery", domain="com.acme")],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.acme", 1)],
                              ir_version=IR_VERSION)
    with pytest.raises(forge.UnsupportedOperatorError, match="com.acme.Mystery: 1 node, e.g. 'inner_mystery'"):
        forge.from_onnx(model)


def test_a_node_that_fails_to_convert_is_named_with_its_op():
    # Pad whose pads are a model input: the importer supports only constant pads.
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="dynamic_pad")]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    with pytest.raises(OperatorConversionError) as info:
        forge.from_onnx(model)
    assert info.value.node == "dynamic_pad" and info.value.op_type == "Pad"
    assert "node 'dynamic_pad' (op Pad)" in str(info.value)
    assert "pads are computed from values known only at run time" in str(info.value)


def test_a_file_that_is_not_onnx_is_rejected(tmp_path):
    path = tmp_path / "not_a_model.onnx"
    path.write_text("this is a text file, not a protobuf\n" * 10)
    with pytest.raises(forge.ModelImportError, match="not a valid ONNX model"):
        forge.from_onnx(path)


def test_bytes_that_are_not_onnx_are_rejected():
    with pytest.raises(forge.ModelImportError, match="not a valid ONNX model"):
        forge.from_onnx(b"\x08\x07garbage")


def test_an_empty_file_is_rejected(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(forge.ModelImportError, match="no graph"):
        forge.from_onnx(path)


def test_a_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        forge.from_onnx(missing)


def test_a_wrong_argument_type_is_named():
    with pytest.raises(TypeError, match="expects an onnx.ModelProto, a path"):
        forge.from_onnx(42)


def test_too_old_ir_version_is_rejected():
    model = conv_bn_net()
    model.ir_version = 2
    with pytest.raises(forge.ModelImportError, match="IR version 2"):
        forge.from_onnx(model)


def test_shape_for_an_unknown_input_names_the_inputs():
    with pytest.raises(forge.ModelImportError, match="input 'nope'.*Inputs: x"):
        forge.from_onnx(conv_bn_net(), shape={"nope": (1, 3, 16, 16)})


def test_shape_of_the_wrong_rank_names_both_shapes():
    with pytest.raises(forge.ModelImportError, match=r"rank 2: \(1, 3\).*rank 4: \(1, 3, 16, 16\)"):
        forge.from_onnx(conv_bn_net(), shape={"x": (1, 3)})


def test_the_callers_model_is_not_modified():
    model = conv_bn_net(batch="N")
    model.graph.node[0].name = ""
    before = model.SerializeToString()
    forge.from_onnx(model, shape={"x": (2, 3, 16, 16)})
    assert model.SerializeToString() == before


def test_convert_config_is_not_honoured_and_says_so():
    with pytest.warns(UserWarning, match="convert_config is not honoured"):
        forge.from_onnx(conv_bn_net(), convert_config={"use_nt_batch_matmul": True})


def test_node_renamed_model_is_exported(tmp_path):
    model = conv_bn_net()
    for node in model.graph.node:
        node.name = ""
    out = tmp_path / "sub" / "renamed.onnx"
    forge.from_onnx(model, export_node_renamed_model_path=out)
    renamed = onnx.load(str(out))
    assert [n.name for n in renamed.graph.node][:3] == ["Conv_0", "BatchNormalization_1", "Relu_2"]
    assert [p.name for p in out.parent.iterdir()] == ["renamed.onnx"]


@pytest.fixture(scope="module")
def fn():
    return forge.from_onnx(two_io_net()).get_inference_function()


class TestInferenceFunctionInputs:
    def good(self):
        return np.zeros((4, 16), np.float32), np.zeros(4, np.int64)

    def test_wrong_count(self, fn):
        with pytest.raises(forge.InputError, match=r"takes 2 inputs \('a', 'ids'\); 1 was given"):
            fn(self.good()[0])

    def test_wrong_dtype(self, fn):
        a, ids = self.good()
        with pytest.raises(forge.InputError, match=r"Input 'a' \(#0\): expected dtype float32, given float64"):
            fn(a.astype(np.float64), ids)

    def test_wrong_shape(self, fn):
        a, ids = self.good()
        with pytest.raises(forge.InputError, match=r"Input 'ids' \(#1\): expected shape \(4,\), given \(5,\)"):
            fn(a, np.zeros(5, np.int64))

    def test_wrong_rank(self, fn):
        a, ids = self.good()
        with pytest.raises(forge.InputError, match=r"Input 'a' \(#0\): expected shape \(4, 16\), given \(1, 4, 16\)"):
            fn(a[None], ids)

    def test_good_inputs_run(self, fn):
        probs, act = fn(*self.good())
        assert probs.shape == (4, 8) and act.shape == (4, 8)


def test_dynamic_dimension_accepts_any_size_but_checks_the_rest():
    fn = forge.from_onnx(conv_bn_net(batch="N")).get_inference_function()
    assert fn(np.zeros((5, 3, 16, 16), np.float32)).shape == (5, 10)
    with pytest.raises(forge.InputError, match=r"expected shape \(\?, 3, 16, 16\), given \(5, 3, 16, 15\)"):
        fn(np.zeros((5, 3, 16, 15), np.float32))


def test_irmodule_rejects_what_is_not_a_relax_module():
    with pytest.raises(TypeError, match="expects a TVM Relax IRModule"):
        forge.IRModule("not a module")


def test_irmodule_rejects_params_that_are_not_parameters():
    ir = forge.from_onnx(conv_bn_net())
    with pytest.raises(ValueError, match="'bogus'"):
        forge.IRModule(ir.mod, params={"bogus": np.zeros(3, np.float32)})


def test_inference_on_an_absent_gpu_is_a_clear_error():
    ir = forge.from_onnx(conv_bn_net())
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("a CUDA GPU is present; the error path is for machines without one")
    with pytest.raises(forge.ForgeError, match="No cuda device is present"):
        ir.get_inference_function(target="cuda")
