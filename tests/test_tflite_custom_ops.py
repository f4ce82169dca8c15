"""A custom TFLite operator supplied by a third-party plugin: examples/forge_mediapipe.

The model is what MediaPipe's segmentation models hold: a Keras model whose
Conv2DTranspose layers are rewritten, in the flatbuffer, into MediaPipe's
custom ``Convolution2DTransposeBias`` (same weights and bias; the padding and
strides as its C struct in ``custom_options``). The TFLite interpreter cannot
run that operator without MediaPipe's resolver, so the reference is the
interpreter on the model before the rewrite: the same function.

The plugin is installed as pip installs one: its package directory on the
path and a dist-info whose entry point (group ``forge``) names its module.
"""

from __future__ import annotations

import importlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="the tf extra is installed by ./scripts/setup")
keras = pytest.importorskip("keras")

from tf_models import Interpreter  # noqa: E402

import forge  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "forge_mediapipe"
CUSTOM = "Convolution2DTransposeBias"


def as_custom_op(data: bytes) -> bytes:
    """``data`` with every TRANSPOSE_CONV (bias, no fused activation) rewritten as MediaPipe's custom op."""
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(data, 0))
    custom = schema.OperatorCodeT()
    custom.builtinCode = custom.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    custom.customCode = CUSTOM
    custom.version = 1
    model.operatorCodes.append(custom)
    custom_index = len(model.operatorCodes) - 1
    rewritten = 0
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) != schema.BuiltinOperator.TRANSPOSE_CONV:
                continue
            options = op.builtinOptions
            assert options.fusedActivationFunction == schema.ActivationFunctionType.NONE
            _, weights, source, bias = (int(i) for i in op.inputs)
            padding = 1 if options.padding == schema.Padding.SAME else 2  # TfLitePadding: 1 SAME, 2 VALID
            op.opcodeIndex = custom_index
            op.inputs = np.array([source, weights, bias], dtype=np.int32)
            op.builtinOptionsType, op.builtinOptions = 0, None
            op.customOptions = np.frombuffer(struct.pack("<iii", padding, options.strideW, options.strideH),
                                             dtype=np.uint8)
            rewritten += 1
    assert rewritten, "no TRANSPOSE_CONV to rewrite"
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def segmentation_head(seed: int):
    """An encoder-decoder with two upsamplings: SAME padding at stride 2 and VALID padding with a 3x3 kernel."""
    rng = np.random.default_rng(seed)
    image = keras.Input((12, 10, 3), batch_size=1, name="image")
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(image)
    x = keras.layers.Conv2DTranspose(6, 4, strides=2, padding="same")(x)
    x = keras.layers.LeakyReLU(negative_slope=0.1)(x)  # not fused into the TRANSPOSE_CONV, as a ReLU would be
    x = keras.layers.Conv2DTranspose(2, 3, strides=2, padding="valid")(x)
    model = keras.Model(image, keras.layers.Activation("sigmoid")(x))
    for weight in model.weights:
        weight.assign(rng.standard_normal(weight.shape).astype(np.float32) * 0.4)
    return model


@pytest.fixture(scope="module")
def models():
    builtin = tf.lite.TFLiteConverter.from_keras_model(segmentation_head(3)).convert()
    return builtin, as_custom_op(builtin)


@pytest.fixture
def installed(tmp_path, monkeypatch, fresh_plugins):
    """forge-mediapipe installed for this test (and gone after it)."""
    site = tmp_path / "site"
    info = site / "forge_mediapipe-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: forge-mediapipe\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[forge]\nmediapipe = forge_mediapipe.plugin\n")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site


def test_without_the_plugin_the_custom_op_is_refused_naming_it_and_the_fix(models, fresh_plugins):
    _, custom = models
    with pytest.raises(forge.UnsupportedOperatorError) as caught:
        forge.from_tflite(custom)
    message = str(caught.value)
    assert f"{CUSTOM}: 2 nodes" in message
    assert 'register("tflite", custom_code, converter)' in message and "examples/forge_mediapipe" in message


@pytest.fixture(scope="module")
def float16_models():
    """The same with float16 weights behind DEQUANTIZE, as MediaPipe's selfie segmentation ships: the custom
    op's weights are then computed from a constant (the converter had refused them as run-time values)."""
    converter = tf.lite.TFLiteConverter.from_keras_model(segmentation_head(3))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    builtin = converter.convert()
    return builtin, as_custom_op(builtin)


@pytest.mark.parametrize("weights", ["float32", "float16"])
def test_with_the_plugin_installed_the_custom_op_gives_the_builtin_models_numbers(models, float16_models, weights,
                                                                                  installed, tmp_path):
    builtin, custom = models if weights == "float32" else float16_models
    if weights == "float16":
        operators = tf.lite.Interpreter(model_content=builtin)._get_ops_details()  # noqa: SLF001 - TF's only listing
        assert "DEQUANTIZE" in {op["op_name"] for op in operators}
    assert "mediapipe" in {p.name for p in forge.list_plugins()}
    x = np.random.default_rng(4).uniform(0, 1, (1, 12, 10, 3)).astype(np.float32)
    (want,) = Interpreter(builtin)(x)
    ir = forge.from_tflite(custom)
    np.testing.assert_allclose(ir.get_inference_function()(x), want, rtol=1e-5, atol=1e-5)
    ir.compile(output_path=tmp_path / "artifact")
    np.testing.assert_allclose(forge.Runtime(tmp_path / "artifact").infer(x)[0], want, rtol=1e-5, atol=1e-5)


def test_a_plugin_converter_that_fails_is_named_with_the_op_the_tensor_and_the_plugin(models, installed):
    _, custom = models
    data = bytearray(custom)
    # The first custom op's options, padding 1 or 2, become 7: the plugin refuses them.
    for padding in (1, 2):
        options = struct.pack("<i", padding) + struct.pack("<ii", 2, 2)
        at = data.find(options)
        if at >= 0:
            data[at:at + 4] = struct.pack("<i", 7)
            break
    else:
        pytest.fail("the custom options were not found in the flatbuffer")
    with pytest.raises(forge.ModelImportError) as caught:
        forge.from_tflite(bytes(data))
    message = str(caught.value)
    assert CUSTOM in message and "'mediapipe'" in message and "padding 7" in message


def test_forge_plugins_lists_the_installed_example(installed):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(EXAMPLE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "forge_core.cli", "plugins"], capture_output=True, text=True,
                          env={**env, "COLUMNS": "200"}, timeout=300)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "mediapipe" in line)
    assert "forge-mediapipe" in row and "1 converter" in row, done.stdout
