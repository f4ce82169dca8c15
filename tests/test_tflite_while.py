"""Keras recurrent layers converted to TFLite: a ``WHILE`` loop whose body reads the step's input by the loop
index (GATHER) and writes the step's output into the TensorList as ``concat(list[:t], item, list[t + 1:])``
(SLICE with a begin and a size computed at run time), against the TFLite interpreter and Keras.

``forge_tf.tflite_import``: ``convert_while`` builds the loop on :func:`forge_core.ir.loops.build_loop` (chunked:
TVM's converter nested one call per iteration, and TVM's VM recurses on the C++ stack), ``convert_slice`` slices
at run-time offsets with the extents known at import kept static, and a result whose dims Relax cannot infer
takes the dims the flatbuffer declares, checked when the model runs. The TFLite converter needs a static batch
and sequence for these layers (a dynamic one stops it: ``TensorListReserve`` requires a static element shape).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="the tf extra is installed by ./scripts/setup")
keras = pytest.importorskip("keras")

from tf_models import Interpreter  # noqa: E402

import forge  # noqa: E402
from forge_core.compiler.compile import compile_to_function  # noqa: E402

LAYERS = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU, "simple_rnn": keras.layers.SimpleRNN}


def _converted(kind: str, steps: int, batch: int, bidirectional: bool = False) -> tuple[bytes, keras.Model]:
    """Two stacked layers (the first returns its sequence, the second runs backwards) and a dense head."""
    keras.utils.set_random_seed(11)
    inputs = keras.Input((steps, 5), batch_size=batch)
    first = LAYERS[kind](16, return_sequences=True)
    hidden = keras.layers.Bidirectional(first)(inputs) if bidirectional else first(inputs)
    hidden = LAYERS[kind](8, go_backwards=True)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    return tf.lite.TFLiteConverter.from_keras_model(model).convert(), model


def _operators(data: bytes) -> set[str]:
    interpreter = tf.lite.Interpreter(model_content=data)
    return {op["op_name"] for op in interpreter._get_ops_details()}  # noqa: SLF001 - the test's own check


@pytest.mark.parametrize("kind, steps, batch, bidirectional", [
    ("lstm", 12, 1, False), ("gru", 9, 3, True), ("simple_rnn", 7, 2, False),
])
def test_keras_recurrent_layers_through_tflite_against_the_interpreter(kind, steps, batch, bidirectional):
    data, model = _converted(kind, steps, batch, bidirectional)
    assert "WHILE" in _operators(data)
    x = np.random.default_rng(steps).standard_normal((batch, steps, 5)).astype(np.float32)
    (want,) = Interpreter(data)(x)
    np.testing.assert_allclose(model(x).numpy(), want, rtol=1e-5, atol=1e-6)  # the interpreter is Keras
    ir = forge.from_tflite(data)
    scale = float(np.abs(want).max())
    for label, run in [("inference function", ir.get_inference_function()),
                       ("opt_level 0", compile_to_function(ir, opt_level=0)),
                       ("opt_level 3", compile_to_function(ir, opt_level=3))]:
        np.testing.assert_allclose(np.asarray(run(x)), want, rtol=1e-5, atol=1e-5 * scale, err_msg=label)


def test_a_loop_of_thousands_of_steps_runs():
    """3000 steps: one nested call per iteration crashed TVM's VM (its stack) between 2000 and 5000."""
    data, _ = _converted("gru", 3000, 1)
    x = np.random.default_rng(5).standard_normal((1, 3000, 5)).astype(np.float32)
    (want,) = Interpreter(data)(x)
    got = forge.from_tflite(data).get_inference_function()(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
