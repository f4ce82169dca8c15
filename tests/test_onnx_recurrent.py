"""ONNX RNN, GRU and LSTM against onnxruntime on random weights, at opt_level 0 and 3.

Weights are drawn as PyTorch initializes them (uniform in +-1/sqrt(hidden)),
inputs and initial states standard normal. Many nodes share one model (each
with its own inputs and outputs), so that one compile covers a grid: every
direction, with and without initial states, odd hidden and input sizes (7, 33),
one step and several, batch 1 and 3, and sizes whose kernel runs in parallel.
The kernel's exp, sigmoid and tanh are checked against float64 on their own.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from model_factory import IR_VERSION
from onnx import TensorProto, helper, numpy_helper

import forge
import forge_onnx.backend as backend
from forge_core.compiler.compile import compile_to_function
from forge_core.compiler.pipeline import lower_to_tir
from forge_core.schedules.blocks import VectorUnit
from forge_onnx import recurrent_schedules
from forge_onnx.converters import recurrent_kernel, recurrent_math

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
# onnxruntime's own sigmoid/tanh are approximations of ~1e-7; errors add up over the steps.
RTOL, ATOL = 1e-5, 1e-5


@dataclass(frozen=True)
class Node:
    """One recurrent node of a test model."""

    op: str
    direction: str = "forward"
    hidden: int = 7
    inputs: int = 33
    seq: int = 5
    batch: int = 1
    initial: bool = False
    bias: bool = True
    lengths: tuple[int, ...] | None = None
    layout: int = 0
    peepholes: bool = False
    attrs: dict = field(default_factory=dict, hash=False)

    @property
    def directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1


def build(nodes: list[Node], seed: int = 0, dynamic: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One model holding every node, each with inputs ``X<i>`` (``L<i>``, ``h<i>``, ``c<i>``) and its own outputs.

    Values do not depend on ``layout``: a node with ``layout`` 1 gets the transposes of its layout-0 twin's.
    ``dynamic`` declares each node's sequence length and batch as dynamic dims (``seq<i>``, ``batch<i>``).
    """
    rng = np.random.default_rng(seed)
    onnx_nodes, inputs, outputs, inits, feeds = [], [], [], [], {}

    def tensor(name: str, shape: list[int], elem: int = TensorProto.FLOAT) -> helper.ValueInfoProto:
        if dynamic:  # the shapes hold a node's seq and batch as sentinels: name them
            index = name.lstrip("XLYhc")
            names = {-1: f"seq{index}", -2: f"batch{index}"}
            shape = [names.get(d, d) for d in shape]
        return helper.make_tensor_value_info(name, elem, shape)

    def dims(node: Node) -> tuple[int, int]:
        return (-1, -2) if dynamic else (node.seq, node.batch)

    def batch_first(array: np.ndarray, node: Node) -> np.ndarray:
        return array.swapaxes(0, 1) if node.layout == 1 else array

    for i, node in enumerate(nodes):
        gates, dirs, hidden = GATES[node.op], node.directions, node.hidden
        bound = 1.0 / np.sqrt(hidden)
        names = [f"X{i}", f"W{i}", f"R{i}", f"B{i}" if node.bias else ""]
        weights = {f"W{i}": (dirs, gates * hidden, node.inputs), f"R{i}": (dirs, gates * hidden, hidden)}
        if node.bias:
            weights[f"B{i}"] = (dirs, 2 * gates * hidden)
        if node.peepholes:
            weights[f"P{i}"] = (dirs, 3 * hidden)
        for name, shape in weights.items():
            inits.append(numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name))
        x = batch_first(rng.standard_normal((node.seq, node.batch, node.inputs)).astype(np.float32), node)
        seq, batch = dims(node)
        inputs.append(tensor(f"X{i}", [batch, seq, node.inputs] if node.layout == 1 else [seq, batch, node.inputs]))
        feeds[f"X{i}"] = x
        names.append("")
        if node.lengths is not None:
            names[-1] = f"L{i}"
            inputs.append(tensor(f"L{i}", [batch], TensorProto.INT32))
            feeds[f"L{i}"] = np.array(node.lengths, np.int32)
        states = ["h"] + (["c"] if node.op == "LSTM" else [])
        state_shape = [dirs, batch, hidden] if node.layout == 0 else [batch, dirs, hidden]
        for state in states:
            if node.initial:
                names.append(f"{state}{i}")
                inputs.append(tensor(f"{state}{i}", state_shape))
                value = rng.standard_normal((dirs, node.batch, hidden)).astype(np.float32)
                feeds[f"{state}{i}"] = batch_first(value, node)
            else:
                names.append("")
        if node.peepholes:
            names += [""] * (7 - len(names)) + [f"P{i}"]
        while names and names[-1] == "":
            names.pop()
        y_shape = [batch, seq, dirs, hidden] if node.layout == 1 else [seq, dirs, batch, hidden]
        node_outputs = [f"Y{i}"] + [f"Y{state}{i}" for state in states]
        outputs += [tensor(f"Y{i}", y_shape)] + [tensor(f"Y{state}{i}", state_shape) for state in states]
        attrs = {"hidden_size": hidden, "direction": node.direction, **node.attrs}
        if node.layout:
            attrs["layout"] = node.layout
        onnx_nodes.append(helper.make_node(node.op, names, node_outputs, name=f"n{i}", **attrs))
    graph = helper.make_graph(onnx_nodes, "recurrent", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model, feeds


def reference(nodes: list[Node], seed: int = 0) -> dict[str, np.ndarray]:
    """onnxruntime's outputs by name; layout-1 nodes (which onnxruntime lacks) run as their layout-0 twins."""
    twins = [dataclasses.replace(node, layout=0) for node in nodes]
    model, feeds = build(twins, seed)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    results = dict(zip([o.name for o in model.graph.output], session.run(None, feeds)))
    for i, node in enumerate(nodes):
        if node.layout == 1:
            results[f"Y{i}"] = results[f"Y{i}"].transpose(2, 0, 1, 3)
            for state in "hc":
                if f"Y{state}{i}" in results:
                    results[f"Y{state}{i}"] = results[f"Y{state}{i}"].swapaxes(0, 1)
    return results


def check(nodes: list[Node], opt_level: int = 3, seed: int = 0) -> None:
    model, feeds = build(nodes, seed)
    expected = reference(nodes, seed)
    got = backend.prepare(model, opt_level=opt_level).run([feeds[i.name] for i in model.graph.input])
    names = [o.name for o in model.graph.output]
    assert len(got) == len(names) == len(expected)
    for name, g in zip(names, got):
        e = expected[name]
        assert g.shape == e.shape and g.dtype == e.dtype, name
        node = nodes[int(name.lstrip("Yhc"))]
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"output {name} of {node}")


def grid(op: str, **attrs: object) -> list[Node]:
    """Every direction, with and without initial states, odd sizes with one step and with several steps and
    batch 3; plus whole tiles and a size whose kernel runs in parallel."""
    sizes = [(7, 33, 1, 1), (33, 7, 6, 3)]
    nodes = [Node(op, direction, hidden, inputs, seq, batch, initial, attrs=dict(attrs))
             for direction, initial, (hidden, inputs, seq, batch)
             in itertools.product(["forward", "reverse", "bidirectional"], [False, True], sizes)]
    nodes.append(Node(op, "forward", 16, 5, 3, 1, True, attrs=dict(attrs)))  # whole tiles, no padding
    # Work per step above PARALLEL_WORK: tiles shared among threads, barriers between steps.
    nodes.append(Node(op, "bidirectional", 96, 20, 4, 3, True, attrs=dict(attrs)))
    return nodes


PARALLEL_WORK = 50_000
"""The parallel threshold in these tests: only the grid's largest node (the production one is higher)."""


@pytest.fixture
def parallel_grid_node(monkeypatch):
    monkeypatch.setattr(recurrent_kernel, "PARALLEL_MIN_WORK", PARALLEL_WORK)
    for kind in ("rnn", "gru", "lstm"):
        cell = recurrent_kernel.RecurrentCell(kind, 4, 3, 96, (False, True), ((),) * 2)
        assert recurrent_kernel.KernelOptions.default(cell).parallel
        small = recurrent_kernel.RecurrentCell(kind, 6, 3, 33, (False, True), ((),) * 2)
        assert not recurrent_kernel.KernelOptions.default(small).parallel


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("op, attrs", [("RNN", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("LSTM", {})],
                         ids=["rnn", "gru", "gru_linear_before_reset", "lstm"])
def test_against_onnxruntime(op, attrs, opt_level, parallel_grid_node):
    check(grid(op, **attrs), opt_level)


@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("op, attrs", [("RNN", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("LSTM", {})],
                         ids=["rnn", "gru", "gru_linear_before_reset", "lstm"])
def test_dynamic_sequence_and_batch_against_onnxruntime(op, attrs, opt_level, parallel_grid_node):
    """The grid with every node's sequence length and batch dynamic: one kernel each, built without the sizes
    (a parallel one included), run at the grid's sizes; plus layout 1, sequence_lens and peepholes."""
    nodes = grid(op, **attrs) + [Node(op, "bidirectional", 9, 4, 5, 3, True, lengths=(5, 0, 2), attrs=dict(attrs)),
                                 Node(op, "forward", 9, 4, 3, 2, True, layout=1, attrs=dict(attrs))]
    if op == "LSTM":
        nodes.append(Node(op, "reverse", 9, 4, 4, 2, True, peepholes=True))
    model, feeds = build(nodes, dynamic=True)
    ir = forge.from_onnx(model)
    assert all(shape[:2] == (-1, -1) for name, shape in zip(ir.input_names, ir.input_shapes) if name[0] == "X")
    kernels = [f for f in ir.mod.functions.values() if recurrent_kernel.CELL_ATTR in (f.attrs or {})]
    cells = [recurrent_kernel.RecurrentCell.from_json(str(f.attrs[recurrent_kernel.CELL_ATTR])) for f in kernels]
    assert len(cells) == len(nodes) and all(c.seq is None and c.batch is None for c in cells)
    run = compile_to_function(ir, target={"kind": "llvm", "num-cores": 2}, opt_level=opt_level)
    expected = reference(nodes)
    got = run(*[feeds[name] for name in ir.input_names])
    for output, g in zip(model.graph.output, got):
        np.testing.assert_allclose(g, expected[output.name], rtol=RTOL, atol=ATOL, err_msg=output.name)


def test_dynamic_batch_checks_the_states_batch():
    """initial_h shares X's dynamic batch: a run that gives them different batches is an error, not a read past
    the state's end."""
    model, feeds = build([Node("GRU", "forward", 7, 3, 4, 2, True)], dynamic=True)
    run = forge.from_onnx(model).get_inference_function()
    with pytest.raises(forge.InputError, match="batch0"):
        run(feeds["X0"], feeds["h0"][:, :1])


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_a_state_whose_batch_is_a_dynamic_dim_of_its_own(op):
    """Silero VAD names its state's batch apart from its audio's (``state: [2, state_dim1, 128]``): Relax cannot
    relate the two dims at import, so they are checked at run time; equal, the model gives onnxruntime's numbers,
    unequal, forge.InputError (onnxruntime fails too)."""
    model, feeds = build([Node(op, "bidirectional", 7, 3, 4, 2, True)], dynamic=True)
    for value in model.graph.input:
        if value.name[0] in "hc":
            value.type.tensor_type.shape.dim[1].dim_param = f"{value.name}_batch"
    onnx.checker.check_model(model)
    ir = forge.from_onnx(model)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for run in (ir.get_inference_function(), compile_to_function(ir, opt_level=0)):
        got = run(*[feeds[name] for name in ir.input_names])
        for g, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, want, rtol=RTOL, atol=ATOL)
        wrong = {name: value[:, :1] if name[0] in "hc" else value for name, value in feeds.items()}
        with pytest.raises(forge.InputError, match=f"{op} 'n0' input initial_h: its batch .* given .*\\[1 2\\]"):
            run(*[wrong[name] for name in ir.input_names])


def test_kernel_options_follow_the_target():
    cell = recurrent_kernel.RecurrentCell("lstm", 4, 1, 40, (False, True), ((),) * 2)
    built = recurrent_kernel.KernelOptions(parallel=True)
    options = lambda target: recurrent_schedules.kernel_options(cell, built, tvm.target.Target(target))  # noqa: E731
    assert options({"kind": "llvm", "mcpu": "znver5", "num-cores": 2}) == built
    assert options({"kind": "llvm", "mcpu": "znver5", "num-cores": 1}) == recurrent_kernel.KernelOptions()
    neon = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76", "num-cores": 4}
    assert options(neon) == recurrent_kernel.KernelOptions(accumulators=4, parallel=True)
    assert options({"kind": "cuda", "arch": "sm_80"}).gpu


def test_kernels_rebuilt_for_the_target_compute_the_same(monkeypatch):
    """A single-core target with 256-bit vectors: the kernels lose their parallel region and half their
    accumulators (the compile-time pass rebuilds them); the numbers stay onnxruntime's."""
    monkeypatch.setattr(recurrent_kernel, "PARALLEL_MIN_WORK", 1000)
    monkeypatch.setattr(recurrent_schedules, "vector_unit", lambda target: VectorUnit(256, 16))
    nodes = [Node("LSTM", "bidirectional", 40, 6, 4, 1, initial=True, peepholes=True),
             Node("GRU", "reverse", 33, 6, 3, 2), Node("RNN", "forward", 70, 6, 3, 1, initial=True)]
    model, feeds = build(nodes)
    expected = reference(nodes)
    ir = forge.from_onnx(model)
    defaults = [recurrent_kernel.KernelOptions(**json.loads(str(f.attrs[recurrent_kernel.OPTIONS_ATTR])))
                for f in ir.mod.functions.values() if recurrent_kernel.OPTIONS_ATTR in (f.attrs or {})]
    assert len(defaults) == 3 and all(o.parallel and o.accumulators == 8 for o in defaults)
    run = compile_to_function(ir, target={"kind": "llvm", "num-cores": 1})
    got = run(*[feeds[i.name] for i in model.graph.input])
    for output, g in zip(model.graph.output, got):
        np.testing.assert_allclose(g, expected[output.name], rtol=RTOL, atol=ATOL, err_msg=output.name)


def test_cuda_builds_one_thread_kernels(tmp_path):
    """GPU targets get the kernel on one GPU thread (the GPU pipeline needs every kernel bound to threads)."""
    model, _ = build([Node("LSTM", "bidirectional", 20, 6, 4, 2, initial=True, lengths=(4, 2)),
                      Node("GRU", "forward", 7, 3, 2, 1)])
    forge.from_onnx(model).compile(target="cuda", output_path=tmp_path / "cuda")
    assert (tmp_path / "cuda" / "model_library.so").is_file()


def test_cuda_kernels_states_live_in_device_memory():
    """The GPU kernel's state buffers (h, c) are allocated by its host function; Forge's TIR pipeline made
    such small allocations stack arrays, so the GPU wrote to a host address (cudaErrorIllegalAddress on an
    H200, the voice-activity model). The host code now takes them from the device workspace, no ``alloca``."""
    import re

    from forge_core.compiler.options import CompileOptions
    from forge_core.compiler.pipeline import build as build_executable
    from forge_core.compiler.pipeline import prepare_graph
    from forge_core.ir import weights
    from forge_core.targets.parsing import resolve_target

    model, _ = build([Node("LSTM", "forward", 16, 32, 4, 1)])
    ir = forge.from_onnx(model)
    target = resolve_target("cuda -arch=sm_90")
    executable = build_executable(prepare_graph(weights.bind_params(ir.mod, ir.params), CompileOptions.validate(),
                                                target), target, 3)
    modules, hosts = [executable.mod], []
    while modules:
        module = modules.pop()
        modules += list(module.imports)
        hosts += [module.inspect_source("ll")] if module.kind == "llvm" else []
    (host,) = hosts
    start = host.index("define internal fastcc i32 @lstm")
    body = host[start:host.index("\n}\n", start)]
    assert not re.search(r"alloca \[\d+ x float\]", body), "a state buffer is a host stack array"
    assert "TVMBackendAllocWorkspace" in body


def test_lstm_options():
    check([
        Node("LSTM", "forward", 9, 4, 5, 2, initial=True, peepholes=True),
        Node("LSTM", "bidirectional", 20, 6, 4, 3, initial=True, peepholes=True, attrs={"clip": 0.5}),
        Node("LSTM", "reverse", 9, 4, 5, 2, attrs={"input_forget": 1}),
        Node("LSTM", "bidirectional", 7, 3, 4, 2, initial=True, layout=1),
        Node("LSTM", "forward", 8, 3, 5, 1, bias=False),
        Node("LSTM", "bidirectional", 7, 3, 4, 2, attrs={
            "activations": ["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "Tanh", "Relu"],
            "activation_alpha": [0.3, 0.2], "activation_beta": [0.4]}),
    ])


def test_gru_options():
    check([
        Node("GRU", "forward", 9, 4, 5, 2, initial=True, attrs={"clip": 0.4}),
        Node("GRU", "bidirectional", 7, 3, 4, 2, initial=True, layout=1, attrs={"linear_before_reset": 1}),
        Node("GRU", "reverse", 8, 3, 5, 1, bias=False, attrs={"linear_before_reset": 1}),
        Node("GRU", "bidirectional", 7, 3, 4, 2, attrs={
            "activations": ["Sigmoid", "Elu", "HardSigmoid", "ScaledTanh"],
            "activation_alpha": [0.7, 0.25, 1.5], "activation_beta": [0.45, 0.6]}),
    ])


ACTIVATIONS = [("Relu", None, None), ("Sigmoid", None, None), ("Affine", 0.5, 0.1), ("LeakyRelu", 0.1, None),
               ("ThresholdedRelu", 0.2, None), ("ScaledTanh", 1.5, 0.7), ("HardSigmoid", 0.3, 0.4),
               ("Elu", 0.9, None), ("Softsign", None, None), ("Softplus", None, None)]


def test_rnn_activations():
    """Every ONNX activation, one RNN node each (one model), with their alpha and beta."""
    nodes = []
    for activation, alpha, beta in ACTIVATIONS:
        attrs: dict = {"activations": [activation]}
        if alpha is not None:
            attrs["activation_alpha"] = [alpha]
        if beta is not None:
            attrs["activation_beta"] = [beta]
        nodes.append(Node("RNN", "forward", 9, 4, 5, 2, initial=True, attrs=attrs))
    check(nodes)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_sequence_lengths(op):
    """Rows shorter than the sequence (and one of length 0) in every direction, layouts 0 and 1."""
    check([
        Node(op, "forward", 7, 3, 5, 3, initial=True, lengths=(5, 2, 0)),
        Node(op, "reverse", 7, 3, 5, 3, initial=True, lengths=(1, 5, 3)),
        Node(op, "bidirectional", 18, 3, 4, 3, lengths=(4, 3, 0), layout=1),
    ])


def test_weights_as_model_inputs():
    """Weights that are not constants are rearranged by operators in the graph, at inference."""
    nodes = [Node("LSTM", "bidirectional", 9, 4, 3, 2, initial=True, peepholes=True),
             Node("GRU", "reverse", 7, 4, 3, 1, attrs={"linear_before_reset": 1})]
    model, feeds = build(nodes)
    expected = reference(nodes)
    for tensor in list(model.graph.initializer):
        feeds[tensor.name] = numpy_helper.to_array(tensor)
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, TensorProto.FLOAT, list(tensor.dims)))
    del model.graph.initializer[:]
    got = backend.prepare(model).run([feeds[i.name] for i in model.graph.input])
    for output, g in zip(model.graph.output, got):
        np.testing.assert_allclose(g, expected[output.name], rtol=RTOL, atol=ATOL, err_msg=output.name)


def _lstm_float64(x, w, r, b, p, h0, c0, reverse):
    """ONNX LSTM (default activations) in float64 numpy, one direction: Y [seq, batch, hidden], h, c."""
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    hidden = r.shape[-1]
    h, c, ys = h0, c0, {}
    for t in (range(len(x) - 1, -1, -1) if reverse else range(len(x))):
        gates = x[t] @ w.T + h @ r.T + b[:4 * hidden] + b[4 * hidden:]
        i, o, f, g = np.split(gates, 4, axis=-1)
        i, f = sigmoid(i + p[:hidden] * c), sigmoid(f + p[2 * hidden:] * c)
        c = f * c + i * np.tanh(g)
        h = sigmoid(o + p[hidden:2 * hidden] * c) * np.tanh(c)
        ys[t] = h
    return np.stack([ys[t] for t in range(len(x))]), h, c


def test_float64():
    """float64 computes in float64 (the C library's exp/tanh), against numpy (onnxruntime has no double LSTM)."""
    node = Node("LSTM", "bidirectional", 9, 4, 5, 2, initial=True, peepholes=True)
    model, feeds = build([node])
    arrays = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(arrays[tensor.name], tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.DOUBLE
    feeds = {k: v.astype(np.float64) for k, v in feeds.items()}
    y, y_h, y_c = backend.prepare(model).run([feeds[i.name] for i in model.graph.input])
    assert y.dtype == y_h.dtype == y_c.dtype == np.float64
    for d in range(2):
        want = _lstm_float64(feeds["X0"], arrays["W0"][d], arrays["R0"][d], arrays["B0"][d], arrays["P0"][d],
                             feeds["h0"][d], feeds["c0"][d], reverse=d == 1)
        for g, e in zip((y[:, d], y_h[d], y_c[d]), want):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_a_length_beyond_the_sequence_raises():
    model, feeds = build([Node("GRU", "forward", 7, 3, 4, 2, lengths=(4, 5))])
    rep = backend.prepare(model)
    with pytest.raises(Exception, match="sequence_lens"):
        rep.run([feeds[i.name] for i in model.graph.input])


def test_operands_that_disagree_with_hidden_size_are_refused():
    model, _ = build([Node("LSTM", "forward", 7, 3, 4, 2, initial=True)])
    next(a for a in model.graph.node[0].attribute if a.name == "hidden_size").i = 8
    with pytest.raises(forge.OperatorConversionError, match=r"input W has shape \[1, 28, 3\], expected \[1, 32, 3\]"):
        forge.from_onnx(model)


def test_one_kernel_for_the_whole_sequence():
    """The graph is the input projection (one matmul + add) and one recurrent kernel: nothing per time step."""
    model, _ = build([Node("LSTM", "bidirectional", 64, 40, 50, 1, initial=True)])
    ir = forge.from_onnx(model)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    mod = lower_to_tir(ir.mod, target, 3)
    kernels = [gv.name_hint for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and recurrent_kernel.CELL_ATTR in f.attrs]
    matmuls = [gv.name_hint for gv in mod.functions if "matmul" in gv.name_hint]
    assert kernels == ["lstm_sequence"] and len(matmuls) == 1, [gv.name_hint for gv in mod.functions]


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in float32 ulps of the correctly rounded value."""
    rounded = want.astype(np.float32)
    spacing = np.spacing(np.abs(rounded)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def test_exp_sigmoid_tanh_are_float32_exact():
    """Within 1, 1.5 and 2.5 ulps of the correctly rounded value (numpy's float32 exp: 2.3, 1/(1+exp(-x)): 2.7)."""
    x = np.concatenate([np.linspace(-100, 100, 200_001), np.linspace(-1, 1, 100_001),
                        np.geomspace(1e-30, 1, 10_000), -np.geomspace(1e-30, 1, 10_000)]).astype(np.float32)
    n = x.size

    def kernel(fn):
        a = tvm.te.placeholder((n,), "float32", name="a")
        out = tvm.te.compute((n,), lambda i: fn(a(i)), name="out")
        func = tvm.te.create_prim_func([a, out])
        sch = tvm.s_tir.Schedule(func)
        (loop,) = sch.get_loops(sch.get_sblock("out"))
        _, inner = sch.split(loop, [None, 16])
        sch.vectorize(inner)
        built = tvm.compile(sch.mod, target="llvm")
        result = tvm.runtime.empty((n,), "float32")
        built(tvm.runtime.tensor(x), result)
        return result.numpy()

    wide = x.astype(np.float64)
    in_range = np.abs(wide) < 87  # beyond, float32's normal range ends (the clamp)
    assert _ulps(kernel(recurrent_math.exp)[in_range], np.exp(wide[in_range])).max() <= 1
    assert _ulps(kernel(recurrent_math.tanh), np.tanh(wide)).max() <= 1.5
    sigmoid = 1 / (1 + np.exp(-wide))
    normal = sigmoid > np.finfo(np.float32).tiny
    assert _ulps(kernel(recurrent_math.sigmoid)[normal], sigmoid[normal]).max() <= 2.5
