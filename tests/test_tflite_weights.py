"""TFLite models whose weights are stored compressed, and TRANSPOSE_CONV, against the TFLite interpreter.

What ``TFLiteConverter`` writes for a Keras model under its optimizations
(issue 34): float16 weights behind DEQUANTIZE (``supported_types=[tf.float16]``),
sparse weights behind DENSIFY (``EXPERIMENTAL_SPARSITY``), and dynamic-range
("hybrid") int8 weights under float activations (``Optimize.DEFAULT`` with no
representative dataset). Each model runs through the inference function and a
compiled artifact.

The hybrid model's weights are put on an int8 grid before conversion, so that
the converter's quantization keeps them exactly: the float model converted
without optimization is then the exact reference of the function Forge
computes (the float function on the int8 weights, :mod:`forge_tf.hybrid`).
TFLite's own hybrid kernels also quantize the activations, so against them the
bound is a few activation steps.
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

RTOL, ATOL = 1e-5, 1e-5
STEP = 0.004  # the int8 grid of the hybrid model's weights: |w| <= 127 * STEP


def on_int8_grid(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``values`` on the grid ``q * STEP`` (q in -127..127), with the extreme 127 * STEP in every slice along
    every axis: the converter's scale, per tensor or per channel along any axis, is then STEP exactly."""
    snapped = np.clip(np.round(values / STEP), -127, 127)
    if snapped.ndim >= 2:
        for i in range(max(snapped.shape)):
            snapped[tuple(i % n for n in snapped.shape)] = 127 * rng.choice([-1, 1])
    return (snapped * STEP).astype(np.float32)


def image_model(rng: np.random.Generator, snap: bool, transpose_bias: bool = True):
    """Conv2D, DepthwiseConv2D, two Conv2DTranspose (same and valid padding: odd sizes), Dense layers. Every
    weight but the depthwise one has 1024 elements or more, the converter's threshold for quantizing."""
    image = keras.Input((9, 9, 16), batch_size=1, name="image")
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(image)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.Conv2DTranspose(16, 3, strides=2, padding="same", use_bias=transpose_bias)(x)
    x = keras.layers.Conv2DTranspose(12, 3, strides=2, padding="valid", activation="relu")(x)
    pooled = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(10)(keras.layers.Dense(128, activation="tanh")(pooled))
    model = keras.Model(image, [logits, x])
    for weight in model.weights:
        value = rng.standard_normal(weight.shape).astype(np.float32) * 0.25
        weight.assign(on_int8_grid(value, rng) if snap else value)
    return model


def convert(model, optimizations=(), supported_types=()) -> bytes:
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = list(optimizations)
    converter.target_spec.supported_types = list(supported_types)
    return converter.convert()


def operators(data: bytes) -> set[str]:
    interpreter = tf.lite.Interpreter(model_content=data)
    return {op["op_name"] for op in interpreter._get_ops_details()}  # noqa: SLF001 - TF's only listing


def forge_outputs(data: bytes, x: np.ndarray, tmp_path, **options):
    """The inference function's outputs and the compiled artifact's, by the interpreter's output order."""
    ir = forge.from_tflite(data)
    run = ir.get_inference_function()(x)
    ir.compile(output_path=tmp_path / "artifact", **options)
    built = forge.Runtime(tmp_path / "artifact").infer(x)
    return as_arrays(run), as_arrays(built), ir


def as_arrays(outputs) -> list[np.ndarray]:
    return [np.asarray(a) for a in outputs] if isinstance(outputs, (list, tuple)) else [np.asarray(outputs)]


def assert_all_close(got, want, rtol=RTOL, atol=ATOL):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(7).standard_normal((1, 9, 9, 16)).astype(np.float32)


@pytest.mark.parametrize("transpose_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("opt_level", [0, 3])
def test_transpose_conv_in_tflites_layout_compiles_and_gives_the_interpreters_numbers(
        image, tmp_path, transpose_bias, opt_level):
    """TRANSPOSE_CONV imports as channels-last data and kernel, a layout TVM's legalization does not lower:
    every such model failed to build ("CodeGenVM cannot emit this Relax operator directly")."""
    data = convert(image_model(np.random.default_rng(1), snap=False, transpose_bias=transpose_bias))
    assert "TRANSPOSE_CONV" in operators(data)
    want = Interpreter(data)(image)
    run, built, _ = forge_outputs(data, image, tmp_path, opt_level=opt_level)
    assert_all_close(run, want)
    assert_all_close(built, want)


def test_float16_weights_behind_dequantize(image, tmp_path):
    data = convert(image_model(np.random.default_rng(2), snap=False),
                   optimizations=[tf.lite.Optimize.DEFAULT], supported_types=[tf.float16])
    assert "DEQUANTIZE" in operators(data)
    want = Interpreter(data)(image)
    run, built, ir = forge_outputs(data, image, tmp_path)
    assert_all_close(run, want)
    assert_all_close(built, want)
    assert not ir.is_quantized


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16"])
def test_sparse_weights_behind_densify(tmp_path, float16):
    """Pruned weights stored sparse: DENSIFY; in float16 too, DENSIFY then DEQUANTIZE (MediaPipe's sparse
    detectors, face_detection_full_range_sparse and pose_detection, failed to import: the DEQUANTIZE read the
    DENSIFY's output as a value the model computes at run time)."""
    rng = np.random.default_rng(3)
    features = keras.Input((64,), batch_size=1, name="features")
    model = keras.Model(features, keras.layers.Dense(16)(keras.layers.Dense(96, activation="relu")(features)))
    for weight in model.weights:
        value = rng.standard_normal(weight.shape).astype(np.float32) * 0.3
        if value.ndim == 2:
            value[rng.random(value.shape) < 0.85] = 0.0  # pruned: the converter stores it sparse
        weight.assign(value)
    if float16:
        data = convert(model, optimizations=[tf.lite.Optimize.EXPERIMENTAL_SPARSITY, tf.lite.Optimize.DEFAULT],
                       supported_types=[tf.float16])
        assert {"DENSIFY", "DEQUANTIZE"} <= operators(data)
    else:
        data = convert(model, optimizations=[tf.lite.Optimize.EXPERIMENTAL_SPARSITY])
        assert "DENSIFY" in operators(data)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    want = Interpreter(data)(x)
    run, built, _ = forge_outputs(data, x, tmp_path)
    assert_all_close(run, want)
    assert_all_close(built, want)


def test_dynamic_range_int8_weights_compute_the_float_function_of_the_int8_weights(image, tmp_path):
    model = image_model(np.random.default_rng(4), snap=True)
    hybrid = convert(model, optimizations=[tf.lite.Optimize.DEFAULT])
    plain = convert(model)
    hybrid_interpreter = Interpreter(hybrid)
    # The weights are int8 in the file, the activations float: a dynamic-range quantized model.
    details = hybrid_interpreter._interpreter.get_tensor_details()  # noqa: SLF001
    assert sum(1 for d in details if d["dtype"] == np.int8 and d["quantization_parameters"]["scales"].size) >= 4
    assert hybrid_interpreter.input["dtype"] == np.float32

    run, built, ir = forge_outputs(hybrid, image, tmp_path)
    exact = Interpreter(plain)(image)  # the float model on the same (int8-grid) weights
    assert_all_close(run, exact, rtol=1e-4, atol=1e-5)
    assert_all_close(built, exact, rtol=1e-4, atol=1e-5)
    assert not ir.is_quantized  # float activations: quantize() may still be applied

    # TFLite's hybrid kernels quantize each activation to int8 on the fly: within a few steps of its range.
    for got, theirs in zip(run, hybrid_interpreter(image)):
        assert np.abs(got - theirs).max() <= 0.03 * np.abs(theirs).max()


def test_a_dynamic_range_int8_embedding_table_is_read_as_floats(tmp_path):
    """The converter stores a large embedding table as int8 too, behind a GATHER with float outputs."""
    rng = np.random.default_rng(5)
    ids = keras.Input((6,), batch_size=1, dtype="int32", name="ids")
    embedded = keras.layers.Embedding(300, 16)(ids)
    model = keras.Model(ids, keras.layers.Dense(4)(keras.layers.Flatten()(embedded)))
    for weight in model.weights:
        weight.assign(on_int8_grid(rng.standard_normal(weight.shape).astype(np.float32) * 0.25, rng))
    hybrid = convert(model, optimizations=[tf.lite.Optimize.DEFAULT])
    assert np.int8 in {d["dtype"] for d in Interpreter(hybrid)._interpreter.get_tensor_details()}  # noqa: SLF001
    x = rng.integers(0, 300, (1, 6)).astype(np.int32)
    run, built, _ = forge_outputs(hybrid, x, tmp_path)
    exact = Interpreter(convert(model))(x)
    assert_all_close(run, exact, rtol=1e-4, atol=1e-5)
    assert_all_close(built, exact, rtol=1e-4, atol=1e-5)
    theirs = Interpreter(hybrid)(x)[0]
    assert np.abs(run[0] - theirs).max() <= 0.03 * np.abs(theirs).max()


def test_full_int8_transpose_conv_keeps_its_fused_relu_bit_for_bit(tmp_path):
    """The quantized TRANSPOSE_CONV's path, fused ReLU included. (Here the converter also gives the output
    the ReLU's range, zero point -128, so the requantization's clamp alone computes it.)"""
    from tf_models import quantized_tflite

    rng = np.random.default_rng(6)
    image = keras.Input((5, 5, 8), batch_size=1, name="image")
    y = keras.layers.Conv2DTranspose(6, 3, strides=2, padding="valid", activation="relu")(image)
    model = keras.Model(image, keras.layers.Conv2D(4, 1)(y))  # a consumer, so the ReLU is not at the end
    for weight in model.weights:
        weight.assign(rng.standard_normal(weight.shape).astype(np.float32) * 0.3)
    data = quantized_tflite(model, "int8")
    interpreter = Interpreter(data)
    x = interpreter.quantize(rng.uniform(-1, 1, (1, 5, 5, 8)))
    run, built, ir = forge_outputs(data, x, tmp_path)
    assert ir.is_quantized
    np.testing.assert_array_equal(run[0], interpreter(x)[0])
    np.testing.assert_array_equal(built[0], interpreter(x)[0])
