"""Default CPU schedules: each rule takes its operators, and numbers match onnxruntime within 1e-4.

Speed is measured in benchmarks/, never asserted here.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net, make_model
from onnx import TensorProto, helper, numpy_helper

import forge
from forge_core.schedules.apply import RULE_ATTR, schedule_report

RNG = np.random.default_rng(0)


def _host_grouped_rule() -> str:
    from forge_core.schedules.blocks import vector_unit
    from forge_core.targets.parsing import resolve_target

    unit = vector_unit(resolve_target("llvm"))
    return "Conv2dNCHW" if unit.registers <= 16 or unit.bits == 512 else "GroupedConv2dNCHW"


HOST_GROUPED_RULE = _host_grouped_rule()


def single_node(op, inputs, output_shape, weights=(), **attrs):
    """An ONNX model of one node; ``inputs`` are (name, shape) graph inputs, ``weights`` arrays."""
    inits = [numpy_helper.from_array(w.astype(np.float32), f"w{i}") for i, w in enumerate(weights)]
    node = helper.make_node(op, [n for n, _ in inputs] + [i.name for i in inits], ["y"], name=op.lower(), **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    return make_model([node], graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
                      inits)


def compile_and_compare(model, tmp_path, caplog):
    feeds = {vi.name: RNG.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input}
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        forge.from_onnx(model).compile(output_path=tmp_path / "a")
    (got,) = forge.Runtime(tmp_path / "a").infer(*feeds.values())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("schedules:"))
    return dict((rule, int(n)) for rule, n in re.findall(r"(\w+) (\d+)", line))


@pytest.mark.parametrize(
    "name, model, rule",
    [
        ("conv3x3", single_node("Conv", [("x", [1, 16, 14, 14])], [1, 32, 14, 14],
                                [RNG.standard_normal((32, 16, 3, 3))], pads=[1, 1, 1, 1]), "Conv2dNCHW"),
        ("conv1x1_stride2", single_node("Conv", [("x", [1, 32, 14, 14])], [1, 64, 7, 7],
                                        [RNG.standard_normal((64, 32, 1, 1))], strides=[2, 2]), "Conv2dNCHW"),
        ("depthwise_rows_of_whole_vectors", single_node("Conv", [("x", [1, 8, 48, 48])], [1, 8, 48, 48],
                                                        [RNG.standard_normal((8, 1, 3, 3))], pads=[1, 1, 1, 1],
                                                        group=8), "GroupedConv2dNCHW"),
        ("depthwise_stride2_half_vector_tiles", single_node("Conv", [("x", [1, 8, 80, 80])], [1, 8, 40, 40],
                                                            [RNG.standard_normal((8, 1, 3, 3))], pads=[1, 1, 1, 1],
                                                            strides=[2, 2], group=8), "GroupedConv2dNCHW"),
        ("depthwise_seven_rows_a_tile", single_node("Conv", [("x", [1, 8, 56, 56])], [1, 8, 56, 56],
                                                    [RNG.standard_normal((8, 1, 3, 3))], pads=[1, 1, 1, 1],
                                                    group=8), "GroupedConv2dNCHW"),
        ("depthwise_two_rows_of_split_vectors", single_node("Conv", [("x", [1, 8, 14, 14])], [1, 8, 14, 14],
                                                            [RNG.standard_normal((8, 1, 3, 3))], pads=[1, 1, 1, 1],
                                                            group=8), "GroupedConv2dNCHW"),
        ("conv_24_channels", single_node("Conv", [("x", [1, 8, 10, 10])], [1, 24, 10, 10],
                                         [RNG.standard_normal((24, 8, 3, 3))], pads=[1, 1, 1, 1]), "Conv2dNCHW"),
        ("depthwise", single_node("Conv", [("x", [1, 32, 16, 16])], [1, 32, 16, 16],
                                  [RNG.standard_normal((32, 1, 3, 3))], pads=[1, 1, 1, 1], group=32),
         "GroupedConv2dNCHW"),
        ("depthwise_stride2", single_node("Conv", [("x", [1, 32, 16, 16])], [1, 32, 8, 8],
                                          [RNG.standard_normal((32, 1, 3, 3))], pads=[1, 1, 1, 1], strides=[2, 2],
                                          group=32), "GroupedConv2dNCHW"),
        ("depthwise_stride2_odd_width", single_node("Conv", [("x", [1, 16, 15, 15])], [1, 16, 8, 8],
                                                    [RNG.standard_normal((16, 1, 3, 3))], pads=[1, 1, 1, 1],
                                                    strides=[2, 2], group=16), "GroupedConv2dNCHW"),
        # Rows of a prime length above the widest tile (32): a tile of one output, whose write-back has no loop
        # of its own. Vectorizing "its" innermost loop had vectorized the reduction: wrong numbers (SLANet).
        ("depthwise_stride2_prime_rows", single_node("Conv", [("x", [1, 8, 12, 74])], [1, 8, 6, 37],
                                                     [RNG.standard_normal((8, 1, 3, 3))], pads=[1, 1, 1, 1],
                                                     strides=[2, 2], group=8), "GroupedConv2dNCHW"),
        ("depthwise_stride2_prime_rows_with_bias", single_node("Conv", [("x", [1, 8, 6, 122])], [1, 8, 3, 61],
                                                               [RNG.standard_normal((8, 1, 3, 3)),
                                                                RNG.standard_normal(8)], pads=[1, 1, 1, 1],
                                                               strides=[2, 2], group=8), "GroupedConv2dNCHW"),
        ("pointwise", single_node("Conv", [("x", [1, 16, 32, 32])], [1, 24, 32, 32],
                                  [RNG.standard_normal((24, 16, 1, 1))]), "PointwiseConv2dNCHW"),
        ("pointwise_small_map", single_node("Conv", [("x", [1, 16, 7, 7])], [1, 32, 7, 7],
                                            [RNG.standard_normal((32, 16, 1, 1))]), "Conv2dNCHW"),
        ("conv3x3_narrow_rows", single_node("Conv", [("x", [1, 16, 7, 7])], [1, 64, 7, 7],
                                            [RNG.standard_normal((64, 16, 3, 3))], pads=[1, 1, 1, 1]),
         "Conv2dNCHW"),
        # 4 input channels a group: too few for Conv2dNCHW's tile on any unit
        ("grouped", single_node("Conv", [("x", [1, 16, 8, 8])], [1, 32, 8, 8],
                                [RNG.standard_normal((32, 4, 3, 3))], pads=[1, 1, 1, 1], group=4),
         "GroupedConv2dNCHW"),
        # 8 a group: Conv2dNCHW's tile within a group on x86 (AVX2, AVX-512), the grouped rule on NEON
        ("grouped_8_channels_a_group", single_node("Conv", [("x", [1, 32, 8, 8])], [1, 32, 8, 8],
                                                   [RNG.standard_normal((32, 8, 3, 3))], pads=[1, 1, 1, 1],
                                                   group=4), HOST_GROUPED_RULE),
        # 4 groups of 16 input and 20 output channels over 16x16 (whole vectors of pixels): a tile within a group
        ("grouped_pointwise", single_node("Conv", [("x", [1, 64, 16, 16])], [1, 80, 16, 16],
                                          [RNG.standard_normal((80, 16, 1, 1)), RNG.standard_normal(80)], group=4),
         "PointwiseConv2dNCHW"),
        # the same over 7x7 (49 pixels: not whole vectors): tiles of 2 vectors, the last clamped to the map's end
        ("grouped_pointwise_7x7", single_node("Conv", [("x", [1, 64, 7, 7])], [1, 80, 7, 7],
                                              [RNG.standard_normal((80, 16, 1, 1))], group=4),
         "PointwiseConv2dNCHW"),
        ("dense", single_node("Gemm", [("x", [4, 64])], [4, 48], [RNG.standard_normal((48, 64))], transB=1),
         "Matmul"),
        ("gemv", single_node("MatMul", [("x", [1, 256])], [1, 160], [RNG.standard_normal((256, 160))]), "Matmul"),
        ("batch_matmul", single_node("MatMul", [("a", [2, 4, 32, 16]), ("b", [2, 4, 16, 32])], [2, 4, 32, 32]),
         "Matmul"),
        ("softmax", single_node("Softmax", [("x", [8, 128])], [8, 128], axis=-1), "Reduction"),
        ("softmax_one_row", single_node("Softmax", [("x", [1, 1000])], [1, 1000], axis=-1),
         "WholeTensorReduction"),
        ("global_pool", single_node("GlobalAveragePool", [("x", [1, 64, 7, 7])], [1, 64, 1, 1]), "Reduction"),
        ("elementwise", single_node("Relu", [("x", [4, 64, 32])], [4, 64, 32]), "Elementwise"),
        # A whole tensor to one value (DynamicQuantizeLinear's min and max): vector-wide partial results.
        ("reduce_max_all", single_node("ReduceMax", [("x", [1, 128, 384])], [], keepdims=0), "ScalarReduction"),
        ("reduce_min_all", single_node("ReduceMin", [("x", [3, 64, 80])], [], keepdims=0), "ScalarReduction"),
        ("reduce_sum_all_32_lanes", single_node("ReduceSum", [("x", [3, 17, 32])], [], keepdims=0),
         "ScalarReduction"),
        ("reduce_max_all_odd", single_node("ReduceMax", [("x", [7, 13])], [], keepdims=0), "Generic"),
    ],
)
def test_each_rule_takes_its_operator_and_keeps_the_numbers(name, model, rule, tmp_path, caplog):
    counts = compile_and_compare(model, tmp_path, caplog)
    assert counts.get(rule, 0) >= 1, counts


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
def test_a_scalar_reduction_with_its_scalar_epilogue_keeps_the_numbers_at_each_opt_level(opt_level, tmp_path,
                                                                                           caplog):
    """DynamicQuantizeLinear's form: min and max of a whole activation, then scalar arithmetic (fused from
    opt_level 1), against onnxruntime."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["hi"], keepdims=0),
             helper.make_node("ReduceMin", ["x"], ["lo"], keepdims=0),
             helper.make_node("Sub", ["hi", "lo"], ["span"]),
             helper.make_node("Mul", ["span", "k"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 48, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                       [numpy_helper.from_array(np.float32(1 / 255), "k")])
    x = RNG.standard_normal((2, 48, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        forge.from_onnx(model).compile(output_path=tmp_path / "a", opt_level=opt_level)
    np.testing.assert_array_equal(forge.Runtime(tmp_path / "a").infer(x)[0], expected)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("schedules:"))
    assert "ScalarReduction 2" in line, line


def test_pointwise_tile_straddles_rows_with_bias_residual_and_clip(tmp_path, caplog):
    # MobileNetV2's projection: 1x1 conv + bias, then the residual add; the tile of
    # 2 x 16 pixels crosses the 24-pixel rows, and 48 output channels make 6 tiles of 8.
    w, b = RNG.standard_normal((48, 32, 1, 1)), RNG.standard_normal(48)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "w1"], ["c"], name="project"),
        helper.make_node("Add", ["c", "skip"], ["s"], name="residual"),
        helper.make_node("Clip", ["s", "lo", "hi"], ["y"], name="relu6"),
    ]
    inits = [numpy_helper.from_array(w.astype(np.float32), "w0"), numpy_helper.from_array(b.astype(np.float32), "w1"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 24, 24]),
                               helper.make_tensor_value_info("skip", TensorProto.FLOAT, [1, 48, 24, 24])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48, 24, 24])], inits)
    counts = compile_and_compare(model, tmp_path, caplog)
    assert counts == {"PointwiseConv2dNCHW": 1}, counts


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("context", ["no-epilogue", "bias-residual-clip", "batch-3-bias", "grouped-bias",
                                     "grouped-14x14-bias", "grouped-14x14-bias-residual-clip"])
def test_pointwise_tiles_clamped_to_the_maps_end_keep_the_numbers(context, opt_level, tmp_path, caplog):
    """A 1x1 convolution over 28x28 (49 vectors of 16 lanes, 98 of 8): the register budget's tile, 3 vectors
    of pixels, whose last tile overlaps the one before; 4 groups of 16 -> 20 channels, a tile within a group;
    grouped over 14x14 (196 pixels: not whole vectors on x86), the channel tiles in parallel; on this host's
    unit, against onnxruntime."""
    group = 4 if context.startswith("grouped") else 1
    size = 14 if "14x14" in context else 28
    (cin, cout), batch = (64, 80) if group > 1 else (33, 40), 3 if context.startswith("batch") else 1
    inits = [numpy_helper.from_array(RNG.standard_normal((cout, cin // group, 1, 1)).astype(np.float32) * 0.2, "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, size, size])]
    conv_inputs = ["x", "w"]
    if context != "no-epilogue":
        inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), "b"))
        conv_inputs.append("b")
    residual = context.endswith("bias-residual-clip")
    nodes = [helper.make_node("Conv", conv_inputs, ["c" if residual else "y"], name="conv", group=group)]
    if residual:
        inputs.append(helper.make_tensor_value_info("skip", TensorProto.FLOAT, [batch, cout, size, size]))
        inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6, np.float32), "hi")]
        nodes += [helper.make_node("Add", ["c", "skip"], ["s"], name="residual"),
                  helper.make_node("Clip", ["s", "lo", "hi"], ["y"], name="relu6")]
    model = make_model(nodes, inputs,
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cout, size, size])], inits)
    feeds = {vi.name: RNG.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input}
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        forge.from_onnx(model).compile(output_path=tmp_path / "a", opt_level=opt_level)
    (got,) = forge.Runtime(tmp_path / "a").infer(*feeds.values())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("schedules:"))
    assert "PointwiseConv2dNCHW 1" in line, line


def test_layer_norm_and_gelu_chain(tmp_path, caplog):
    scale, bias = RNG.standard_normal(64), RNG.standard_normal(64)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "w0", "w1"], ["ln"], name="ln", axis=-1),
        helper.make_node("Erf", ["ln"], ["y"], name="erf"),
    ]
    inits = [numpy_helper.from_array(scale.astype(np.float32), "w0"), numpy_helper.from_array(bias.astype(np.float32), "w1")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 64])], inits)
    counts = compile_and_compare(model, tmp_path, caplog)
    assert "Generic" not in counts


def test_a_whole_network_uses_the_specialised_rules(tmp_path, caplog):
    counts = compile_and_compare(conv_bn_net(seed=3, channels=16), tmp_path, caplog)
    assert counts["Conv2dNCHW"] >= 2 and counts["Matmul"] == 1


def test_inference_dropout_leaves_the_classifier_to_the_matmul_rule(tmp_path, caplog):
    # AlexNet/VGG-style classifier: Gemm -> Relu -> Dropout -> Gemm (ONNX Dropout outside training).
    w0, w1 = RNG.standard_normal((64, 256)), RNG.standard_normal((10, 64))
    nodes = [
        helper.make_node("Gemm", ["x", "w0"], ["h"], name="fc6", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu6"),
        helper.make_node("Dropout", ["r"], ["d"], name="drop6", ratio=0.5),
        helper.make_node("Gemm", ["d", "w1"], ["y"], name="fc7", transB=1),
    ]
    inits = [numpy_helper.from_array(w.astype(np.float32), f"w{i}") for i, w in enumerate((w0, w1))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits, opset=11)
    counts = compile_and_compare(model, tmp_path, caplog)
    assert counts == {"Matmul": 2}, counts


def test_remove_dropout_keeps_a_dropout_whose_mask_is_used():
    from tvm import relax

    from forge_core.passes import PassContext, run_passes

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        kept = bb.emit(relax.op.nn.dropout(x, 0.5))
        dropped = bb.emit(relax.op.nn.dropout(x, 0.5))
        out = bb.emit(relax.Tuple([bb.emit(relax.TupleGetItem(kept, 1)), bb.emit(relax.TupleGetItem(dropped, 0))]))
        bb.emit_func_output(out)
    mod = run_passes(bb.get(), ["remove_dropout"], PassContext(options={}))
    assert str(mod).count("R.nn.dropout") == 1
    assert forge.IRModule(mod).operators.get("nn.dropout") == 1


def test_an_operator_no_rule_covers_still_compiles_and_is_reported(tmp_path, caplog):
    # TopK: a sort, which no specialised rule takes.
    nodes = [helper.make_node("TopK", ["x", "k"], ["y", "idx"], name="topk", axis=-1)]
    k = numpy_helper.from_array(np.array([5], np.int64), "k")
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 50])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5]),
                        helper.make_tensor_value_info("idx", TensorProto.INT64, [4, 5])], [k])
    x = RNG.standard_normal((4, 50)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        forge.from_onnx(model).compile(output_path=tmp_path / "a")
    values, indices = forge.Runtime(tmp_path / "a").infer(x)
    expected = -np.sort(-x, axis=-1)[:, :5]
    np.testing.assert_allclose(values, expected, rtol=1e-6)
    np.testing.assert_array_equal(np.take_along_axis(x, indices, axis=-1), values)
    assert any("fell back" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_schedule_report_names_rules_per_function():
    import tvm
    from tvm import relax

    from forge_core.compiler.pipeline import schedule_stage
    from forge_core.targets import resolve_target

    ir = forge.from_onnx(conv_bn_net(seed=1, channels=16))
    target = resolve_target("llvm")
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])(ir.mod)
    mod = schedule_stage(target, 3)(mod)
    report = schedule_report(mod)
    assert "Conv2dNCHW" in report and all(isinstance(n, str) for names in report.values() for n in names)
    scheduled = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert all(f.attrs is not None and RULE_ATTR in f.attrs for f in scheduled)


def test_host_target_fills_cpu_and_cores(monkeypatch):
    from forge_core.targets import resolve_target
    from forge_core.threads import available_cores

    monkeypatch.delenv("FORGE_NUM_THREADS", raising=False)
    target = resolve_target("llvm")
    assert target.attrs["mcpu"] and int(target.attrs["num-cores"]) == available_cores()
    monkeypatch.setenv("FORGE_NUM_THREADS", "1")
    assert int(resolve_target("llvm").attrs["num-cores"]) == 1
    assert int(resolve_target("llvm -num-cores=3").attrs["num-cores"]) == 3
    assert "num-cores" not in resolve_target("llvm -mcpu=skylake").attrs  # another machine: not ours
    assert int(resolve_target("raspberry-pi/5").attrs["num-cores"]) == 4  # a tag's own


def test_runtime_threads_follow_a_tags_cores(tmp_path, monkeypatch):
    import forge_core.threads as threads

    ir = forge.from_onnx(conv_bn_net(seed=1))
    ir.compile(target="llvm -num-cores=1", output_path=tmp_path / "one")
    monkeypatch.delenv("FORGE_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_chosen_by_forge", True)
    assert forge.Runtime(tmp_path / "one").num_threads == 1

