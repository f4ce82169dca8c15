"""The ONNX family of the malformed-model fuzz corpus (tests/model_fuzz.py).

Cases are mutations of real models: the small graphs and the model-zoo "light"
graphs that the onnx wheel ships (``onnx/backend/test/data``), and a few graphs
built here with onnx.helper, with named nodes, initializers, Constant nodes, an
If and an LSTM. Kinds:

* bytes-*: flips, truncations, splices (random bytes or another model's), deleted,
  inserted and duplicated ranges of the serialized protobuf;
* graph structure: cycles, nodes out of topological order, dangling node inputs,
  graph outputs and inputs that name nothing, missing initializers, duplicate
  node outputs, graph inputs, initializers and node names;
* tensors: initializers and Constant values whose data does not match their
  dims, wrong, undefined or unknown element types, negative, zero or huge dims,
  external data that is missing or outside the model's folder;
* model fields: unknown, zero or negative opset and IR versions, no default
  opset, unknown domains;
* nodes: unknown or swapped op types, attributes of the wrong type, unknown,
  missing or out of range, too many or too few inputs and outputs, empty input
  names.

Every case is written to ``workdir`` as ``<id>.onnx`` and loaded from that path
by :func:`run_case` with ``forge.from_onnx``. A model Forge loads is checked: when
onnxruntime accepts it and it is small, Forge's compiled outputs must match
onnxruntime's on random inputs; when onnxruntime and ``onnx.checker`` (full check)
both reject it, Forge must not run it and produce numbers.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"
LIGHT = ("squeezenet", "shufflenet", "inception_v1", "bvlc_alexnet")  # the quicker of the nine to import
LIGHT_SHARE = 0.02
HELPER_SHARE = 0.45
OPSET = 17
IR_VERSION = 10  # what onnxruntime 1.31 takes
MAX_VERIFY_ELEMENTS = 1 << 20  # inputs larger than this are not run
RTOL = 1e-4

Case = dict[str, Any]
Mutation = tuple[str, list[str]]  # what was done, and the names an error about it should mention
FIELD_NAMES = ["opset_import", "opset", "ir_version", "IR version", "elem_type", "data_type", "dims", "raw_data",
               "domain"]


# ----------------------------------------------------------------------------------------------------
# Base models
# ----------------------------------------------------------------------------------------------------


def _vi(name: str, elem: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], positive: bool = False) -> TensorProto:
    data = rng.standard_normal(shape).astype(np.float32) * 0.5
    return numpy_helper.from_array(np.abs(data) + 0.5 if positive else data, name)


def _model(name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[TensorProto],
           domains: dict[str, int] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def _helper_models() -> dict[str, onnx.ModelProto]:
    """Small valid graphs with named nodes, built with onnx.helper."""
    rng = np.random.default_rng(17)
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    models = {}
    models["convnet"] = _model("convnet", [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p1"], ["f1"], "flatten", axis=1),
        helper.make_node("Gemm", ["f1", "w2", "b2"], ["g1"], "fc", transB=1, alpha=1.0),
        helper.make_node("Softmax", ["g1"], ["y"], "softmax", axis=1),
    ], [_vi("x", f, [1, 3, 8, 8])], [_vi("y", f, [1, 10])],
        [_init(rng, "w1", (4, 3, 3, 3)), _init(rng, "b1", (4,)), _init(rng, "w2", (10, 64)), _init(rng, "b2", (10,))])
    models["mlp"] = _model("mlp", [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], "mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], "add1"),
        helper.make_node("LeakyRelu", ["a1"], ["l1"], "leaky", alpha=0.2),
        helper.make_node("MatMul", ["l1", "w2"], ["m2"], "mm2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], "add2"),
        helper.make_node("Tanh", ["a2"], ["y"], "tanh"),
    ], [_vi("x", f, [2, 6])], [_vi("y", f, [2, 3])],
        [_init(rng, "w1", (6, 5)), _init(rng, "b1", (5,)), _init(rng, "w2", (5, 3)), _init(rng, "b2", (3,))])
    models["shapes"] = _model("shapes", [
        helper.make_node("Transpose", ["x"], ["t"], "transpose", perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["rx"], "reshape_x"),
        helper.make_node("Reshape", ["y", "shape"], ["ry"], "reshape_y"),
        helper.make_node("Concat", ["rx", "ry"], ["cat"], "concat", axis=0),
        helper.make_node("Slice", ["cat", "starts", "ends", "axes"], ["sl"], "slice"),
        helper.make_node("ReduceMean", ["sl"], ["rm"], "reduce", axes=[1], keepdims=1),
        helper.make_node("Unsqueeze", ["rm", "uaxes"], ["u"], "unsqueeze"),
        helper.make_node("Cast", ["u"], ["z"], "cast", to=TensorProto.DOUBLE),
    ], [_vi("x", f, [2, 3, 4]), _vi("y", f, [2, 3, 4])], [_vi("z", TensorProto.DOUBLE, [1, 3, 1])],
        [numpy_helper.from_array(np.array([2, 12], np.int64), "shape"),
         numpy_helper.from_array(np.array([0], np.int64), "starts"),
         numpy_helper.from_array(np.array([3], np.int64), "ends"),
         numpy_helper.from_array(np.array([0], np.int64), "axes"),
         numpy_helper.from_array(np.array([0], np.int64), "uaxes")])
    models["gather"] = _model("gather", [
        helper.make_node("Gather", ["data", "indices"], ["g"], "gather", axis=0),
        helper.make_node("Split", ["g", "split"], ["s0", "s1"], "split", axis=0),
        helper.make_node("Expand", ["s0", "eshape"], ["e"], "expand"),
        helper.make_node("Add", ["e", "s1"], ["a"], "add"),
        helper.make_node("Greater", ["a", "zero"], ["gt"], "greater"),
        helper.make_node("Where", ["gt", "a", "zero"], ["w"], "where"),
        helper.make_node("Clip", ["w", "lo", "hi"], ["c"], "clip"),
        helper.make_node("TopK", ["c", "k"], ["values", "idx"], "topk", axis=1),
    ], [_vi("data", f, [5, 4])], [_vi("values", f, [2, 2]), _vi("idx", i64, [2, 2])],
        [numpy_helper.from_array(np.array([0, 2, 4], np.int64), "indices"),
         numpy_helper.from_array(np.array([1, 2], np.int64), "split"),
         numpy_helper.from_array(np.array([2, 4], np.int64), "eshape"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
         numpy_helper.from_array(np.array(0.1, np.float32), "lo"),
         numpy_helper.from_array(np.array(1.5, np.float32), "hi"),
         numpy_helper.from_array(np.array([2], np.int64), "k")])
    models["norm"] = _model("norm", [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"], "bn", epsilon=1e-5),
        helper.make_node("LayerNormalization", ["bn", "ln_scale", "ln_bias"], ["ln"], "layernorm", axis=-1),
        helper.make_node("Pad", ["ln", "pads"], ["pad"], "pad", mode="constant"),
        helper.make_node("AveragePool", ["pad"], ["ap"], "avgpool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["ap"], ["y"], "gap"),
    ], [_vi("x", f, [2, 3, 4, 4])], [_vi("y", f, [2, 3, 1, 1])],
        [_init(rng, "scale", (3,)), _init(rng, "bias", (3,)), _init(rng, "mean", (3,)),
         _init(rng, "var", (3,), positive=True), _init(rng, "ln_scale", (4,)), _init(rng, "ln_bias", (4,)),
         numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")])
    then_graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["then_out"], "then_add")], "then",
                                   [], [_vi("then_out", f, [3])])
    else_graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["else_out"], "else_mul")], "else",
                                   [], [_vi("else_out", f, [3])])
    models["branch"] = _model("branch", [
        helper.make_node("If", ["cond"], ["branch_out"], "if", then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Relu", ["branch_out"], ["y"], "relu"),
    ], [_vi("x", f, [3]), _vi("cond", TensorProto.BOOL, [])], [_vi("y", f, [3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "one"),
         numpy_helper.from_array(np.full(3, 2.0, np.float32), "two")])
    models["lstm"] = _model("lstm", [
        helper.make_node("LSTM", ["x", "w", "r", "b"], ["seq", "h"], "lstm", hidden_size=4),
        helper.make_node("Sigmoid", ["h"], ["y"], "sigmoid"),
    ], [_vi("x", f, [2, 1, 3])], [_vi("seq", f, [2, 1, 1, 4]), _vi("y", f, [1, 1, 4])],
        [_init(rng, "w", (1, 16, 3)), _init(rng, "r", (1, 16, 4)), _init(rng, "b", (1, 32))])
    models["constants"] = _model("constants", [
        helper.make_node("Constant", [], ["scale"], "scale_const",
                         value=numpy_helper.from_array(np.array([0.5, 2.0, -1.0], np.float32), "scale_value")),
        helper.make_node("Constant", [], ["offset"], "offset_const", value_float=0.25),
        helper.make_node("Mul", ["x", "scale"], ["m"], "mul"),
        helper.make_node("Add", ["m", "offset"], ["a"], "add"),
        helper.make_node("Erf", ["a"], ["e"], "erf"),
        helper.make_node("Softmax", ["e"], ["s"], "softmax", axis=-1),
        helper.make_node("Transpose", ["s"], ["y"], "transpose", perm=[1, 0]),
    ], [_vi("x", f, [2, 3])], [_vi("y", f, [3, 2])], [])
    # ONNX-ML (scikit-learn's exports) and onnxruntime's contrib operators: Forge's own converters.
    models["sklearn"] = _model("sklearn", [
        helper.make_node("Scaler", ["x"], ["scaled"], "scaler", domain="ai.onnx.ml", offset=[0.1, -0.2, 0.3, 0.0],
                         scale=[2.0, 0.5, 1.0, 1.5]),
        helper.make_node("TreeEnsembleRegressor", ["scaled"], ["tree"], "trees", domain="ai.onnx.ml", n_targets=1,
                         nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2],
                         nodes_featureids=[0, 0, 0, 2, 0, 0], nodes_values=[0.1, 0.0, 0.0, -0.3, 0.0, 0.0],
                         nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"],
                         nodes_truenodeids=[1, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
                         nodes_missing_value_tracks_true=[0, 0, 0, 1, 0, 0],
                         target_treeids=[0, 0, 1, 1], target_nodeids=[1, 2, 1, 2], target_ids=[0, 0, 0, 0],
                         target_weights=[0.5, -1.0, 2.0, 0.25], aggregate_function="SUM"),
        helper.make_node("LinearClassifier", ["scaled"], ["label", "scores"], "linear", domain="ai.onnx.ml",
                         classlabels_ints=[0, 1, 2], coefficients=[float(v) for v in rng.standard_normal(12)],
                         intercepts=[0.1, -0.1, 0.0], post_transform="SOFTMAX"),
    ], [_vi("x", f, [3, 4])], [_vi("tree", f, [3, 1]), _vi("label", i64, [3]), _vi("scores", f, [3, 3])], [],
        domains={"ai.onnx.ml": 3})
    models["contrib"] = _model("contrib", [
        helper.make_node("FusedConv", ["x", "w", "b"], ["c"], "fused_conv", domain="com.microsoft",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], activation="LeakyRelu", activation_params=[0.1]),
        helper.make_node("QuickGelu", ["c"], ["g"], "quick_gelu", domain="com.microsoft", alpha=1.702),
        helper.make_node("FusedMatMul", ["g", "m"], ["y"], "fused_matmul", domain="com.microsoft", alpha=0.5,
                         transB=1),
    ], [_vi("x", f, [1, 2, 5, 5])], [_vi("y", f, [1, 4, 5, 6])],
        [_init(rng, "w", (4, 2, 3, 3)), _init(rng, "b", (4,)), _init(rng, "m", (6, 5))],
        domains={"com.microsoft": 1})
    # onnxruntime's quantize_dynamic of an LSTM (converters/microsoft.py): int8 weights, X and the state quantized
    # to uint8 at run time. A generator of its own: the models after it keep their weights.
    lstm_rng = np.random.default_rng(23)
    lstm_weights = [numpy_helper.from_array(lstm_rng.integers(-127, 128, (1, rows, 16)).astype(np.int8), f"{name}_q")
                    for name, rows in (("w", 3), ("r", 4))]
    models["quantized_lstm"] = _model("quantized_lstm", [
        helper.make_node("DynamicQuantizeLSTM", ["x", "w_q", "r_q", "lstm_b", "", "", "", "", "w_scale", "w_zero",
                                                 "r_scale", "r_zero"], ["y", "y_h", "y_c"], "quantized_lstm",
                         domain="com.microsoft", hidden_size=4, direction="forward"),
    ], [_vi("x", f, [5, 1, 3])], [_vi("y", f, [5, 1, 1, 4]), _vi("y_h", f, [1, 1, 4]), _vi("y_c", f, [1, 1, 4])],
        [*lstm_weights, _init(lstm_rng, "lstm_b", (1, 32)),
         numpy_helper.from_array(np.array([0.004], np.float32), "w_scale"),
         numpy_helper.from_array(np.array([0.006], np.float32), "r_scale"),
         numpy_helper.from_array(np.zeros(1, np.int8), "w_zero"),
         numpy_helper.from_array(np.zeros(1, np.int8), "r_zero")],
        domains={"com.microsoft": 1})
    # onnxruntime's QOperator quantization (converters/qoperator.py, QLinearConv in quantized.py): uint8 activations,
    # int8 weights, scales and zero points as initializers. A generator of its own, as above.
    q_rng = np.random.default_rng(29)

    def q_scalar(name: str, value: float | int, dtype: str) -> TensorProto:
        return numpy_helper.from_array(np.array(value, dtype), name)

    models["qoperator"] = _model("qoperator", [
        helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], "quantize"),
        helper.make_node("QLinearConv", ["xq", "s_x", "z_x", "w_q", "s_w", "z_w", "s_c", "z_c", "b_q"], ["cq"],
                         "qconv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("QLinearLeakyRelu", ["cq", "s_c", "z_c", "s_c", "z_c"], ["lq"], "qleaky",
                         domain="com.microsoft", alpha=0.1),
        helper.make_node("QLinearAdd", ["lq", "s_c", "z_c", "cq", "s_c", "z_c", "s_a", "z_a"], ["aq"], "qadd",
                         domain="com.microsoft"),
        helper.make_node("QLinearGlobalAveragePool", ["aq", "s_a", "z_a", "s_a", "z_a"], ["pq"], "qpool",
                         domain="com.microsoft"),
        helper.make_node("DequantizeLinear", ["pq", "s_a", "z_a"], ["y"], "dequantize"),
    ], [_vi("x", f, [1, 2, 6, 6])], [_vi("y", f, [1, 4, 1, 1])],
        [numpy_helper.from_array(q_rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8), "w_q"),
         numpy_helper.from_array(q_rng.integers(-500, 500, 4).astype(np.int32), "b_q"),
         q_scalar("s_x", 0.02, "float32"), q_scalar("z_x", 128, "uint8"), q_scalar("s_w", 0.01, "float32"),
         q_scalar("z_w", 0, "int8"), q_scalar("s_c", 0.05, "float32"), q_scalar("z_c", 100, "uint8"),
         q_scalar("s_a", 0.08, "float32"), q_scalar("z_a", 90, "uint8")],
        domains={"com.microsoft": 1})
    # ONNX's signal operators (converters/signal.py): a speech front end's STFT, then a DFT over frames.
    models["signal"] = _model("signal", [
        helper.make_node("STFT", ["audio", "step", "window"], ["spectrum"], "stft"),
        helper.make_node("DFT", ["spectrum"], ["y"], "dft", axis=1),
    ], [_vi("audio", f, [1, 96, 1])], [_vi("y", f, ["one", "frames", "bins", "parts"])],
        [numpy_helper.from_array(np.array(16, np.int64), "step"),
         numpy_helper.from_array(np.hanning(16).astype(np.float32), "window")])
    # onnxruntime's transformer optimizer's operators (converters/microsoft_bert.py).
    hidden = 8
    models["bert_contrib"] = _model("bert_contrib", [
        helper.make_node("EmbedLayerNormalization", ["ids", "", "words", "positions", "", "gamma", "beta", "mask"],
                         ["embedded", "mask_index"], "embed", domain="com.microsoft", epsilon=1e-5),
        helper.make_node("Attention", ["embedded", "qkv", "qkv_bias", "mask_index"], ["attended"], "attention",
                         domain="com.microsoft", num_heads=2),
        helper.make_node("SkipLayerNormalization", ["attended", "embedded", "gamma", "beta", "skip_bias"],
                         ["normed"], "skip_norm", domain="com.microsoft", epsilon=1e-5),
        helper.make_node("FastGelu", ["normed", "gelu_bias"], ["y"], "fast_gelu", domain="com.microsoft"),
    ], [_vi("ids", TensorProto.INT32, [2, 5]), _vi("mask", TensorProto.INT32, [2, 5])], [_vi("y", f, [2, 5, hidden])],
        [_init(rng, "words", (11, hidden)), _init(rng, "positions", (6, hidden)),
         numpy_helper.from_array((np.abs(rng.standard_normal(hidden)) + 0.5).astype(np.float32), "gamma"),
         _init(rng, "beta", (hidden,)), _init(rng, "qkv", (hidden, 3 * hidden)), _init(rng, "qkv_bias", (3 * hidden,)),
         _init(rng, "skip_bias", (hidden,)), _init(rng, "gelu_bias", (hidden,))],
        domains={"com.microsoft": 1})
    # Loop and Scan (forge_onnx/loops.py); trip counts bounded by a tensor's dims, so that a flipped byte cannot
    # make either runtime loop for ages: a running sum scanned over axis 1, then a loop over the same steps that
    # stops once its state grows past a limit.
    scan_body = helper.make_graph([
        helper.make_node("Add", ["sum_in", "x_t"], ["sum_out"], "scan_add"),
        helper.make_node("Tanh", ["sum_out"], ["seen"], "scan_tanh"),
    ], "scan_body", [_vi("sum_in", f, [1, 4]), _vi("x_t", f, [1, 4])], [_vi("sum_out", f, [1, 4]), _vi("seen", f, [1, 4])])
    loop_body = helper.make_graph([
        helper.make_node("MatMul", ["h_in", "w"], ["hw"], "loop_matmul"),
        helper.make_node("Add", ["hw", "h_in"], ["h_out"], "loop_add"),
        helper.make_node("ReduceL2", ["h_out"], ["norm"], "loop_norm", keepdims=0),
        helper.make_node("Less", ["norm", "limit"], ["go"], "loop_go"),
        helper.make_node("Sigmoid", ["h_out"], ["h_seen"], "loop_seen"),
    ], "loop_body", [_vi("i", TensorProto.INT64, []), _vi("cond", TensorProto.BOOL, []), _vi("h_in", f, [1, 4])],
        [_vi("go", TensorProto.BOOL, []), _vi("h_out", f, [1, 4]), _vi("h_seen", f, [1, 4])])
    models["control_flow"] = _model("control_flow", [
        helper.make_node("Scan", ["s0", "x"], ["s", "ys"], "scan", body=scan_body, num_scan_inputs=1,
                         scan_input_axes=[1], scan_output_axes=[1]),
        helper.make_node("Shape", ["x"], ["dims"], "dims"),
        helper.make_node("Gather", ["dims", "one"], ["steps"], "steps", axis=0),
        helper.make_node("Loop", ["steps", "", "s"], ["h", "hs"], "loop", body=loop_body),
        helper.make_node("ReduceSum", ["hs", "zero"], ["h_total"], "h_total", keepdims=0),
        helper.make_node("Add", ["h", "h_total"], ["y"], "y"),
    ], [_vi("s0", f, [1, 4]), _vi("x", f, [1, 6, 4])], [_vi("y", f, [1, 4]), _vi("ys", f, [1, 6, 4])],
        [_init(rng, "w", (4, 4)), numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array(20.0, np.float32), "limit")])
    return models


@functools.lru_cache(maxsize=1)
def base_models() -> tuple[tuple[str, bytes, bool], ...]:
    """``(name, serialized model, small)`` for every base model, in a fixed order; small ones are compiled."""
    bases = [(f"helper/{name}", model.SerializeToString(), True) for name, model in _helper_models().items()]
    for folder in ("pytorch-converted", "pytorch-operator", "simple"):
        for path in sorted((DATA / folder).glob("*/model.onnx")):
            bases.append((f"{folder}/{path.parent.name}", path.read_bytes(), True))
    for name in LIGHT:
        bases.append((f"light/{name}", (DATA / "light" / f"light_{name}.onnx").read_bytes(), False))
    return tuple(bases)


# ----------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in its nodes' attributes."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


def _pick_graph(model: onnx.ModelProto, rng: random.Random) -> onnx.GraphProto:
    """The main graph mostly; a subgraph now and then."""
    graphs = list(_graphs(model.graph))
    return graphs[0] if len(graphs) == 1 or rng.random() < 0.7 else rng.choice(graphs[1:])


def _label(node: onnx.NodeProto) -> list[str]:
    return [n for n in (node.name, node.op_type) if n]


def _describe(node: onnx.NodeProto) -> str:
    return f"node {node.name or '<unnamed>'!r} ({node.op_type})"


def _initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer}


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    inits = _initializer_names(graph)
    return [vi for vi in graph.input if vi.name not in inits]


def _consumers(graph: onnx.GraphProto, name: str) -> list[str]:
    return [n for node in graph.node if name in node.input for n in _label(node)]


def _all_names(model: onnx.ModelProto) -> list[str]:
    """Every name in a model: nodes, op types, values, attributes, domains; and the field names."""
    names: set[str] = set(FIELD_NAMES)
    for graph in _graphs(model.graph):
        names.update(vi.name for vi in [*graph.input, *graph.output, *graph.value_info])
        names.update(t.name for t in graph.initializer)
        for node in graph.node:
            names.update([node.name, node.op_type, node.domain, *node.input, *node.output])
            names.update(a.name for a in node.attribute)
    return sorted(n for n in names if n)


def _tensors(model: onnx.ModelProto) -> list[tuple[TensorProto, list[str]]]:
    """Initializers and Constant nodes' values, each with the names that identify it."""
    found = []
    for graph in _graphs(model.graph):
        found += [(t, [t.name]) for t in graph.initializer]
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR:
                    found.append((attr.t, [n for n in (attr.t.name, *_label(node), *node.output) if n]))
    return found


def _descendants(graph: onnx.GraphProto, start: int) -> list[int]:
    """Indices of the nodes that depend on node ``start`` (itself included)."""
    produced = set(graph.node[start].output)
    found = [start]
    for index in range(start + 1, len(graph.node)):
        if produced & set(graph.node[index].input):
            found.append(index)
            produced |= set(graph.node[index].output)
    return found


def _defined_before(graph: onnx.GraphProto, index: int) -> list[str]:
    names = [vi.name for vi in graph.input] + [t.name for t in graph.initializer]
    for node in graph.node[:index]:
        names += [o for o in node.output if o]
    return names


# ----------------------------------------------------------------------------------------------------
# Byte mutations
# ----------------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, kind: str, rng: random.Random, donor: bytes) -> tuple[bytes, str]:
    """A byte-level mutation of a serialized model, and what it did."""
    size = len(data)
    start = rng.randrange(size)
    length = rng.choice([1, 2, 3, 4, 8, 16, 64, 256])
    end = min(size, start + length)
    if kind == "bytes-flip":
        changed = bytearray(data)
        flips = rng.choice([1, 1, 2, 4, 8])
        for _ in range(flips):
            changed[rng.randrange(size)] ^= 1 << rng.randrange(8)
        return bytes(changed), f"{flips} bit(s) flipped"
    if kind == "bytes-truncate":
        cut = rng.randrange(size)
        return data[:cut], f"truncated to {cut} of {size} bytes"
    if kind == "bytes-splice":
        return data[:start] + rng.randbytes(end - start) + data[end:], f"bytes {start}:{end} randomized"
    if kind == "bytes-donor":
        return data[:start] + donor[start:end] + data[end:], f"bytes {start}:{end} from another model"
    if kind == "bytes-delete":
        return data[:start] + data[end:], f"bytes {start}:{end} deleted"
    if kind == "bytes-insert":
        return data[:start] + rng.randbytes(length) + data[start:], f"{length} random bytes inserted at {start}"
    if kind == "bytes-duplicate":
        return data[:end] + data[start:end] + data[end:], f"bytes {start}:{end} duplicated"
    raise ValueError(kind)


BYTE_KINDS = ("bytes-flip", "bytes-truncate", "bytes-splice", "bytes-donor", "bytes-delete", "bytes-insert",
              "bytes-duplicate")


# ----------------------------------------------------------------------------------------------------
# Structural mutations: each edits the model in place and returns (detail, names), or None if it does not apply
# ----------------------------------------------------------------------------------------------------


def _cycle(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    candidates = [i for i, node in enumerate(graph.node) if node.input and any(node.input)]
    if not candidates:
        return None
    first = rng.choice(candidates)
    later = graph.node[rng.choice(_descendants(graph, first))]
    if not any(later.output):
        return None
    value = rng.choice([o for o in later.output if o])
    node = graph.node[first]
    slot = rng.choice([k for k, name in enumerate(node.input) if name])
    node.input[slot] = value
    return (f"input {slot} of {_describe(node)} reads {value!r}, an output of {_describe(later)} that depends on it",
            [*_label(node), value])


def _unsorted(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if len(graph.node) < 2:
        return None
    nodes = list(graph.node)
    order = list(range(len(nodes)))
    while order == sorted(order):
        rng.shuffle(order)
    del graph.node[:]
    graph.node.extend(copy.deepcopy(nodes[i]) for i in order)
    return f"nodes reordered {order}", [n for node in nodes for n in (*_label(node), *node.input, *node.output)]


def _dangling_input(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    nodes = [node for node in graph.node if any(node.input)]
    if not nodes:
        return None
    node = rng.choice(nodes)
    slot = rng.choice([k for k, name in enumerate(node.input) if name])
    value = f"{node.input[slot]}_nowhere"
    node.input[slot] = value
    return f"input {slot} of {_describe(node)} renamed {value!r}, which nothing produces", [*_label(node), value]


def _dangling_output(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.output:
        return None
    output = rng.choice(graph.output)
    output.name = f"{output.name}_nowhere"
    return f"graph output renamed {output.name!r}, which nothing produces", [output.name]


def _missing_initializer(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.initializer:
        return None
    index = rng.randrange(len(graph.initializer))
    name = graph.initializer[index].name
    del graph.initializer[index]
    return f"initializer {name!r} removed", [name, *_consumers(graph, name)]


def _missing_input(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = m.graph
    inputs = _graph_inputs(graph)
    if not inputs:
        return None
    name = rng.choice(inputs).name
    kept = [vi for vi in graph.input if vi.name != name]
    del graph.input[:]
    graph.input.extend(kept)
    return f"graph input {name!r} removed", [name, *_consumers(graph, name)]


def _tensor_size(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    tensors = _tensors(m)
    if not tensors:
        return None
    tensor, names = rng.choice(tensors)
    variants = ["dims+1", "dims-add", "dims-scalar"]
    if tensor.dims:
        variants += ["dims-drop"]
    if tensor.raw_data:
        variants += ["raw-truncate", "raw-extend", "raw-truncate"]
    field = helper.tensor_dtype_to_field(tensor.data_type) if tensor.data_type else ""
    if not tensor.raw_data and field and len(getattr(tensor, field)):
        variants += ["typed-drop", "typed-extend"]
    variant = rng.choice(variants)
    if variant == "dims+1":
        if tensor.dims:
            axis = rng.randrange(len(tensor.dims))
            tensor.dims[axis] += rng.choice([1, 2, 7])
        else:
            tensor.dims.append(2)
    elif variant == "dims-add":
        tensor.dims.append(rng.choice([2, 3]))
    elif variant == "dims-scalar":
        if not tensor.dims:
            tensor.dims.extend([2, 2])
        else:
            del tensor.dims[:]
    elif variant == "dims-drop":
        tensor.dims[rng.randrange(len(tensor.dims))] = max(2, tensor.dims[0] * 2)
    elif variant == "raw-truncate":
        tensor.raw_data = tensor.raw_data[:rng.randrange(len(tensor.raw_data))]
    elif variant == "raw-extend":
        tensor.raw_data = tensor.raw_data + rng.randbytes(rng.choice([1, 3, 4, 8]))
    elif variant == "typed-drop":
        del getattr(tensor, field)[-1]
    else:
        values = getattr(tensor, field)
        values.append(values[0])
    return f"tensor {names[0]!r}: {variant} (dims now {list(tensor.dims)})", names + ["dims", "raw_data"]


_ELEM_TYPES = [0, 999, -1, TensorProto.INT64, TensorProto.INT32, TensorProto.DOUBLE, TensorProto.FLOAT16,
               TensorProto.STRING, TensorProto.BOOL, TensorProto.UINT8, TensorProto.COMPLEX64, TensorProto.BFLOAT16,
               TensorProto.INT4, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT]


def _tensor_dtype(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    tensors = _tensors(m)
    if not tensors:
        return None
    tensor, names = rng.choice(tensors)
    old = tensor.data_type
    tensor.data_type = rng.choice([t for t in _ELEM_TYPES if t != old and t >= 0])
    return f"tensor {names[0]!r}: data_type {old} -> {tensor.data_type}", \
        names + ["data_type", *_consumers(m.graph, tensor.name)]


def _value_dtype(m: onnx.ModelProto, rng: random.Random, outputs: bool) -> Mutation | None:
    values = list(m.graph.output) if outputs else _graph_inputs(m.graph)
    if not values:
        return None
    value = rng.choice(values)
    if rng.random() < 0.1:
        value.ClearField("type")
        return f"{'output' if outputs else 'input'} {value.name!r}: type removed", [value.name, "type"]
    old = value.type.tensor_type.elem_type
    value.type.tensor_type.elem_type = rng.choice([t for t in _ELEM_TYPES if t != old])
    return (f"{'output' if outputs else 'input'} {value.name!r}: elem_type {old} -> "
            f"{value.type.tensor_type.elem_type}", [value.name, "elem_type", *_consumers(m.graph, value.name)])


def _dims(m: onnx.ModelProto, rng: random.Random, huge: bool = False) -> Mutation | None:
    bad = rng.choice([2**31, 2**40, 2**62]) if huge else rng.choice([-1, -2, -100, 0, 0])
    tensors = _tensors(m)
    values = [vi for vi in [*_graph_inputs(m.graph), *m.graph.output]
              if vi.type.HasField("tensor_type") and vi.type.tensor_type.shape.dim]
    if tensors and (not values or rng.random() < 0.4):
        tensor, names = rng.choice(tensors)
        if not tensor.dims:
            return None
        axis = rng.randrange(len(tensor.dims))
        tensor.dims[axis] = bad
        if bad == 0 and rng.random() < 0.5:  # a consistent empty tensor
            tensor.ClearField("raw_data")
            field = helper.tensor_dtype_to_field(tensor.data_type) if tensor.data_type else ""
            if field:
                tensor.ClearField(field)
        return f"tensor {names[0]!r}: dims[{axis}] = {bad}", names + ["dims", *_consumers(m.graph, tensor.name)]
    if not values:
        return None
    value = rng.choice(values)
    dims = value.type.tensor_type.shape.dim
    axis = rng.randrange(len(dims))
    dims[axis].dim_value = bad
    return f"value {value.name!r}: dim {axis} = {bad}", [value.name, "dims", *_consumers(m.graph, value.name)]


def _opset(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    default = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    if not default:
        return None
    variant = rng.choice(["version", "version", "version", "remove", "duplicate", "alias"])
    names = ["opset", *{node.op_type for node in m.graph.node}]
    if variant == "version":
        old = default[0].version
        default[0].version = rng.choice([0, -1, 1, 2, 5, 99, 1000, 2**40])
        return f"default opset {old} -> {default[0].version}", names
    if variant == "remove":
        kept = [o for o in m.opset_import if o.domain not in ("", "ai.onnx")]
        del m.opset_import[:]
        m.opset_import.extend(kept)
        return "default opset import removed", names
    if variant == "duplicate":
        m.opset_import.append(helper.make_opsetid("", rng.choice([1, 7, 13, 99])))
        return "default domain imported twice", names
    default[0].domain = "ai.onnx"
    return "default domain imported as 'ai.onnx'", names


def _ir_version(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    old = m.ir_version
    m.ir_version = rng.choice([0, 1, 2, -1, 99, 2**40])
    return f"ir_version {old} -> {m.ir_version}", ["ir_version", "IR version"]


def _domain(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    node.domain = rng.choice(["com.unknown", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training",
                              "org.pytorch.aten", "ai.onnx", "Ai.Onnx"])
    imported = rng.random() < 0.5 and node.domain not in {o.domain for o in m.opset_import}
    if imported:
        m.opset_import.append(helper.make_opsetid(node.domain, 1))
    return f"{_describe(node)} in domain {node.domain!r}{' (imported)' if imported else ''}", \
        [*_label(node), node.domain, "domain"]


def _duplicate_output(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    candidates = [i for i, node in enumerate(graph.node) if node.output and _defined_before(graph, i)]
    if not candidates:
        return None
    index = rng.choice(candidates)
    node = graph.node[index]
    taken = rng.choice(_defined_before(graph, index))
    old = node.output[0]
    node.output[0] = taken
    for later in graph.node[index + 1:]:  # keep the consumers reading the (now duplicate) name
        for k, name in enumerate(later.input):
            if name == old:
                later.input[k] = taken
    for output in graph.output:
        if output.name == old:
            output.name = taken
    return f"output {old!r} of {_describe(node)} renamed {taken!r}, already defined", [*_label(node), taken]


def _duplicate_input(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    inputs = list(m.graph.input)
    if not inputs:
        return None
    value = copy.deepcopy(rng.choice(inputs))
    if rng.random() < 0.5 and value.type.HasField("tensor_type"):
        value.type.tensor_type.elem_type = TensorProto.INT64
    m.graph.input.append(value)
    return f"graph input {value.name!r} declared twice", [value.name]


def _duplicate_initializer(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.initializer:
        return None
    tensor = copy.deepcopy(rng.choice(graph.initializer))
    try:
        array = numpy_helper.to_array(tensor)
        tensor.CopyFrom(numpy_helper.from_array((array * 2 + 1).astype(array.dtype), tensor.name))
    except Exception:  # noqa: BLE001 - a tensor numpy cannot double: keep it as it is
        pass
    graph.initializer.append(tensor)
    return f"initializer {tensor.name!r} given twice, with other values", [tensor.name]


def _duplicate_node_name(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if len(graph.node) < 2:
        return None
    first, second = rng.sample(range(len(graph.node)), 2)
    name = graph.node[first].name or "dup"
    graph.node[first].name = graph.node[second].name = name
    return f"nodes {first} and {second} both named {name!r}", [name]


@functools.lru_cache(maxsize=1)
def _onnx_ops() -> tuple[str, ...]:
    return tuple(sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""}))


_UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Softplus", "Identity", "Floor", "Ceil", "Erf", "Sign"]
_BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "MatMul", "PRelu"]


def _op_type(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    old = node.op_type
    variant = rng.random()
    if variant < 0.3:
        node.op_type = rng.choice(["Conv2D", "FooBar", old.lower(), old + "V2", " " + old, "", "Relu\x00"])
    elif variant < 0.6 and len(node.input) == 1:
        node.op_type = rng.choice(_UNARY)
    elif variant < 0.6 and len(node.input) == 2:
        node.op_type = rng.choice(_BINARY)
    else:
        node.op_type = rng.choice(_onnx_ops())
    return f"{_describe(node)}: op_type {old!r} -> {node.op_type!r}", \
        [n for n in (node.name, node.op_type, old, *node.output) if n]


def _attributed(m: onnx.ModelProto, rng: random.Random) -> onnx.NodeProto | None:
    nodes = [node for graph in _graphs(m.graph) for node in graph.node if node.attribute]
    return rng.choice(nodes) if nodes else None


def _attr_type(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    node = _attributed(m, rng)
    if node is None:
        return None
    attr = rng.choice(node.attribute)
    old = AttributeProto.AttributeType.Name(attr.type)
    value = helper.get_attribute_value(attr)
    replacement: AttributeProto
    choice = rng.choice(["INT", "FLOAT", "INTS", "FLOATS", "STRING", "TENSOR", "UNDEFINED"])
    scalar = value[0] if isinstance(value, list) and value else value
    number = scalar if isinstance(scalar, (int, float)) else 1
    if choice == "INT":
        replacement = helper.make_attribute(attr.name, int(number) if not isinstance(number, int) else 3)
        if attr.type == AttributeProto.INT:
            replacement = helper.make_attribute(attr.name, float(number) + 0.5)
    elif choice == "FLOAT":
        replacement = helper.make_attribute(attr.name, float(number) + 0.5)
    elif choice == "INTS":
        replacement = helper.make_attribute(attr.name, [int(number), 1])
    elif choice == "FLOATS":
        replacement = helper.make_attribute(attr.name, [float(number), 0.5])
    elif choice == "STRING":
        replacement = helper.make_attribute(attr.name, "bogus")
    elif choice == "TENSOR":
        replacement = helper.make_attribute(attr.name, numpy_helper.from_array(np.array([1.0, 2.0], np.float32)))
    else:
        replacement = copy.deepcopy(attr)
        replacement.type = AttributeProto.UNDEFINED
    attr.CopyFrom(replacement)
    new = AttributeProto.AttributeType.Name(attr.type)
    return f"{_describe(node)}: attribute {attr.name!r} {old} -> {new}", [*_label(node), attr.name]


def _attr_unknown(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    name = rng.choice(["foo_bar", "axes_", "Alpha", "kernel"])
    node.attribute.append(helper.make_attribute(name, rng.choice([1, 2.5, [1, 2], "x"])))
    return f"{_describe(node)}: unknown attribute {name!r}", [*_label(node), name]


def _attr_missing(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    node = _attributed(m, rng)
    if node is None:
        return None
    index = rng.randrange(len(node.attribute))
    name = node.attribute[index].name
    del node.attribute[index]
    return f"{_describe(node)}: attribute {name!r} removed", [*_label(node), name]


def _attr_value(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    node = _attributed(m, rng)
    if node is None:
        return None
    attr = rng.choice(node.attribute)
    if attr.type == AttributeProto.INT:
        attr.i = rng.choice([-100, -2, -1, 0, 1, 2, 5, 99, 2**40, -(2**62)])
        value: Any = attr.i
    elif attr.type == AttributeProto.INTS:
        values = list(attr.ints)
        variant = rng.choice(["set", "set", "drop", "add", "empty"])
        if variant == "set" and values:
            values[rng.randrange(len(values))] = rng.choice([-100, -1, 0, 7, 99, 2**40])
        elif variant == "drop" and values:
            values.pop()
        elif variant == "add":
            values.append(rng.choice([0, 1, 2, 3]))
        else:
            values = []
        del attr.ints[:]
        attr.ints.extend(values)
        value = values
    elif attr.type == AttributeProto.FLOAT:
        attr.f = rng.choice([float("nan"), float("inf"), -1e30, -1.0, 0.0, 1e30])
        value = attr.f
    elif attr.type == AttributeProto.STRING:
        attr.s = rng.choice([b"bogus", b"", b"\xff\xfe", b"NOTSET" * 50])
        value = attr.s
    elif attr.type == AttributeProto.FLOATS:
        del attr.floats[:]
        attr.floats.extend([float("nan")] * rng.choice([0, 1, 5]))
        value = list(attr.floats)
    else:
        return None
    return f"{_describe(node)}: attribute {attr.name!r} = {value!r}"[:300], [*_label(node), attr.name]


def _input_count(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.node:
        return None
    index = rng.randrange(len(graph.node))
    node = graph.node[index]
    if node.input and rng.random() < 0.5:
        removed = node.input[-1]
        del node.input[-1]
        return f"{_describe(node)}: last input {removed!r} removed", _label(node)
    available = _defined_before(graph, index) or ["x"]
    for _ in range(rng.choice([1, 1, 3])):
        node.input.append(rng.choice(available))
    return f"{_describe(node)}: now {len(node.input)} inputs", _label(node)


def _output_count(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    if len(node.output) > 1 and rng.random() < 0.5:
        removed = node.output[-1]
        del node.output[-1]
        return f"{_describe(node)}: last output {removed!r} removed", [*_label(node), removed]
    name = f"{node.name or node.op_type}_extra_out"
    node.output.append(name)
    return f"{_describe(node)}: extra output {name!r}", [*_label(node), name]


def _empty_input(m: onnx.ModelProto, rng: random.Random) -> Mutation | None:
    graph = _pick_graph(m, rng)
    nodes = [node for node in graph.node if node.input]
    if not nodes:
        return None
    node = rng.choice(nodes)
    slot = rng.randrange(len(node.input))
    node.input[slot] = ""
    return f"{_describe(node)}: input {slot} left empty", _label(node)


def _external_data(m: onnx.ModelProto, rng: random.Random, folder: Path) -> Mutation | None:
    tensors = [t for t in m.graph.initializer if t.raw_data or t.dims]
    if not tensors:
        return None
    tensor = rng.choice(tensors)
    location = rng.choice(["missing.bin", "../../../../../../etc/passwd", "/etc/passwd", "", "short.bin",
                           "short.bin", "a_folder"])
    if location == "short.bin":
        (folder / location).write_bytes(b"\x00" * 3)
    elif location == "a_folder":  # a directory where the data file should be (named the same in every workdir)
        (folder / location).mkdir(exist_ok=True)
    tensor.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    entries = {"location": location}
    if rng.random() < 0.5:
        entries["offset"] = str(rng.choice([0, 1, 2**40, -5]))
        entries["length"] = str(rng.choice([0, 4, 2**40, -1]))
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return f"initializer {tensor.name!r}: external data {entries}", [tensor.name, location or "location"]


STRUCTURAL_KINDS: dict[str, tuple[int, Callable[..., Mutation | None]]] = {
    "cycle": (4, _cycle),
    "unsorted": (3, _unsorted),
    "dangling-input": (4, _dangling_input),
    "dangling-output": (2, _dangling_output),
    "missing-initializer": (4, _missing_initializer),
    "missing-input": (2, _missing_input),
    "tensor-size": (5, _tensor_size),
    "tensor-dtype": (4, _tensor_dtype),
    "input-dtype": (4, lambda m, rng: _value_dtype(m, rng, outputs=False)),
    "output-dtype": (2, lambda m, rng: _value_dtype(m, rng, outputs=True)),
    "dims": (5, _dims),
    "huge-dims": (1, lambda m, rng: _dims(m, rng, huge=True)),
    "opset": (4, _opset),
    "ir-version": (2, _ir_version),
    "domain": (3, _domain),
    "duplicate-output": (3, _duplicate_output),
    "duplicate-input": (2, _duplicate_input),
    "duplicate-initializer": (3, _duplicate_initializer),
    "duplicate-node-name": (2, _duplicate_node_name),
    "op-type": (4, _op_type),
    "attr-type": (4, _attr_type),
    "attr-unknown": (2, _attr_unknown),
    "attr-missing": (4, _attr_missing),
    "attr-value": (6, _attr_value),
    "input-count": (4, _input_count),
    "output-count": (2, _output_count),
    "empty-input": (2, _empty_input),
    "external-data": (2, _external_data),
}
BYTE_WEIGHT = 3


# ----------------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------------


def _pick_base(rng: random.Random) -> int:
    bases = base_models()
    light = [i for i, b in enumerate(bases) if not b[2]]
    helpers = [i for i, b in enumerate(bases) if b[0].startswith("helper/")]
    wheel = [i for i, b in enumerate(bases) if b[2] and not b[0].startswith("helper/")]
    draw = rng.random()
    if draw < LIGHT_SHARE:
        return rng.choice(light)
    return rng.choice(helpers if draw < LIGHT_SHARE + HELPER_SHARE else wheel)


def _make_case(family: str, seed: int, index: int, workdir: Path) -> Case:
    rng = random.Random(f"{family}:{seed}:{index}")
    bases = base_models()
    kinds = [*BYTE_KINDS, *STRUCTURAL_KINDS]
    weights = [BYTE_WEIGHT] * len(BYTE_KINDS) + [w for w, _ in STRUCTURAL_KINDS.values()]
    kind = rng.choices(kinds, weights)[0]
    case_id = f"{family}-s{seed}-{index:05d}"
    path = workdir / f"{case_id}.onnx"
    for _ in range(50):
        base = _pick_base(rng)
        name, data, small = bases[base]
        if kind in BYTE_KINDS:
            donor = bases[rng.randrange(len(bases))][1]
            mutated, detail = mutate_bytes(data, kind, rng, donor)
            try:
                names = _all_names(onnx.load_from_string(mutated))
            except Exception:  # noqa: BLE001 - not even protobuf: the file is what an error names
                names = []
            names.append(path.name)
        else:
            model = onnx.load_from_string(data)
            mutate = STRUCTURAL_KINDS[kind][1]
            done = mutate(model, rng, workdir) if kind == "external-data" else mutate(model, rng)
            if done is None:
                continue
            detail, names = done
            names += [node.op_type for graph in _graphs(model.graph) for node in graph.node]
            mutated = model.SerializeToString()
        path.write_bytes(mutated)
        return {"id": case_id, "family": family, "kind": kind, "base": name, "path": str(path), "detail": detail,
                "names": sorted({n for n in names if n}), "verify": small}
    raise RuntimeError(f"no base model takes a {kind} mutation")


def make_cases(family: str, seed: int, count: int, workdir: Path) -> list[Case]:
    """``count`` seeded mutations of ONNX models, written under ``workdir``; case i is the same for any count."""
    if family != "onnx":
        raise ValueError(f"fuzz_onnx makes the onnx family's cases, not {family!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    return [_make_case(family, seed, index, workdir) for index in range(count)]


# ----------------------------------------------------------------------------------------------------
# Running a case (in the worker)
# ----------------------------------------------------------------------------------------------------

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
              "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
              "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_}


def _random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 3, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _feeds(session: Any, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Random inputs for onnxruntime's view of the model's inputs; None if some cannot be made."""
    feeds = {}
    for value in session.get_inputs():
        dtype = _ORT_TYPES.get(value.type)
        if dtype is None:
            return None
        shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in value.shape)
        if int(np.prod(shape, dtype=np.float64)) > MAX_VERIFY_ELEMENTS:
            return None
        feeds[value.name] = _random_array(rng, shape, dtype)
    return feeds


def _ort_session(data: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _compare(got: list[np.ndarray], expected: list[Any], names: list[str]) -> str | None:
    if len(got) != len(expected):
        return f"{len(got)} outputs, onnxruntime gives {len(expected)}"
    for name, g, e in zip(names, got, expected):
        g, e = np.asarray(g), np.asarray(e)
        if g.shape != e.shape:
            return f"output {name!r}: shape {g.shape}, onnxruntime {e.shape}"
        if e.dtype.kind in "fc":
            scale = float(np.max(np.abs(e[np.isfinite(e)]), initial=1.0))
            tolerance = 1e-2 if e.dtype == np.float16 else RTOL
            if not np.allclose(g.astype(e.dtype), e, rtol=tolerance, atol=tolerance * scale, equal_nan=True):
                worst = np.nanmax(np.abs(g.astype(np.float64) - e.astype(np.float64))) if e.size else 0.0
                return f"output {name!r}: differs from onnxruntime by up to {worst:.3g} (scale {scale:.3g})"
        elif not np.array_equal(g, e):
            return f"output {name!r}: {np.count_nonzero(g != e)} of {e.size} elements differ from onnxruntime"
    return None


def _as_list(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, (list, tuple)) else [np.asarray(result)]


def _names_read(node: onnx.NodeProto) -> set[str]:
    """A node's inputs and every name its subgraphs read (some of which they define themselves)."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs):
            for graph in _graphs(sub):
                for inner in graph.node:
                    names.update(inner.input)
    return names - {""}


def _sort(graph: onnx.GraphProto) -> None:
    """Kahn's topological sort of a graph's nodes, in place; a graph with a cycle is left as it is."""
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs):
                _sort(sub)
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    deps = [{producer[n] for n in _names_read(node) if n in producer} - {i} for i, node in enumerate(graph.node)]
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(deps):
        ready = [i for i, d in enumerate(deps) if i not in done and d <= done]
        if not ready:
            return
        order.append(ready[0])
        done.add(ready[0])
    nodes = [copy.deepcopy(graph.node[i]) for i in order]
    del graph.node[:]
    graph.node.extend(nodes)


def _normalized(data: bytes) -> tuple[bytes, int]:
    """The model made valid in what Forge accepts beyond ONNX's rules, for onnxruntime and onnx.checker, and
    the element count of its largest tensor whose shape inference knows (0 if none).

    Untyped graph inputs become float32 (from_onnx's ``dtype`` default), the
    nodes are sorted, and the declared types of graph outputs and the shapes of
    intermediate values (which Forge does not use and onnxruntime only warns
    about) are replaced by what ONNX's shape inference finds, where it does.
    """
    model = onnx.load_from_string(data)
    for value in _graph_inputs(model.graph):
        if not value.type.HasField("tensor_type") or value.type.tensor_type.elem_type == TensorProto.UNDEFINED:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    _sort(model.graph)
    declared = {value.name: copy.deepcopy(value.type) for value in model.graph.output}
    for value in [*model.graph.output, *model.graph.value_info]:
        value.ClearField("type")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no inference: the declarations stay, their dims dropped
        inferred = model
    largest = 0
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []
        if dims and all(d.HasField("dim_value") for d in dims):
            largest = max(largest, math.prod(d.dim_value for d in dims))
    del model.graph.value_info[:]
    for value in model.graph.output:
        found = next((v for v in inferred.graph.output if v.name == value.name), None)
        if value.name in declared:
            value.type.CopyFrom(declared[value.name])
            for dim in value.type.tensor_type.shape.dim:  # the rank stays
                dim.Clear()
        if found is not None and found.type.HasField("tensor_type") and found.type.tensor_type.elem_type:
            value.type.tensor_type.elem_type = found.type.tensor_type.elem_type
            if found.type.tensor_type.HasField("shape"):
                value.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)
    return model.SerializeToString(), largest


def _reference_aborts(data: bytes, feeds: dict[str, np.ndarray]) -> bool:
    """Whether onnxruntime would end the process on these feeds: its ``DynamicQuantizeLSTM`` kernel calls
    ``std::terminate`` on an empty batch (onnxruntime 1.31; the model is valid, and Forge returns its empty
    outputs)."""
    ops = {node.op_type for node in onnx.load_from_string(data).graph.node}
    return "DynamicQuantizeLSTM" in ops and any(value.size == 0 for value in feeds.values())


def run_case(case: Case) -> str | None:
    """Load the case with ``forge.from_onnx``; when it loads, check it against onnxruntime (see the module doc)."""
    import forge
    from model_fuzz import note_phase

    path = Path(case["path"])
    note_phase("forge")
    ir = forge.from_onnx(path)
    data, largest = _normalized(path.read_bytes())
    if largest > MAX_VERIFY_ELEMENTS * 16:
        return None  # a model ONNX's rules allow, too large to run here
    note_phase("reference")
    try:
        session = _ort_session(data)
        rejected = None
    except Exception as exc:  # noqa: BLE001 - onnxruntime's verdict, whatever its type
        session, rejected = None, exc
    rng = np.random.default_rng(0)
    if session is not None:
        if not case.get("verify"):
            return None
        feeds = _feeds(session, rng)
        if feeds is None:
            return None
        if _reference_aborts(data, feeds):  # Forge alone: it must run (outputs of size zero), not crash
            note_phase("forge")
            _as_list(ir.get_inference_function()(*[feeds[spec.name] for spec in ir.input_specs]))
            return None
        try:
            expected = session.run(None, feeds)
        except Exception:  # noqa: BLE001 - these random inputs are not valid for the model: nothing to compare
            return None
        note_phase("forge")
        specs = ir.input_specs
        by_name = {spec.name: spec for spec in specs}
        order = [spec.name for spec in specs] if set(by_name) == set(feeds) else list(feeds)
        got = _as_list(ir.get_inference_function()(*[feeds[name] for name in order]))
        return _compare(got, expected, [o.name for o in session.get_outputs()])
    try:
        onnx.checker.check_model(data, full_check=True)
    except Exception:  # noqa: BLE001 - the checker rejects it too: the model is invalid
        pass
    else:
        return None  # valid, and onnxruntime cannot run it (an operator or type it lacks)
    if not case.get("verify"):
        return None
    note_phase("forge")
    arrays = []
    for spec in ir.input_specs:
        shape = tuple(1 if d < 0 else d for d in (spec.shape or ()))
        if int(np.prod(shape, dtype=np.float64)) > MAX_VERIFY_ELEMENTS:
            return None
        arrays.append(_random_array(rng, shape, spec.dtype))
    _as_list(ir.get_inference_function()(*arrays))
    first = re.sub(r"\s+", " ", str(rejected)).strip()[:300]
    return f"Forge ran a model that onnxruntime and onnx.checker reject: {first}"
