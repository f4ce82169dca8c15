"""partition_for_tensorrt and inline_partitions (the forge-tensorrt plugin): where operators land on the light
models, a torch CNN and a transformer, each flag on a model built to show it, the exact round trip, the
compile error, and the install hint."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
import tvm
from model_factory import LIGHT_MODELS, conv_bn_net, export_torch, light_model_path
from tvm import relax

import forge
from forge_core.errors import CompilationError, PluginNotInstalledError

# The operators TVM 0.27's TensorRT pattern table offloads (tvm.relax.backend.contrib.tensorrt).
TENSORRT_OPS = {
    "relax.nn.relu", "relax.sigmoid", "relax.nn.silu", "relax.tanh", "relax.exp", "relax.log", "relax.sqrt",
    "relax.abs", "relax.negative", "relax.sin", "relax.cos", "relax.atan", "relax.ceil", "relax.floor", "relax.erf",
    "relax.nn.softmax", "relax.nn.batch_flatten", "relax.expand_dims", "relax.squeeze", "relax.permute_dims",
    "relax.layout_transform", "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.max_pool3d",
    "relax.nn.avg_pool3d", "relax.nn.adaptive_avg_pool2d", "relax.sum", "relax.prod", "relax.max", "relax.min",
    "relax.mean", "relax.concat", "relax.split", "relax.add", "relax.subtract", "relax.multiply", "relax.divide",
    "relax.power", "relax.maximum", "relax.minimum", "relax.image.resize2d", "relax.nn.conv1d", "relax.nn.conv2d",
    "relax.nn.conv3d", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose", "relax.matmul", "relax.reshape",
    "relax.nn.layer_norm", "relax.clip", "relax.strided_slice",
}
MAC = {"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv2d_transpose",
       "relax.nn.conv3d_transpose", "relax.matmul"}


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _ops(func: relax.Function) -> collections.Counter:
    found: collections.Counter = collections.Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            found[str(expr.op.name)] += 1

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _placement(ir: forge.IRModule) -> tuple[collections.Counter, collections.Counter, list[str]]:
    """(operators inside partitions, operators left in main, partition names).

    A composite function is bound once in a partition and may be called several times, so what is
    inside is counted as everything (the partitions inlined) minus what main computes itself.
    """
    from forge_core.builtin.folding_passes import inline_partitions_where

    names = []
    for gv, func in ir.mod.functions.items():
        if gv.name_hint != "main":
            assert func.attrs["Codegen"] == "tensorrt"
            names.append(gv.name_hint)
    outside = _ops(ir.mod["main"])
    everything = _ops(inline_partitions_where(ir.mod, lambda gv, func: True)["main"])
    return everything - outside, outside, sorted(names, key=lambda n: int(n.rpartition("_")[2]))


def _same_numbers(a: forge.IRModule, b: forge.IRModule) -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(d) for s, d in zip(a.input_shapes, a.input_dtypes)]
    np.testing.assert_allclose(b.get_inference_function()(*inputs), a.get_inference_function()(*inputs),
                               rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# Real models: where operators land, and the exact round trip
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_partition_and_inline_back_exactly(name):
    ir = forge.from_onnx(str(light_model_path(name)))
    before = ir.fingerprint
    undropped = ir.copy()
    undropped.apply_pass("remove_dropout")  # what partitioning starts with
    ir.partition_for_tensorrt()
    inside, outside, names = _placement(ir)
    assert ir.is_tensorrt and ir.subgraph_count == len(names) >= 1 and ir.graph_count == len(names) + 1
    assert names == [f"tensorrt_{i}" for i in range(len(names))]
    assert set(inside) <= TENSORRT_OPS
    # Every operator TensorRT takes is offloaded: nothing of the light models stays in main (dropout is removed).
    assert not outside, outside
    assert inside["relax.nn.conv2d"] == undropped.operators["nn.conv2d"]
    assert set(ir.graphs) == {"main", *names}
    assert len(ir.graphs[names[0]]) > 0  # the graph API walks a partition like any graph
    if name != "densenet121":
        assert ir.subgraph_count == 1  # DenseNet: 63 (TVM's MergeCompositeFunctions stops at its concats)
    ir.inline_partitions()
    assert not ir.is_tensorrt and ir.subgraph_count == 0
    assert ir.fingerprint == before


def test_generic_inline_computes_the_same():
    """Without the snapshot of partition_for_tensorrt (a module partitioned elsewhere, or loaded with
    inline_partitions=True), every partition and its composites are inlined: the same computation."""
    ir = forge.from_onnx(str(light_model_path("squeezenet")))
    reference = ir.copy()
    reference.apply_pass("remove_dropout")
    ir.partition_for_tensorrt()
    generic = forge.IRModule(ir.mod)
    assert generic.subgraph_count == 1
    generic.inline_partitions()
    assert generic.subgraph_count == 0 and generic.operators == reference.operators
    _same_numbers(reference, generic)
    from tvm.relax.backend.contrib.tensorrt import partition_for_tensorrt

    foreign = forge.IRModule(partition_for_tensorrt(reference.mod), inline_partitions=True)
    assert foreign.subgraph_count == 0 and foreign.operators == reference.operators
    _same_numbers(reference, foreign)


def test_a_torch_cnn_and_a_transformer():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
            self.fc = torch.nn.Linear(4 * 16 * 16, 10)

        def forward(self, x):
            y = torch.nn.functional.hardswish(self.conv(x))
            y = torch.sigmoid(self.up(torch.nn.functional.max_pool2d(y, 2)))
            return self.fc(torch.flatten(y, 1))

    torch.manual_seed(0)
    cnn = forge.from_onnx(export_torch(Net().eval(), (torch.randn(1, 3, 16, 16),), ["x"]))
    reference = cnn.copy()
    cnn.partition_for_tensorrt()
    inside, outside, _ = _placement(cnn)
    assert {"relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul"} <= set(inside)
    assert set(inside) <= TENSORRT_OPS and not set(outside) & MAC
    cnn.inline_partitions()
    assert cnn.fingerprint == reference.fingerprint

    from hf_models import ARCHITECTURES

    arch = ARCHITECTURES["bert"]
    bert = forge.from_onnx(export_torch(arch.build(seed=1).eval(), arch.inputs(batch=1, length=8),
                                        list(arch.input_names)))
    reference = bert.copy()
    bert.partition_for_tensorrt()
    inside, outside, names = _placement(bert)
    assert inside["relax.matmul"] == reference.operators["matmul"]  # projections and attention's two matmuls
    assert {"relax.nn.softmax", "relax.nn.layer_norm", "relax.erf"} & set(inside)
    assert set(inside) <= TENSORRT_OPS
    assert "relax.take" in outside  # the embedding lookups: no TensorRT pattern
    assert not set(outside) & MAC
    # The token ids' range checks stay, messages included (TVM's partitioner cannot visit their strings).
    assert bert.mod.script().count("R.assert_op(") == reference.mod.script().count("R.assert_op(") > 0
    assert "of its indices lie outside" in bert.mod.script()
    bert.inline_partitions()
    assert bert.fingerprint == reference.fingerprint


# ----------------------------------------------------------------------------------------------------
# Each flag on a model built to show it
# ----------------------------------------------------------------------------------------------------


def _module(build) -> forge.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return forge.IRModule(bb.get())


def _const(shape, seed=0):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def _flag_effect(build, flag):
    """(module partitioned with the flag, without it, the original)."""
    original = _module(build)
    on, off = original.copy(), original.copy()
    on.partition_for_tensorrt(**{flag: True})
    off.partition_for_tensorrt(**{flag: False})
    return on, off, original


def test_remove_stacks():
    def build(bb, x):
        a = bb.emit(relax.op.nn.relu(x))
        b = bb.emit(relax.op.sigmoid(x))
        return relax.op.matmul(relax.op.stack([a, b], axis=1), _const((8, 3)))

    on, off, original = _flag_effect(build, "remove_stacks")
    inside_on, outside_on, _ = _placement(on)
    _, outside_off, _ = _placement(off)
    assert "relax.stack" in outside_off and "relax.stack" not in outside_on
    assert on.subgraph_count == 1 and {"relax.expand_dims", "relax.concat"} <= set(inside_on)
    on.apply_pass("inline_partitions")
    _same_numbers(original, on)


def test_simplify_batch_matmul():
    def build(bb, x):
        return relax.op.nn.relu(relax.op.matmul(x, _const((1, 8, 16))))

    on, off, original = _flag_effect(build, "simplify_batch_matmul")
    weights_on = [c for c in forge_constants(on) if c.ndim >= 2]
    weights_off = [c for c in forge_constants(off) if c.ndim >= 2]
    assert [w.shape for w in weights_off] == [(1, 8, 16)] and [w.shape for w in weights_on] == [(8, 16)]
    assert "relax.reshape" in _placement(on)[0]
    on.apply_pass("inline_partitions")
    _same_numbers(original, on)


def test_simplify_scalar_add():
    def build(bb, x):
        y = bb.emit(relax.op.matmul(x, _const((8, 8))))
        return relax.op.add(y, relax.const(np.float32(0.5)))

    on, off, original = _flag_effect(build, "simplify_scalar_add")
    assert sorted(c.shape for c in forge_constants(off)) == [(), (8, 8)]
    assert sorted(c.shape for c in forge_constants(on)) == [(1, 1, 1), (8, 8)]
    on.apply_pass("inline_partitions")
    _same_numbers(original, on)


def test_remove_no_mac_subgraphs():
    def build(bb, x):
        y = bb.emit(relax.op.nn.relu(relax.op.matmul(x, _const((8, 8)))))
        y = bb.emit(relax.op.nn.gelu(y))  # no TensorRT pattern: splits the graph
        return relax.op.nn.relu(relax.op.add(y, _const((8,), seed=1)))

    on, off, original = _flag_effect(build, "remove_no_mac_subgraphs")
    assert off.subgraph_count == 2 and on.subgraph_count == 1
    inside, outside, _ = _placement(on)
    assert inside["relax.matmul"] == 1 and {"relax.nn.gelu", "relax.add", "relax.nn.relu"} <= set(outside)
    on.inline_partitions()
    assert on.fingerprint == original.fingerprint


def forge_constants(ir: forge.IRModule) -> list[np.ndarray]:
    from forge_core.ir.weights import iter_constants

    return [c.value.numpy() for c in iter_constants(ir.mod)]


def test_each_flag_is_a_pass_of_its_own():
    names = {p.name: p.plugin for p in forge.list_passes()}
    for name in ("partition_for_tensorrt", "tensorrt_remove_stacks", "tensorrt_simplify_batch_matmul",
                 "tensorrt_simplify_scalar_add", "tensorrt_remove_no_mac_subgraphs"):
        assert names[name] == "tensorrt"


# ----------------------------------------------------------------------------------------------------
# Deprecation, errors, compile
# ----------------------------------------------------------------------------------------------------


def test_both_methods_are_deprecated():
    ir = forge.from_onnx(conv_bn_net(seed=3))
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        with pytest.warns(DeprecationWarning, match="use forge.ONNXModule"):
            ir.partition_for_tensorrt()
        with pytest.raises(ValueError, match="partitioned for TensorRT already"):
            ir.partition_for_tensorrt()
        with pytest.warns(DeprecationWarning, match="use forge.ONNXModule"):
            ir.inline_partitions()
        with pytest.raises(ValueError, match="remove_stacks must be True or False"):
            ir.partition_for_tensorrt(remove_stacks="yes")


def test_compiling_a_partitioned_module_says_what_to_do(tmp_path):
    ir = forge.from_onnx(conv_bn_net(seed=4))
    ir.partition_for_tensorrt()
    assert tvm.get_global_func("relax.ext.tensorrt", allow_missing=True) is None  # this wheel: no codegen
    with pytest.raises(CompilationError, match=r"partitioned for tensorrt \(1 subgraph: tensorrt_0\).*"
                                               r"relax.ext.tensorrt is not registered.*USE_TENSORRT_CODEGEN.*"
                                               r"forge.ONNXModule.*inline_partitions"):
        ir.compile(output_path=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CompilationError, match="no tensorrt code generator"):
        ir.get_inference_function()
    ir.inline_partitions()
    ir.compile(output_path=tmp_path / "out")
    assert (tmp_path / "out" / "model_library.so").is_file()


def test_without_the_plugin_the_methods_name_the_extra(fresh_plugins, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "onnx")
    from forge_core.plugin_manager import reset_plugin_manager

    reset_plugin_manager()
    ir = forge.from_onnx(conv_bn_net(seed=5))
    with pytest.raises(PluginNotInstalledError, match=r"pass 'partition_for_tensorrt'.*forge-core\[tensorrt\]"):
        ir.partition_for_tensorrt()
    assert not ir.is_tensorrt
