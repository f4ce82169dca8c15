"""Bad input never crashes and never runs wrong (issue 17): the malformed-model fuzz corpus, bounded for CI.

tests/model_fuzz.py runs seeded cases in subprocess workers, so that a
segfault, an abort or a hang is seen as one; every case must end in a
``forge.ForgeError`` whose message names the node, value or field at fault, or
load and compute what onnxruntime computes. A longer run, from the repository
root::

    .venv/bin/python tests/model_fuzz.py --family onnx --cases 3000 --seed 1
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import fuzz_onnx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_fuzz import is_defect, names_something, run_corpus, run_share, summarize
from onnx import TensorProto, helper

import forge

SEED = 2026
ONNX_CASES = 500


def test_onnx_corpus(tmp_path):
    results = run_corpus(["onnx"], ONNX_CASES, SEED, jobs=2, timeout=60, workdir=tmp_path)
    print()
    print(summarize(results))
    assert len(results) == ONNX_CASES
    defects = [r for r in results if is_defect(r)]
    assert not defects, summarize(defects)
    outcomes = Counter(r["outcome"] for r in results)
    assert outcomes["forge-error"] > ONNX_CASES // 2 and outcomes["loaded"] > 10, outcomes
    assert {r["kind"] for r in results} == set(fuzz_onnx.BYTE_KINDS) | set(fuzz_onnx.STRUCTURAL_KINDS)
    assert {r["error"] for r in results if r["outcome"] == "forge-error"} >= {"InvalidModelError",
                                                                               "UnsupportedOperatorError"}


def test_onnx_cases_are_seeded(tmp_path):
    first = fuzz_onnx.make_cases("onnx", SEED, 40, tmp_path / "a")
    again = fuzz_onnx.make_cases("onnx", SEED, 20, tmp_path / "b")
    assert [c["detail"] for c in first[:20]] == [c["detail"] for c in again]
    assert all((tmp_path / "a" / f"{c['id']}.onnx").read_bytes() == (tmp_path / "b" / f"{c['id']}.onnx").read_bytes()
               for c in again)
    assert [c["detail"] for c in fuzz_onnx.make_cases("onnx", SEED + 1, 20, tmp_path / "c")] != \
        [c["detail"] for c in again]


_SELF_TEST = '''
import ctypes, os, time
from forge_core.errors import ModelImportError


def run_case(case):
    kind = case["kind"]
    if kind == "segfault":
        ctypes.string_at(0)
    if kind == "abort":
        os.abort()
    if kind == "hang":
        time.sleep(600)
    if kind == "internal":
        return {}["missing"]
    if kind == "forge":
        raise ModelImportError("node 'conv1' (op Conv): attribute 'kernel_shape' is of type FLOAT")
    if kind == "vague":
        raise ModelImportError("failed")
    return "output 'y' differs" if kind == "wrong" else None
'''


def test_the_harness_sees_crashes_hangs_and_every_outcome(tmp_path, monkeypatch):
    (tmp_path / "fuzz_self_test.py").write_text(textwrap.dedent(_SELF_TEST))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    kinds = ["ok", "segfault", "forge", "abort", "internal", "hang", "wrong", "vague", "ok"]
    cases = [{"id": f"self-{i}", "family": "onnx", "kind": kind, "module": "fuzz_self_test", "names": ["conv1"]}
             for i, kind in enumerate(kinds)]
    results = run_share(cases, tmp_path / "plan.json", tmp_path / "worker.stderr", timeout=5)
    print(json.dumps(results, indent=1)[:3000])
    assert [r["id"] for r in results] == [c["id"] for c in cases]
    assert [r["outcome"] for r in results] == ["loaded", "crash", "forge-error", "crash", "internal", "hang", "wrong",
                                               "forge-error", "loaded"]
    assert "SIGSEGV" in results[1]["message"] and "SIGABRT" in results[3]["message"]
    assert "string_at" in results[1]["stderr"]  # the crash's traceback (faulthandler's, or TVM's handler's)
    assert results[4]["error"] == "KeyError" and "run_case" in results[4]["frame"]
    assert [bool(r.get("vague")) for r in results] == [False] * 7 + [True, False]
    assert [is_defect(r) for r in results] == [False, True, False, True, True, True, True, True, False]


def test_an_error_must_name_what_is_wrong():
    assert names_something("node 'conv1' (op Conv): input 1 is 'w_nowhere'", ["w_nowhere"])
    assert names_something("initializer 'w2' has dims [3] of FLOAT", ["w2"])
    assert not names_something("node 'conv12' failed to convert", ["conv1"])  # whole words only
    assert not names_something("input 10 is missing, see 'x'", ["1"])  # a short number only when quoted
    assert names_something("input '1' of node 'Add_3' is missing", ["1"])
    assert not names_something("KeyError", ["x"])
    assert not names_something("<object at 0x7f>", [])
    assert names_something("the given bytes are not a valid ONNX model", [])


def _convnet() -> onnx.ModelProto:
    return fuzz_onnx._helper_models()["convnet"]


def _edit(change) -> onnx.ModelProto:
    model = _convnet()
    change(model)
    return model


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.name == name)


def _set_attr(model: onnx.ModelProto, node: str, attr: onnx.AttributeProto) -> None:
    target = _node(model, node)
    kept = [a for a in target.attribute if a.name != attr.name]
    del target.attribute[:]
    target.attribute.extend([*kept, attr])


_MALFORMED = {
    "cycle": (lambda m: _node(m, "relu1").input.__setitem__(0, "f1"),
              r"cycle: node 'relu1' \(op Relu\) reads 'f1' of node 'flatten'"),
    "dangling input": (lambda m: _node(m, "fc").input.__setitem__(1, "w_nowhere"),
                       r"node 'fc' \(op Gemm\): input 1 is 'w_nowhere', which no node"),
    "duplicate output": (lambda m: _node(m, "pool1").output.__setitem__(0, "r1"),
                         r"node 'pool1' \(op MaxPool\): output 'r1' is already defined"),
    "short initializer": (lambda m: setattr(m.graph.initializer[0], "raw_data", m.graph.initializer[0].raw_data[:-4]),
                          r"initializer 'w1' has dims \[4, 3, 3, 3\] of FLOAT: 432 bytes of raw_data, but it holds "
                          r"428"),
    "negative dim": (lambda m: m.graph.initializer[1].dims.__setitem__(0, -4),
                     r"initializer 'b1' has a negative dimension: dims \[-4\]"),
    "unknown element type": (lambda m: setattr(m.graph.input[0].type.tensor_type, "elem_type", 999),
                             r"graph input 'x' has elem_type 999"),
    "opset 99": (lambda m: setattr(m.opset_import[0], "version", 99), r"opset 99 of the default ONNX domain"),
    "no opset of the node's domain": (lambda m: setattr(_node(m, "relu1"), "domain", "com.acme"),
                                      r"node 'relu1' \(op com.acme.Relu\): the model imports no opset of its domain"),
    "flag": (lambda m: _set_attr(m, "fc", helper.make_attribute("transB", 2)),
             r"node 'fc' \(op Gemm\): attribute 'transB' is 2; it is a flag"),
    "attribute type": (lambda m: _set_attr(m, "conv1", helper.make_attribute("kernel_shape", 3.0)),
                       r"node 'conv1' \(op Conv\): attribute 'kernel_shape' is of type FLOAT; Conv-11 takes INTS"),
    "unknown attribute": (lambda m: _set_attr(m, "relu1", helper.make_attribute("axes_", 1)),
                          r"node 'relu1' \(op Relu\) has the attribute 'axes_', which Relu-14 does not have"),
    "missing attribute": (lambda m: m.graph.node.append(helper.make_node("Cast", ["y"], ["z"], "cast")),
                          r"node 'cast' \(op Cast\) lacks the required attribute 'to'"),
    "input count": (lambda m: _node(m, "relu1").input.append("x"), r"node 'relu1' \(op Relu\) has 2 inputs"),
    "non-finite": (lambda m: _set_attr(m, "fc", helper.make_attribute("alpha", float("nan"))),
                   r"node 'fc' \(op Gemm\): attribute 'alpha' is nan"),
    "wrong element type": (lambda m: setattr(m.graph.input[0].type.tensor_type, "elem_type", TensorProto.INT32),
                           r"type and shape inference rejects the model: .*node name: conv1"),
    "ir version": (lambda m: setattr(m, "ir_version", 99), r"IR version 99"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_a_malformed_onnx_model_raises_an_error_naming_what_is_wrong(case):
    change, message = _MALFORMED[case]
    with pytest.raises(forge.InvalidModelError, match=message):
        forge.from_onnx(_edit(change))


def test_a_corrupt_text_field_is_named(tmp_path):
    data = bytearray(_convnet().SerializeToString())
    at = data.index(b"relu1")
    data[at + 1] = 0xFF
    (tmp_path / "m.onnx").write_bytes(bytes(data))
    with pytest.raises(forge.InvalidModelError, match=r"its text field graph.node\[1\].name is not UTF-8"):
        forge.from_onnx(tmp_path / "m.onnx")


def test_nodes_out_of_order_are_sorted_and_compute_what_onnxruntime_does():
    model = _convnet()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(forge.from_onnx(model).get_inference_function()(x), expected[0], rtol=1e-5, atol=1e-6)


def _with_quirks(model: onnx.ModelProto, names: bool = True) -> onnx.ModelProto:
    """Exporters' deviations that onnx.checker accepts: Paddle2ONNX's -1 for a dynamic dim in value types (the
    input, the output and an intermediate value) and an unnamed node, which onnxruntime accepts too, and with
    ``names`` spox's repeated node names (onnxruntime refuses those)."""
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = -1
    model.graph.value_info.append(helper.make_tensor_value_info("r1", TensorProto.FLOAT, [-1, 4, 8, 8]))
    if names:
        for name in ("relu1", "pool1", "fc"):
            _node(model, name).name = "F0::anon"
    model.graph.node[0].name = ""
    return model


@pytest.mark.parametrize("compiled", [False, True], ids=["inference", "compiled"])
def test_exporter_quirks_that_onnxruntime_accepts_load_with_a_warning_naming_each(compiled, tmp_path):
    model = _with_quirks(_convnet())
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    reference = _with_quirks(_convnet(), names=False)  # node names change no number
    onnx.checker.check_model(reference, full_check=True)
    expected = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    with pytest.warns(forge.ModelQuirkWarning) as caught:
        ir = forge.from_onnx(model)
    message = str(caught[0].message)
    assert "graph output 'y': dims[0] = -1 read as a dynamic dim" in message, message
    assert "graph input 'x': dims[0] = -1" in message and "value 'r1': dims[0] = -1" in message, message
    assert message.count("a second node named 'F0::anon'") == 2, message
    assert "renamed 'F0::anon_1'" in message and "renamed 'F0::anon_2'" in message, message
    # the caller's model is not edited
    assert [n.name for n in model.graph.node].count("F0::anon") == 3
    assert ir.input_shapes == [(forge.DYNAMIC_DIM, 3, 8, 8)]
    if compiled:
        ir.set_batch_size(1)  # a fully static artifact (a dynamic one is the dynamic-shapes work's)
        ir.compile(output_path=str(tmp_path / "a"))
        got = forge.Runtime(str(tmp_path / "a")).infer(x)[0]
    else:
        got = ir.get_inference_function()(x)
    np.testing.assert_allclose(got, expected[0], rtol=1e-5, atol=1e-6)


def test_a_call_tvm_cannot_lower_is_traced_to_its_node():
    # PRelu-6 with a slope of one value per channel: valid ONNX, which TVM's converter gives an axis it cannot lower.
    model = onnx.load(str(fuzz_onnx.DATA / "pytorch-converted" / "test_PReLU_2d_multiparam" / "model.onnx"))
    with pytest.raises(forge.OperatorConversionError, match=r"node 'PRelu_0' \(op PRelu\).*relax.nn.prelu"):
        forge.from_onnx(model)


def test_sequence_insert_at_a_negative_position_counts_from_the_back():
    # Found by the corpus on this valid model: erase at -3, insert at -1 (before the last tensor), read at -1.
    path = fuzz_onnx.DATA / "simple" / "test_sequence_model3" / "model.onnx"
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal((2, 3, 4)).astype(np.float32) for name in ("X", "Y", "Z")}
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(expected, feeds["Z"])
    ir = forge.from_onnx(path)
    np.testing.assert_array_equal(ir.get_inference_function()(*[feeds[s.name] for s in ir.input_specs]), expected)
