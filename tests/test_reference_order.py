"""The inference function's schedule (forge_core/schedules/reference_order.py): the same numbers as TVM's
unscheduled kernels, bit for bit, on every model shape and fusion context, and its loops really scheduled.

Each model is built twice from the same prepared module: TVM's plain loops and the reference order. Both run
on the same random inputs; the outputs must be equal (not close), and within 1e-5 of onnxruntime's."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from torch import nn

import forge
from forge_core.ir import weights
from forge_core.ir.inference import build_inference_function, prepare
from forge_core.schedules.apply import RULE_ATTR
from forge_core.schedules.reference_order import ReferenceOrder
from model_factory import _init, make_model
from torch_models import MaskedBertEncoder, MobileNetV2Style, _randomize_batch_norms

GENERIC = tvm.target.Target("llvm")  # the inference function's target: no FMA, so equal means bit-equal


class SmallUNet(nn.Module):
    """Two levels: 3x3 convolutions with batch norm and ReLU, max pooling, a 2x2 transposed convolution,
    a skip concatenation, a 1x1 sigmoid head; odd channel counts."""

    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1, bias=False))

        self.down = block(3, 5)
        self.bottom = block(5, 12)
        self.up = nn.ConvTranspose2d(12, 6, 2, 2)
        self.merge = block(11, 7)
        self.head = nn.Conv2d(7, 2, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        skip = self.down(image)
        x = self.bottom(nn.functional.max_pool2d(skip, 2))
        x = self.merge(torch.cat([self.up(x), skip], 1))
        return torch.sigmoid(self.head(x))


def _export(model: nn.Module, inputs: tuple, names: list[str], dynamic: dict | None = None) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buffer, input_names=names, output_names=["output"], opset_version=17,
                          dynamo=False, dynamic_axes=dynamic)
    return onnx.load_from_string(buffer.getvalue())


def _unet(dynamic: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    torch.manual_seed(0)
    model = _randomize_batch_norms(SmallUNet())
    image = torch.randn(1, 3, 20, 36)
    axes = {"image": {0: "n", 2: "h", 3: "w"}} if dynamic else None
    proto = _export(model, (image,), ["image"], axes)
    rng = np.random.default_rng(1)
    return proto, {"image": rng.standard_normal((2, 3, 28, 44) if dynamic else (1, 3, 20, 36)).astype(np.float32)}


def _mobilenet() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    torch.manual_seed(0)
    model = _randomize_batch_norms(MobileNetV2Style())
    proto = _export(model, (torch.randn(1, 3, 64, 64),), ["image"])
    return proto, {"image": np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)}


def _encoder() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    torch.manual_seed(0)
    model = MaskedBertEncoder().eval()
    ids, mask = torch.randint(0, 100, (2, 9)), torch.ones(2, 9, dtype=torch.int64)
    proto = _export(model, (ids, mask), ["input_ids", "attention_mask"],
                    {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}})
    rng = np.random.default_rng(3)
    mask = np.ones((3, 13), np.int64)
    mask[1, 9:] = 0
    return proto, {"input_ids": rng.integers(0, 100, (3, 13)), "attention_mask": mask}


def _operators() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """What the CNNs above do not hold: Gemm with a transposed weight, a batched MatMul, a reduction over a
    leading axis and over the last, a grouped convolution with stride 2, conv1d, average pooling; odd sizes."""
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Gemm", ["x", "gw", "gb"], ["gemm"], transB=1),
        helper.make_node("MatMul", ["a", "b"], ["bmm"]),
        helper.make_node("ReduceMean", ["bmm"], ["mean1"], axes=[1], keepdims=0),
        helper.make_node("ReduceSum", ["bmm", "axis2"], ["sum2"], keepdims=1),
        helper.make_node("Conv", ["img", "cw"], ["gconv"], group=3, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["gconv"], ["pool"], kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("Conv", ["seq", "c1w", "c1b"], ["conv1d"], pads=[2, 2]),
    ]
    inits = [_init(rng, "gw", (11, 19), 0.3), _init(rng, "gb", (11,)), _init(rng, "b", (2, 7, 13), 0.3),
             _init(rng, "cw", (6, 2, 3, 3), 0.3), _init(rng, "c1w", (10, 4, 5), 0.3), _init(rng, "c1b", (10,)),
             helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
             helper.make_tensor("axis2", TensorProto.INT64, [1], [2])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 19]),
              helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 5, 7]),
              helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 6, 17, 23]),
              helper.make_tensor_value_info("seq", TensorProto.FLOAT, [2, 4, 37])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (
        ("gemm", [5, 11]), ("mean1", [2, 13]), ("sum2", [2, 5, 1]), ("pool", [1, 6, 7, 10]), ("conv1d", [2, 10, 37]))]
    proto = make_model(nodes, inputs, outputs, inits)
    feed = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in inputs}
    return proto, feed


MODELS = {"unet": lambda: _unet(False), "unet_dynamic": lambda: _unet(True), "mobilenet": _mobilenet,
          "encoder": _encoder, "operators": _operators}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reference_order_is_bit_identical_to_unscheduled_kernels(name):
    proto, feed = MODELS[name]()
    ir = forge.from_onnx(proto)
    bound = weights.bind_params(ir.mod, ir.params)
    scheduled = build_inference_function(bound, GENERIC, ir.input_specs, ir.output_specs)
    plain = build_inference_function(bound, GENERIC, ir.input_specs, ir.output_specs, reference_order=False)
    arrays = [feed[spec.name] for spec in ir.input_specs]
    got, want = scheduled(*arrays), plain(*arrays)
    got, want = (got, want) if isinstance(got, list) else ([got], [want])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feed)
    for output, (g, w, e) in enumerate(zip(got, want, expected, strict=True)):
        assert np.array_equal(g, w), f"output {output}: max |difference| {np.abs(g - w).max()}"
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * float(np.abs(e).max()))


def _legalized(proto: onnx.ModelProto) -> tvm.IRModule:
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    ir = forge.from_onnx(proto)
    with GENERIC:
        return tvm.transform.Sequential(cpu.library_dispatch_passes(GENERIC) + cpu.legalize_passes(GENERIC))(
            prepare(weights.bind_params(ir.mod, ir.params)))


@pytest.mark.parametrize("name", ["unet", "operators"])
def test_reference_order_tiles_convolutions_and_matrix_products(name):
    """Every convolution and matrix product accumulates a vector tile in a local buffer, in parallel;
    a kernel the rule left plain would pass the test above and stay as slow as before."""
    from forge_core.schedules.apply import apply_rules

    mod = apply_rules(_legalized(MODELS[name]()[0]), GENERIC, [ReferenceOrder()])
    kernels = {gv.name_hint: func for gv, func in mod.functions.items() if isinstance(func, tvm.tirx.PrimFunc)}
    heavy = [n for n in kernels if any(op in n for op in ("conv2d", "conv1d", "matmul"))]
    assert len(heavy) >= 4
    for kernel in heavy:
        func = kernels[kernel]
        script = func.script()
        assert str(func.attrs[RULE_ATTR]) == "ReferenceOrder", kernel
        assert "_local" in script and "T.parallel" in script, kernel
        update = script[:script.index('_update")')]
        innermost_loop = update[update.rindex("for "):]
        # Rows of whole vectors (4 float32 lanes on generic x86-64) read with unit stride accumulate in vectors.
        vectors = int(func.params[-1].shape[-1]) % 4 == 0 and "* T.int64(2) + v_rx" not in script
        assert ("T.vectorized" in innermost_loop) == vectors, kernel


def _reduction_loops(func: tvm.tirx.PrimFunc) -> list[list[tuple[str, int]]]:
    """For each block that reduces: the loops its reduction iterators are bound to, outermost first, as
    (iterator, extent); an iterator bound to anything but one whole loop makes the entry ("split", 0)."""
    found = []
    enclosing: list = []

    def reduction_loops(realize) -> list[tuple[str, int]]:
        entries = []
        for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
            if iv.iter_type != tvm.tirx.IterVar.CommReduce:
                continue
            depth = next((d for d, loop in enumerate(enclosing) if loop.loop_var.same_as(value)), None)
            if depth is None or int(enclosing[depth].extent) != int(iv.dom.extent):
                return [("split", 0)]
            entries.append((depth, (str(iv.var.name), int(iv.dom.extent))))
        return [entry for _, entry in sorted(entries)]

    def walk(stmt) -> None:
        if isinstance(stmt, tvm.tirx.For):
            enclosing.append(stmt)
            walk(stmt.body)
            enclosing.pop()
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for child in stmt.seq:
                walk(child)
        elif isinstance(stmt, tvm.s_tir.stmt.SBlockRealize):
            if any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in stmt.block.iter_vars):
                found.append(reduction_loops(stmt))
            walk(stmt.block.body)
        elif hasattr(stmt, "body"):
            walk(stmt.body)

    walk(func.body)
    return found


def test_reference_order_keeps_every_reduction_loop_whole_and_in_order():
    """The invariant behind bit-equality, checked on the loops: each reduction iterator is bound to one
    whole loop, and they nest in the unscheduled order, in every kernel of a CNN and of the operators."""
    from forge_core.schedules.apply import apply_rules

    for name in ("unet", "operators", "mobilenet"):
        mod = _legalized(MODELS[name]()[0])
        scheduled = apply_rules(mod, GENERIC, [ReferenceOrder()])
        checked = 0
        for gv, func in scheduled.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            before, after = _reduction_loops(mod[gv.name_hint]), _reduction_loops(func)
            assert after == before, f"{name}: {gv.name_hint}: {before} -> {after}"
            checked += len(after)
        assert checked >= 3, name


def test_inference_function_is_scheduled_on_the_public_path():
    """``get_inference_function()`` builds with the reference order (faster) and gives the plain build's
    numbers, bit for bit."""
    proto, feed = _unet(False)
    ir = forge.from_onnx(proto)
    function = ir.get_inference_function()
    plain = build_inference_function(weights.bind_params(ir.mod, ir.params), GENERIC, ir.input_specs,
                                     ir.output_specs, reference_order=False)
    assert np.array_equal(function(feed["image"]), plain(feed["image"]))
