"""The graph API: Graph and Node over an IRModule, edits that reach the module, set_batch_size, split_tensors
and named passes, each checked against the source framework or onnxruntime."""

from __future__ import annotations

import networkx as nx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import forge
from forge_core.plugin_manager import get_plugin_manager
from forge_core.quantization import CalibrationData, TensorStatistics
from model_factory import (
    LIGHT_MODELS,
    _init,
    assert_matches_framework,
    conv_bn_net,
    light_model_path,
    make_model,
)


def ort_run(model: onnx.ModelProto, *arrays: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays)))


def conv_chain(out_channels: int = 8, batch: int | str = 1, seed: int = 0) -> onnx.ModelProto:
    """Conv (named conv_a, bias) -> Relu (relu_a) -> Conv (conv_b, no bias, odd channel count allowed)."""
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "W", (6, 3, 3, 3), 0.3), _init(rng, "B", (6,)), _init(rng, "W2", (out_channels, 6, 1, 1), 0.3)]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["r"], name="relu_a"),
        helper.make_node("Conv", ["r", "W2"], ["z"], name="conv_b"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 9, 9])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, out_channels, 9, 9])
    return make_model(nodes, [x], [z], inits, name="conv_chain")


def image(batch: int = 1, seed: int = 0, size: int = 9) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


# -- reading -----------------------------------------------------------------


def test_nodes_come_in_topological_order_with_onnx_names_types_and_edges():
    ir = forge.from_onnx(conv_chain())
    graph = ir.main
    assert list(ir.graphs) == ["main"] and ir.graphs["main"] == graph and ir.main.name == "main"
    names = [n.name for n in graph]
    assert names == ["x", "conv_a.weight", "conv_a.bias", "conv_a", "relu_a", "conv_b.weight", "conv_b", "main"] \
        or names.index("conv_a") < names.index("relu_a") < names.index("conv_b") < names.index("main")
    assert [n.name for n in ir] == names and len(graph) == len(names)
    order = {name: i for i, name in enumerate(names)}
    for node in graph:
        assert all(order[p.name] < order[node.name] for p in node.pred), node
        assert all(order[s.name] > order[node.name] for s in node.succ), node
    conv = graph.find("conv_b")
    assert (conv.type, conv.op_name, conv.shape, conv.dtype, conv.size) == ("call", "nn.conv2d", (1, 8, 9, 9),
                                                                              "float32", 8 * 81)
    assert [p.name for p in conv.pred] == ["relu_a", "conv_b.weight"]  # argument order: data, weight
    assert conv.attrs["kernel_layout"] == "OIHW" and conv.attrs["groups"] == 1 and conv.attrs["strides"] == [1, 1]
    assert [n.name for n in ir.input_nodes] == ["x"] and ir.input_nodes[0].type == "input"
    assert ir.output_node.type == "output" and [p.name for p in ir.output_node.pred] == ["conv_b"]
    assert graph.find("conv_b.weight").type == "constant" and graph.find("conv_b.weight").shape == (8, 6, 1, 1)
    assert "relu_a" in graph and graph["relu_a"].op_name == "nn.relu"


def test_find_select_and_traversals():
    ir = forge.from_onnx(conv_bn_net())
    graph = ir.main
    with pytest.raises(KeyError, match="relu0"):
        graph.find("relu_0")  # suggests the close name
    convs = graph.select(op="nn.conv2d")
    assert len(convs) == 3 and graph.select(op="relax.nn.conv2d") == convs
    assert graph.select(type="input") == graph.inputs
    big = graph.select(type="constant", predicate=lambda n: n.size is not None and n.size >= 72)
    assert big and all(n.type == "constant" and n.size >= 72 for n in big)
    dfs, bfs = [n.name for n in graph.dfs()], [n.name for n in graph.bfs()]
    calls = {n.name for n in graph if n.type != "constant"}
    assert dfs[0] == "x" and bfs[0] == "x" and set(dfs) == set(bfs) == {n.name for n in graph}
    # Depth-first reaches the output before the second conv's weight; breadth-first visits by distance.
    assert dfs.index("main") < dfs.index(convs[1].pred[1].name)
    assert bfs.index("relu0") < bfs.index("relu1") < bfs.index("relu2")
    back = [n.name for n in graph.dfs(reverse=True)]
    assert back[0] == "main" and back[-1] in {n.name for n in graph if n.type in ("input", "constant")}
    assert calls <= set(back)


def test_to_networkx_holds_every_node_and_operand():
    ir = forge.from_onnx(conv_bn_net())
    g = ir.main.to_networkx()
    assert isinstance(g, nx.MultiDiGraph) and set(g.nodes) == {n.name for n in ir.main}
    assert g.number_of_edges() == sum(len(n.pred) for n in ir.main)
    assert nx.is_directed_acyclic_graph(g)
    assert list(nx.topological_sort(g))[-1] == "main"
    assert g.nodes["relu1"]["op_name"] == "nn.relu" and g.nodes["x"]["shape"] == (1, 3, 16, 16)


# -- edits -------------------------------------------------------------------


def test_weight_edit_reaches_inference_fingerprint_and_compiled_artifact(tmp_path):
    model = conv_chain()
    ir = forge.from_onnx(model)
    x = image()
    before_fp, before_hash = ir.fingerprint, hash(ir)
    ir.compile(output_path=tmp_path / "before")
    weight = ir.main.find("conv_b.weight")
    scaled = (weight.data * -0.5).astype(np.float32)
    weight.data = scaled
    assert np.array_equal(ir.main.find("conv_b.weight").data, scaled)

    # The reference: the ONNX model with the same initializer edited, through onnxruntime.
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    for init in edited.graph.initializer:
        if init.name == "W2":
            init.CopyFrom(onnx.numpy_helper.from_array(scaled, "W2"))
    want = ort_run(edited, x)[0]
    assert_matches_framework(ir.get_inference_function()(x), want)
    assert ir.fingerprint != before_fp and hash(ir) == before_hash
    ir.compile(output_path=tmp_path / "after")
    assert_matches_framework(forge.Runtime(tmp_path / "after").infer(x), want)
    assert not np.allclose(forge.Runtime(tmp_path / "before").infer(x), want, atol=1e-3)


def test_edits_with_the_wrong_shape_or_dtype_name_the_node_and_both_shapes():
    ir = forge.from_onnx(conv_chain())
    weight = ir.main.find("conv_b.weight")
    with pytest.raises(ValueError, match=r"conv_b\.weight.*\(8, 6, 1, 1\).*\(8, 6, 1, 2\)"):
        weight.data = np.zeros((8, 6, 1, 2), np.float32)
    with pytest.raises(ValueError, match=r"conv_b\.weight.*float32.*float64"):
        weight.data = np.zeros((8, 6, 1, 1), np.float64)
    with pytest.raises(TypeError, match="relu_a.*not a constant"):
        ir.main.find("relu_a").data  # noqa: B018 - the property raises
    with pytest.raises(TypeError, match="x.*input"):
        ir.main.find("x").data = np.zeros((1, 3, 9, 9), np.float32)


def test_set_name_renames_calls_inputs_and_constants_and_keeps_the_numbers():
    ir = forge.from_onnx(conv_chain())
    x = image(seed=3)
    want = ir.get_inference_function()(x)
    relu = ir.main.find("relu_a")
    relu.set_name("activation")
    assert relu.name == "activation" and "relu_a" not in ir.main and ir.main.find("activation").op_name == "nn.relu"
    assert [p.name for p in ir.main.find("conv_b").pred] == ["activation", "conv_b.weight"]
    ir.main.find("x").set_name("pixels")
    assert ir.input_names == ["pixels"]
    weight = ir.main.find("conv_b.weight")
    weight.set_name("head_weight")  # an inline constant becomes a named weight in params
    assert "head_weight" in ir.params and ir.main.find("head_weight").type == "constant"
    assert ir.input_names == ["pixels"] and ir.input_count == 1
    assert_matches_framework(ir.get_inference_function()(x), want)
    with pytest.raises(ValueError, match="already has a node named 'conv_a'"):
        ir.main.find("activation").set_name("conv_a")
    with pytest.raises(ValueError, match="output"):
        ir.output_node.set_name("result")


def test_graph_copy_is_independent_and_runs_alone():
    ir = forge.from_onnx(conv_chain())
    x = image(seed=4)
    want = ir.get_inference_function()(x)
    copy = ir.main.copy()
    copy.find("conv_b.weight").data = np.zeros((8, 6, 1, 1), np.float32)
    assert np.all(copy.get_inference_function()(x) == 0)
    assert_matches_framework(ir.main.get_inference_function()(x), want)
    assert copy.fingerprint != ir.main.fingerprint


# -- set_batch_size -------------------------------------------------------------


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_set_batch_size_on_every_light_model(name):
    ir = forge.from_onnx(str(light_model_path(name)))
    shape = ir.input_shapes[0]
    out = ir.output_shapes[0]
    assert shape[0] == 1
    ir.set_batch_size(4)
    assert ir.input_shapes == [(4, *shape[1:])] and ir.output_shapes == [(4, *out[1:])]
    ir.typed_mod  # noqa: B018 - well-formed after the change
    if name in ("squeezenet", "shufflenet"):  # numbers for two (each build of the others takes 10-100 s)
        rng = np.random.default_rng(0)
        samples = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
        model = onnx.load(str(light_model_path(name)))
        want = np.concatenate([ort_run(model, s)[0] for s in samples])
        assert_matches_framework(ir.get_inference_function()(np.concatenate(samples)), want)


def test_set_batch_size_binds_a_symbolic_batch_and_rewrites_a_fixed_one():
    sym = forge.from_onnx(conv_bn_net(batch="N"))
    assert sym.input_shapes == [(-1, 3, 16, 16)]
    sym.set_batch_size(3)
    assert sym.input_shapes == [(3, 3, 16, 16)] and sym.output_shapes == [(3, 10)]
    fixed = forge.from_onnx(conv_bn_net(batch=1))  # its Flatten is a Reshape to [1, 8]
    fixed.set_batch_size(3)
    assert fixed.main.find("flatten").attrs["shape"] == (3, 8)
    x = np.random.default_rng(5).standard_normal((3, 3, 16, 16)).astype(np.float32)
    want = np.concatenate([ort_run(conv_bn_net(batch=1), x[i:i + 1])[0] for i in range(3)])
    assert_matches_framework(sym.get_inference_function()(x), want)
    assert_matches_framework(fixed.get_inference_function()(x), want)
    fixed.set_batch_size(1)
    assert_matches_framework(fixed.get_inference_function()(x[:1]), want[:1])


def test_set_batch_size_refuses_bad_values_and_unrewritable_models_by_node():
    ir = forge.from_onnx(conv_bn_net())
    for bad in (0, -2, 2.0, True, "4"):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            ir.set_batch_size(bad)
    # A constant with the batch baked in, concatenated on the batch axis: no rewrite keeps its meaning.
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Concat", ["x", "extra"], ["y"], name="stack", axis=0)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [_init(rng, "extra", (1, 4))])
    stacked = forge.from_onnx(model)
    with pytest.raises(ValueError, match="set_batch_size\\(3\\): node 'stack' \\(concat\\)"):
        stacked.set_batch_size(3)
    assert stacked.input_shapes == [(1, 4)]  # unchanged after the refusal


def test_set_batch_size_refuses_a_recurrent_kernel_built_for_the_old_shapes():
    rng = np.random.default_rng(0)
    inits = [_init(rng, "W", (1, 16, 8)), _init(rng, "R", (1, 16, 4))]
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm", hidden_size=4)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, 4])], inits)
    ir = forge.from_onnx(model)
    with pytest.raises(ValueError, match="built for its input shapes"):
        ir.set_batch_size(2)


def test_set_batch_size_on_a_transformer_encoder_exported_with_a_fixed_batch():
    torch = pytest.importorskip("torch")
    from hf_models import ARCHITECTURES
    from test_transformers_corpus import export_torchscript

    for name in ("bert", "vit"):  # ViT's class token is a constant concatenated with the batched patches
        arch = ARCHITECTURES[name]
        model = arch.build(seed=7)
        ir = forge.from_onnx(export_torchscript(model, arch.inputs(1, 12, seed=1), arch, 17, dynamic=False))
        ir.set_batch_size(3)
        samples = [arch.inputs(1, 12, seed=s) for s in (2, 3, 4)]
        with torch.no_grad():
            want = np.concatenate([model(*s).numpy() for s in samples])
        stacked = [np.concatenate([s[i].numpy() for s in samples]) for i in range(len(samples[0]))]
        assert_matches_framework(ir.get_inference_function()(*stacked), want)


def test_set_batch_size_on_torch_and_keras_cnns():
    torch = pytest.importorskip("torch")
    keras = pytest.importorskip("keras")
    import torch_models
    from test_keras_applications import FAMILIES, build

    net = torch_models.build(torch_models.MobileNetV3Style)
    ir = forge.from_torch(net, example_inputs=(torch.randn(1, 3, 32, 32),))
    ir.set_batch_size(4)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_matches_framework(ir.get_inference_function()(x.numpy()), net(x).numpy())

    family = next(f for f in FAMILIES if f.constructor == "MobileNet")
    model = build(family)
    ir = forge.from_keras(model)
    ir.set_batch_size(3)
    images = np.random.default_rng(1).uniform(-1, 1, (3, family.size, family.size, 3)).astype(np.float32)
    got = ir.get_inference_function()(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    assert_matches_framework(got, model(images, training=False).numpy())
    del keras


# -- split_tensors ---------------------------------------------------------------


@pytest.mark.parametrize("out_channels", [8, 7])
@pytest.mark.parametrize("opt_level", [0, 3])
def test_split_tensors_keeps_the_numbers_compiled(out_channels, opt_level, tmp_path):
    model = conv_chain(out_channels)
    ir = forge.from_onnx(model)
    assert not ir.is_split_tensors
    ir.split_tensors()
    assert ir.is_split_tensors and ir.operators["nn.conv2d"] == 4 and ir.operators["concat"] == 2
    halves = [n.shape[1] for n in ir.main.select(op="nn.conv2d")]
    assert halves == [3, 3, (out_channels + 1) // 2, out_channels // 2]
    x = image(seed=6)
    want = ort_run(model, x)[0]
    assert_matches_framework(ir.get_inference_function()(x), want)
    ir.compile(output_path=tmp_path / "split", opt_level=opt_level)
    assert_matches_framework(forge.Runtime(tmp_path / "split").infer(x), want)


def test_split_tensors_on_a_torch_cnn_and_weights_held_in_params():
    torch = pytest.importorskip("torch")
    import torch_models

    net = torch_models.build(torch_models.ResidualCNN)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = net(x).numpy()
    ir = forge.from_torch(net, example_inputs=(x,))
    convs = ir.operators["nn.conv2d"]
    ir.split_tensors()
    assert ir.operators["nn.conv2d"] == 2 * convs
    assert_matches_framework(ir.get_inference_function()(x.numpy()), want)

    held = forge.from_onnx(conv_chain(), freeze_params=False)
    assert held.params  # weights outside the IR are sliced in the graph
    x9 = image(seed=8)
    want9 = ort_run(conv_chain(), x9)[0]
    held.split_tensors()
    assert held.operators["nn.conv2d"] == 4 and held.operators["strided_slice"] == 4
    assert_matches_framework(held.get_inference_function()(x9), want9)


def test_split_tensors_refuses_calibrated_modules_unless_forced():
    ir = forge.from_onnx(conv_chain())
    ir._commit(calibration=CalibrationData({"conv_a": TensorStatistics([-1.0], [1.0])}, num_samples=1))
    assert ir.is_calibrated
    with pytest.raises(ValueError, match="calibration data.*force=True"):
        ir.split_tensors()
    assert not ir.is_split_tensors and ir.operators["nn.conv2d"] == 2
    ir.split_tensors(force=True)
    assert ir.is_split_tensors and not ir.is_calibrated and ir._calibration is None
    batch = forge.from_onnx(conv_chain())
    batch._commit(calibration=CalibrationData({"conv_a": TensorStatistics([-1.0], [1.0])}, num_samples=1))
    batch.set_batch_size(2)  # the same nodes: the statistics stay
    assert batch.is_calibrated and batch.copy().is_calibrated


# -- named passes -------------------------------------------------------------------


def test_list_passes_names_every_stage_with_a_description():
    passes = {p.name: p for p in forge.list_passes()}
    for name in ("fold_constants", "fold_batch_norms", "inline_partitions", "set_batch_size", "split_tensors",
                 "remove_dropout", "decompose_for_inference", "set_channel_layout", "set_float16", "simplify",
                 "fast_math", "cpu_default_schedules"):
        assert name in passes and passes[name].description, name
    assert passes["set_batch_size"].stage == "transform" and passes["fold_constants"].stage == "import"
    assert {p.name for p in forge.list_passes("transform")} >= {"set_batch_size", "split_tensors"}


def test_a_third_party_pass_is_listed_and_applied():
    import tvm
    from tvm import relax

    from forge_core.hookspecs import hookimpl

    def double_output(mod, context):
        """Multiply main's result by a factor (a test pass)."""
        func = mod["main"]
        factor = relax.const(np.float32(context.options.get("factor", 2.0)))
        body = func.body
        new_body = relax.SeqExpr(body.blocks, relax.op.multiply(body.body, factor))
        updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        updated["main"] = relax.Function(func.params, new_body, func.ret_ty, func.is_pure, func.attrs)
        return relax.transform.Normalize()(updated)

    class Plugin:
        @hookimpl
        def register_passes(self, register):
            register("scale_output", double_output, stage="transform")

    manager = get_plugin_manager()
    manager.register(Plugin(), "scale-output-plugin")
    try:
        listed = {p.name: p for p in forge.list_passes()}
        assert listed["scale_output"].plugin == "scale-output-plugin"
        assert listed["scale_output"].description.startswith("Multiply main's result")
        ir = forge.from_onnx(conv_chain())
        x = image(seed=9)
        want = ir.get_inference_function()(x)
        ir.apply_pass("scale_output", factor=3.0)
        assert_matches_framework(ir.get_inference_function()(x), 3.0 * want)
    finally:
        manager.unregister("scale-output-plugin")
    with pytest.raises(forge.PluginNotInstalledError, match="scale_output"):
        forge.from_onnx(conv_chain()).apply_pass("scale_output")


def test_apply_pass_runs_compile_time_passes_by_name():
    ir = forge.from_onnx(conv_chain())
    x = image(seed=10)
    want = ir.get_inference_function()(x)
    ir.apply_pass("set_channel_layout", layout="last")
    assert all(n.attrs["data_layout"] == "NHWC" for n in ir.main.select(op="nn.conv2d"))
    assert_matches_framework(ir.get_inference_function()(x), want)
    with pytest.raises(ValueError, match="layout must be 'first' or 'last'"):
        ir.apply_pass("set_channel_layout", layout="sideways")
    with pytest.raises(ValueError, match="needs the option batch_size"):
        ir.apply_pass("set_batch_size")
