"""TensorFlow, Keras and TFLite models with random weights for the TensorFlow plugin's tests.

Every builder seeds Keras's random generators, so a model is the same in
every run. Batch-norm statistics are randomized: with Keras's initial ones
(mean 0, variance 1, scale 1, shift 0) a batch norm is nearly the identity
and a wrong folding would go unnoticed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf


def randomize_batch_norms(model: keras.Model, seed: int = 0) -> keras.Model:
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            # Weights in Keras's order; gamma and beta only where the layer scales and centres.
            ranges = ([(0.5, 1.5)] if layer.scale else []) + ([(-0.2, 0.2)] if layer.center else []) \
                + [(-0.2, 0.2), (0.5, 1.5)]
            layer.set_weights([rng.uniform(low, high, weight.shape).astype("float32")
                               for (low, high), weight in zip(ranges, layer.get_weights(), strict=True)])
    return model


def residual_cnn(seed: int = 1, size: int = 16) -> keras.Model:
    """Conv, BatchNorm, ReLU, a depthwise convolution with BatchNorm, a residual add; two outputs:
    class logits (rank 2) and the feature map (rank 4, so that layouts show on an output too)."""
    keras.utils.set_random_seed(seed)
    image = keras.Input((size, size, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(image)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    y = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    y = keras.layers.BatchNormalization()(y)
    features = keras.layers.Add(name="features")([x, y])
    pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.MaxPooling2D()(features))
    logits = keras.layers.Dense(5, name="logits")(pooled)
    return randomize_batch_norms(keras.Model(image, [logits, features], name="residual_cnn"), seed)


def transformer_block(seed: int = 2, tokens: int | None = 8, hidden: int = 32) -> keras.Model:
    """Self-attention (MultiHeadAttention), LayerNormalization and a gelu feed-forward, as in BERT;
    ``tokens=None`` leaves the sequence length to the caller."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((tokens, hidden), name="tokens")
    attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=hidden // 4)(x, x)
    h = keras.layers.LayerNormalization()(keras.layers.Add()([x, attended]))
    ffn = keras.layers.Dense(4 * hidden, activation="gelu")(h)
    ffn = keras.layers.Dense(hidden)(ffn)
    out = keras.layers.LayerNormalization(name="encoded")(keras.layers.Add()([h, ffn]))
    return keras.Model(x, out, name="transformer_block")


def mobilenet_v2(seed: int = 3, size: int = 96) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(input_shape=(size, size, 3), weights=None, classifier_activation=None)
    return randomize_batch_norms(model, seed)


def two_inputs_two_outputs(seed: int = 4) -> keras.Model:
    """A float feature vector and int32 token ids in; a softmax and a regression out."""
    keras.utils.set_random_seed(seed)
    features = keras.Input((6,), name="features")
    ids = keras.Input((5,), dtype="int32", name="ids")
    embedded = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 8)(ids))
    hidden = keras.layers.Concatenate()([keras.layers.Dense(8, activation="relu")(features), embedded])
    probabilities = keras.layers.Dense(3, activation="softmax", name="probabilities")(hidden)
    value = keras.layers.Dense(1, name="value")(hidden)
    return keras.Model([features, ids], [probabilities, value], name="two_in_two_out")


def sequence_net(seed: int = 5) -> keras.Model:
    """Conv1D (EXPAND_DIMS), Dense on a sequence (a reshape through SHAPE, GATHER, REDUCE_PROD, PACK) and
    Flatten (SHAPE, STRIDED_SLICE, PACK): with a dynamic batch, shape arithmetic on the batch."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((16, 4), name="signal")
    y = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(x)
    y = keras.layers.Dense(6, activation="tanh")(y)
    return keras.Model(x, keras.layers.Dense(2)(keras.layers.Flatten()(y)), name="sequence_net")


def cropped_cnn(seed: int = 6) -> keras.Model:
    """Cropping2D: with a dynamic batch, TVM's STRIDED_SLICE converter needs the batch as an int; tf2onnx
    takes the model instead."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((10, 10, 3), name="image")
    y = keras.layers.Cropping2D(2)(keras.layers.Conv2D(4, 3, padding="same")(x))
    return keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(y)), name="cropped_cnn")


def static_flatten_net(seed: int = 7) -> keras.Model:
    """Built for a batch of exactly 1: its TFLite graph reshapes to the constant shape (1, 32)."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((4, 4, 2), batch_size=1, name="values")
    return keras.Model(x, keras.layers.Dense(2)(keras.layers.Flatten()(x)), name="static_flatten")


def unsupported_ops_net() -> keras.Model:
    """Two BesselI0e and one Erfinv: TensorFlow ops that neither TVM importer converts."""
    x = keras.Input((6,), name="x")
    a = keras.layers.Lambda(lambda t: tf.math.bessel_i0e(t) + tf.math.bessel_i0e(2.0 * t))(x)
    b = keras.layers.Lambda(lambda t: tf.math.erfinv(tf.tanh(t)))(x)
    return keras.Model(x, keras.layers.Add()([a, b]), name="unsupported_ops")


# -- TensorFlow graphs ------------------------------------------------------------


def frozen_graph(seed: int = 8) -> tuple[tf.compat.v1.GraphDef, Callable[[np.ndarray], np.ndarray]]:
    """A TF1-style frozen GraphDef (placeholder ``x``, NHWC, dynamic batch; last node ``out``) and a
    reference that runs it in a tf.compat.v1 Session."""
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 8, 8, 3), name="x")
        kernel = tf.constant(rng.standard_normal((3, 3, 3, 6)).astype("float32"))
        bias = tf.constant(rng.standard_normal(6).astype("float32"))
        y = tf.nn.relu6(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias), name="features")
        pooled = tf.nn.avg_pool2d(y, 2, 2, "VALID")
        weights = tf.constant(rng.standard_normal((6, 4)).astype("float32"))
        tf.matmul(tf.reduce_mean(pooled, axis=[1, 2]), weights, name="out")
    graph_def = graph.as_graph_def()

    def run(value: np.ndarray, fetch: str = "out:0") -> np.ndarray:
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(fetch, {"x:0": value})

    return graph_def, run


class Scorer(tf.Module):
    """A tf.Module with variables, saved as a SavedModel with a ``serving_default`` signature."""

    def __init__(self, seed: int = 9) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = tf.Variable(rng.standard_normal((10, 16)).astype("float32"))
        self.w2 = tf.Variable(rng.standard_normal((16, 3)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec((None, 10), tf.float32, name="features")])
    def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
        hidden = tf.nn.tanh(tf.matmul(features, self.w1))
        scores = tf.matmul(hidden, self.w2)
        return {"scores": scores, "best": tf.reduce_max(scores, axis=1)}


def saved_model(directory: Path) -> tuple[Path, Scorer]:
    module = Scorer()
    path = directory / "scorer"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path, module


# -- TFLite ------------------------------------------------------------------------


def tflite_bytes(model: keras.Model) -> bytes:
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def quantized_tflite(model: keras.Model, io_dtype: str, seed: int = 10) -> bytes:
    """Full-integer (int8) post-training quantization with a representative dataset; input and output of
    ``io_dtype``: "int8", "uint8", or "float32" (a QUANTIZE and a DEQUANTIZE at the ends)."""
    rng = np.random.default_rng(seed)
    shape = (1, *model.inputs[0].shape[1:])

    def representative() -> Iterator[list[np.ndarray]]:
        for _ in range(32):
            yield [rng.uniform(-1.0, 1.0, shape).astype("float32")]

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if io_dtype != "float32":
        converter.inference_input_type = tf.as_dtype(io_dtype)
        converter.inference_output_type = tf.as_dtype(io_dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Statistics for quantized inputs were expected")
        return converter.convert()


class Interpreter:
    """tf.lite.Interpreter run on one input; resizes it for other batch sizes. ``reference``: TFLite's reference
    kernels (``BUILTIN_REF``), not the XNNPACK kernels the interpreter runs by default."""

    def __init__(self, model: bytes, reference: bool = False) -> None:
        resolver = tf.lite.experimental.OpResolverType
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice (LiteRT)
            self._interpreter = tf.lite.Interpreter(
                model_content=model, experimental_op_resolver_type=resolver.BUILTIN_REF if reference else resolver.AUTO)
        self._interpreter.allocate_tensors()
        self.input = self._interpreter.get_input_details()[0]
        self.outputs = self._interpreter.get_output_details()

    def quantize(self, value: np.ndarray) -> np.ndarray:
        """A float array quantized as the model's input expects it (unchanged for a float input)."""
        if self.input["dtype"] == np.float32:
            return value.astype(np.float32)
        scale, zero_point = self.input["quantization"]
        info = np.iinfo(self.input["dtype"])
        return np.clip(np.round(value / scale + zero_point), info.min, info.max).astype(self.input["dtype"])

    def __call__(self, value: np.ndarray) -> list[np.ndarray]:
        if tuple(value.shape) != tuple(self.input["shape"]):
            self._interpreter.resize_tensor_input(self.input["index"], value.shape)
            self._interpreter.allocate_tensors()
            self.input = self._interpreter.get_input_details()[0]
            self.outputs = self._interpreter.get_output_details()
        self._interpreter.set_tensor(self.input["index"], value)
        self._interpreter.invoke()
        return [self._interpreter.get_tensor(detail["index"]) for detail in self.outputs]
