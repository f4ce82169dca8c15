"""Each introspection value against figures computed separately from the ONNX graph."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net, light_model_path, two_io_net
from onnx import numpy_helper

import forge

ONNX_TO_NUMPY = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64"}


def onnx_inputs(model):
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def dims(vi):
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim)


@pytest.mark.parametrize("factory", [conv_bn_net, two_io_net])
def test_inputs_and_outputs_match_the_onnx_graph(factory):
    model = factory()
    ir = forge.from_onnx(model)
    ins = onnx_inputs(model)
    assert ir.input_count == len(ins)
    assert ir.input_names == [vi.name for vi in ins]
    assert ir.input_shapes == [dims(vi) for vi in ins]
    assert ir.input_dtypes == [ONNX_TO_NUMPY[vi.type.tensor_type.elem_type] for vi in ins]
    outs = list(model.graph.output)
    assert ir.output_count == len(outs)
    assert ir.output_names == [vi.name for vi in outs]
    assert ir.output_shapes == [dims(vi) for vi in outs]
    assert ir.output_dtypes == [ONNX_TO_NUMPY[vi.type.tensor_type.elem_type] for vi in outs]


def test_light_resnet50_signature_against_onnxruntime():
    path = light_model_path("resnet50")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ir = forge.from_onnx(path)
    assert ir.input_names == [i.name for i in session.get_inputs()]
    assert ir.input_shapes == [tuple(i.shape) for i in session.get_inputs()]
    assert ir.output_shapes == [tuple(o.shape) for o in session.get_outputs()]
    model = onnx.load(str(path))
    op_counts = Counter(node.op_type for node in model.graph.node)
    ops = ir.operators
    assert ops["nn.conv2d"] == op_counts["Conv"] == 53
    assert ops["nn.relu"] == op_counts["Relu"]
    assert ops["nn.max_pool2d"] == op_counts["MaxPool"]
    assert ops["nn.avg_pool2d"] == op_counts["AveragePool"]
    assert ops["nn.softmax"] == op_counts["Softmax"]
    assert "nn.batch_norm" not in ops and op_counts["BatchNormalization"] == 53


def test_operator_counts_follow_the_graph_without_folding():
    model = conv_bn_net()
    op_counts = Counter(node.op_type for node in model.graph.node)
    ir = forge.from_onnx(model, fold_constants=False, fold_batch_norms=False)
    ops = ir.operators
    assert ops["nn.conv2d"] == op_counts["Conv"]
    assert ops["nn.batch_norm"] == op_counts["BatchNormalization"]
    assert ops["nn.relu"] == op_counts["Relu"]
    assert ops["matmul"] == op_counts["Gemm"]
    assert all(isinstance(v, int) and v > 0 for v in ops.values())


def test_params_hold_the_weights_when_not_frozen():
    model = conv_bn_net()
    float_weights = {
        init.name: numpy_helper.to_array(init) for init in model.graph.initializer if init.data_type == 1
    }
    ir = forge.from_onnx(model, freeze_params=False, fold_constants=False, fold_batch_norms=False)
    assert len(ir.params) == len(float_weights)
    assert sorted(ir.params) == sorted(f"param_{i}" for i in range(len(float_weights)))
    # Every ONNX weight is one of the params, byte for byte.
    param_arrays = [p.numpy() for p in ir.params.values()]
    for name, value in float_weights.items():
        assert any(p.shape == value.shape and np.array_equal(p, value) for p in param_arrays), name
    assert ir.input_names == ["x"]  # params are not inputs
    assert ir.weights_nbytes == sum(v.nbytes for v in float_weights.values())
    frozen = forge.from_onnx(model)
    assert frozen.params == {}


def test_dynamic_dimension_is_minus_one():
    ir = forge.from_onnx(conv_bn_net(batch="N"))
    assert ir.input_shapes == [(-1, 3, 16, 16)]
    assert ir.output_shapes == [(-1, 10)]
    assert forge.DYNAMIC_DIM == -1


def test_shape_override_makes_a_dynamic_batch_static_and_back():
    static = forge.from_onnx(conv_bn_net(batch="N"), shape={"x": (4, 3, 16, 16)})
    assert static.input_shapes == [(4, 3, 16, 16)]
    assert static.output_shapes == [(4, 10)]
    dynamic = forge.from_onnx(conv_bn_net(batch=1), shape={"x": (None, 3, 16, 16)})
    assert dynamic.input_shapes == [(-1, 3, 16, 16)]


def test_graph_counts_and_flags():
    ir = forge.from_onnx(conv_bn_net())
    assert ir.graph_count == 1
    assert ir.subgraph_count == 0
    assert (ir.is_calibrated, ir.is_quantized, ir.is_tensorrt, ir.is_split_tensors) == (False,) * 4


def test_mod_and_typed_mod_print_as_ir_text():
    ir = forge.from_onnx(conv_bn_net())
    text = str(ir.mod)
    assert "def main(" in text and "R.nn.conv2d" in text
    typed = str(ir.typed_mod)
    assert "R.Tensor((1, 10)" in typed


def test_summary_and_repr_give_inputs_outputs_ops_and_weights():
    ir = forge.from_onnx(two_io_net())
    summary = ir.summary()
    assert "a: (4, 16) float32" in summary and "ids: (4,) int64" in summary
    assert "probs: (4, 8) float32" in summary and "act: (4, 8) float32" in summary
    assert "matmul" in summary and "nn.softmax" in summary
    weight_bytes = (16 * 8 + 20 * 8) * 4
    assert ir.weights_nbytes == weight_bytes
    assert "1.1 KiB" in summary
    text = repr(ir)
    assert text.startswith("<forge.IRModule") and "a: (4, 16) float32" in text and "KiB" in text


def test_relay_module_alias_and_docs_spelling_of_the_loader():
    assert forge.RelayModule is forge.IRModule
    ir = forge.RelayModule.from_onnx(conv_bn_net())
    assert isinstance(ir, forge.IRModule)
