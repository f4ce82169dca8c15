"""Streaming TFLite models: resource variables as explicit state, against the TFLite interpreter, call after call.

A model converted with resource variables (``VAR_HANDLE``, ``READ_VARIABLE``,
``ASSIGN_VARIABLE``, a ``CALL_ONCE`` init subgraph) keeps state between
invocations; Forge makes each variable an input and ``<variable>_next`` an output
(:mod:`forge_tf.resource_variables`). Each test feeds the ``_next`` outputs back
and compares every call's outputs, and the state itself, with the interpreter's
(``experimental_preserve_all_tensors`` shows the tensors it assigned).

The real models are the four microWakeWord detectors that ``pymicro-wakeword``
ships (full int8, six state variables each, STRIDED_SLICE and SPLIT_V on int8
tensors): all four were refused before ("cannot convert 4 operator types").
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="the tf extra is installed by ./scripts/setup")

import forge  # noqa: E402
from forge_tf.tflite_model import read_tflite, tensor_name  # noqa: E402


def _wake_word_models() -> list[Path]:
    spec = importlib.util.find_spec("pymicro_wakeword")  # its files only: its native feature extractor is not needed
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted((Path(next(iter(spec.submodule_search_locations))) / "models").glob("*.tflite"))


WAKE_WORD_MODELS = _wake_word_models()


class Streaming(tf.Module):
    """A float stream: a window of past frames (read, assigned, read again), a running sum (read, assigned, read
    again) and a variable assigned before any read (not state: the value it carries is never read)."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.history = tf.Variable(rng.standard_normal((1, 4, 6)).astype("float32"), name="history")
        self.total = tf.Variable(np.zeros((1, 6), "float32"), name="total")
        self.scratch = tf.Variable(np.zeros((1, 6), "float32"), name="scratch")
        self.bias = tf.constant(rng.standard_normal((1, 6)).astype("float32"))
        self.weight = tf.constant(rng.standard_normal((6, 6)).astype("float32") * 0.5)

    @tf.function(input_signature=[tf.TensorSpec((1, 6), tf.float32, name="frame")])
    def __call__(self, frame: tf.Tensor) -> dict[str, tf.Tensor]:
        self.history.assign(tf.concat([self.history[:, 1:], frame[:, None]], axis=1))
        self.total.assign(self.total + frame * 0.5)
        self.scratch.assign(frame)
        mixed = tf.tanh(tf.matmul(tf.reduce_mean(self.history, axis=1), self.weight)) + self.bias + self.scratch
        return {"score": mixed * self.total}


class QuantizedStream(tf.Module):
    """A microWakeWord-like stream, converted to full int8: a ring of past frames in a variable and, on the
    window, the ops that only move int8 values (SPLIT_V, SPLIT, STRIDED_SLICE, TRANSPOSE, SLICE)."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.ring = tf.Variable(np.zeros((1, 5, 1, 8), "float32"), name="ring")
        self.kernel = tf.constant(rng.standard_normal((3, 1, 8, 12)).astype("float32") * 0.4)
        self.dense = tf.constant(rng.standard_normal((48, 4)).astype("float32") * 0.3)

    @tf.function(input_signature=[tf.TensorSpec((1, 2, 1, 8), tf.float32, name="frames")])
    def __call__(self, frames: tf.Tensor) -> dict[str, tf.Tensor]:
        window = tf.concat([self.ring, frames], axis=1)  # (1, 7, 1, 8)
        self.ring.assign(window[:, -5:])
        older, recent = tf.split(window, [4, 3], axis=1)  # SPLIT_V
        convolved = tf.nn.relu(tf.nn.conv2d(recent, self.kernel, 1, "VALID"))  # (1, 1, 1, 12)
        halves = tf.split(older, 2, axis=3)  # SPLIT
        rows = tf.squeeze(tf.transpose(halves[0], [0, 2, 1, 3]), axis=1)[:, 1:4, :]  # STRIDED_SLICE (1, 3, 4)
        moved = tf.squeeze(tf.slice(tf.transpose(window, [0, 3, 2, 1]), [0, 1, 0, 2], [1, 4, 1, 3]), axis=2)
        features = tf.concat([tf.reshape(t, (1, 12)) for t in (convolved, rows, halves[1][:, :3], moved)], axis=1)
        return {"logits": tf.matmul(features, self.dense)}


def _convert(module: tf.Module, quantize: bool = False) -> bytes:
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.__call__.get_concrete_function()], module)
    if quantize:
        shape = module.__call__.input_signature[0].shape

        def representative():
            rng = np.random.default_rng(1)
            for _ in range(32):
                yield [rng.uniform(-1, 1, shape).astype("float32")]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return converter.convert()


def _interpreter(model: bytes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice (LiteRT)
        interpreter = tf.lite.Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    interpreter.allocate_tensors()
    return interpreter


def _input(detail: dict, rng: np.random.Generator) -> np.ndarray:
    if detail["dtype"] == np.float32:
        return rng.uniform(-1, 1, detail["shape"]).astype(np.float32)
    info = np.iinfo(detail["dtype"])
    return rng.integers(info.min, int(info.max) + 1, detail["shape"]).astype(detail["dtype"])


def stream_like_the_interpreter(model: bytes, start: dict[str, np.ndarray], run, calls: int, seed: int = 0,
                                atol: float = 0.0) -> float:
    """Feed ``calls`` random inputs through ``run(x, *state) -> [output, *state_next]``, from the state ``start``
    (``IRModule.initial_state``), and through the interpreter; every output and every state value must match
    (``atol``: 0 for int8). Returns the spread of the state."""
    interpreter = _interpreter(model)
    by_name = {detail["name"]: detail["index"] for detail in interpreter.get_tensor_details()}
    parsed = read_tflite(model)
    assigned = [tensor_name(parsed.subgraph, variable.output_tensor) for variable in parsed.state]
    state = [start[variable.name] for variable in parsed.state]
    detail = interpreter.get_input_details()[0]
    rng = np.random.default_rng(seed)
    spread = 0.0
    for call in range(calls):
        x = _input(detail, rng)
        interpreter.set_tensor(detail["index"], x)
        interpreter.invoke()
        want = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        got, *state = run(x, *state)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=0, atol=atol,
                                   err_msg=f"call {call}: the output")
        for name, value in zip(assigned, state):
            np.testing.assert_allclose(value.astype(np.float64), interpreter.get_tensor(by_name[name]).astype(np.float64),
                                       rtol=0, atol=atol, err_msg=f"call {call}: the state assigned from {name}")
            spread = max(spread, float(value.max()) - float(value.min()))
    return spread


def test_float_state_becomes_inputs_and_outputs_and_streams_like_the_interpreter(tmp_path):
    model = _convert(Streaming(np.random.default_rng(3)))
    ir = forge.from_tflite(model)
    # total is read first (by its own update), history next; scratch is assigned before any read: not state.
    assert [s.name for s in ir.input_specs] == ["serving_default_frame:0", "total", "history"]
    assert [s.name for s in ir.output_specs] == ["StatefulPartitionedCall:0", "total_next", "history_next"]
    assert [(s.shape, s.dtype) for s in ir.input_specs[1:]] == [((1, 6), "float32"), ((1, 4, 6), "float32")]
    start = ir.initial_state
    assert set(start) == {"total", "history"} and not start["total"].any() and start["history"].std() > 0.5
    assert "State: 2 input(s) fed back" in ir.summary() and "total, history" in ir.summary()

    function = ir.get_inference_function()
    assert stream_like_the_interpreter(model, start, function, calls=5, atol=1e-5) > 1.0
    ir.compile(output_path=tmp_path / "artifact", export_metadata=True)
    runtime = forge.Runtime(tmp_path / "artifact")  # the artifact carries the starting values
    assert set(runtime.initial_state) == set(start)
    assert all(np.array_equal(runtime.initial_state[name], start[name]) for name in start)
    stream_like_the_interpreter(model, runtime.initial_state, runtime.infer, calls=5, atol=1e-5)
    jsonschema = pytest.importorskip("jsonschema", reason="installed by ./scripts/setup")
    from forge_core.runtime.metadata import JSON_SCHEMA

    jsonschema.validate(json.loads((tmp_path / "artifact" / "model_metadata.json").read_text()), JSON_SCHEMA)
    # Encrypted, the starting values are the model's own: in the encrypted library only, not its readable header.
    ir.compile(output_path=tmp_path / "sealed", encrypt_password="streaming state", export_metadata=True)
    assert "initial_state" not in json.loads((tmp_path / "sealed" / "model_metadata.json").read_text())
    sealed = forge.Runtime(tmp_path / "sealed", tmp_path / "sealed" / "modelKey.bin", "streaming state")
    assert all(np.array_equal(sealed.initial_state[name], start[name]) for name in start)
    stream_like_the_interpreter(model, sealed.initial_state, sealed.infer, calls=2, atol=1e-5)


def test_int8_stream_and_the_ops_that_move_int8_values_are_exact():
    """STRIDED_SLICE, SPLIT_V, SPLIT, TRANSPOSE and SLICE on int8 tensors were refused ("quantized"): they move
    the integers, their outputs have their input's scale and zero point, and TVM's converters move them exactly."""
    model = _convert(QuantizedStream(np.random.default_rng(5)), quantize=True)
    interpreter = _interpreter(model)
    codes = {op["op_name"] for op in interpreter._get_ops_details()}
    assert {"SPLIT_V", "SPLIT", "STRIDED_SLICE", "TRANSPOSE", "SLICE", "ASSIGN_VARIABLE"} <= codes
    ir = forge.from_tflite(model)
    assert ir.is_quantized and [s.name for s in ir.output_specs][1:] == ["ring_next"]
    stream_like_the_interpreter(model, ir.initial_state, ir.get_inference_function(), calls=5)


@pytest.mark.skipif(not WAKE_WORD_MODELS, reason="pymicro-wakeword (its models) is installed by ./scripts/setup")
@pytest.mark.parametrize("path", WAKE_WORD_MODELS, ids=[p.stem for p in WAKE_WORD_MODELS])
def test_shipped_wake_word_models_stream_bit_for_bit(path, tmp_path):
    model = path.read_bytes()
    ir = forge.from_tflite(path)
    assert len(ir.initial_state) == 6 and all(value.dtype == np.int8 for value in ir.initial_state.values())
    assert [s.name for s in ir.output_specs][1:] == [name + "_next" for name in ir.initial_state]
    spread = stream_like_the_interpreter(model, ir.initial_state, ir.get_inference_function(), calls=8)
    assert spread > 30, "the state should vary: the check is weak otherwise"
    if path.stem == "okay_nabu":  # one compiled artifact: the rest is the same converter
        ir.compile(output_path=tmp_path / "artifact")
        runtime = forge.Runtime(tmp_path / "artifact")
        stream_like_the_interpreter(model, runtime.initial_state, runtime.infer, calls=8)
