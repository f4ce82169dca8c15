"""Every ``keras.applications`` family through ``forge.from_keras``, against Keras.

The smallest member of each family, built with ``weights=None`` (random
weights, no download) at a small input size, batch-norm statistics randomized,
and compared with Keras's ``model(x)`` on uniform random images (rtol 1e-4,
atol 1e-4 of the output's largest magnitude) through the inference function
and, for the cases marked ``compile``, through the compiled artifact run by
``forge.Runtime``. The default layout (NCHW) is used, as users get it.
MobileNetV2 is tested at 96x96 in ``test_tf_plugin.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytest.importorskip("tensorflow", reason="the tf extra is installed by ./scripts/setup")
keras = pytest.importorskip("keras")

from model_factory import assert_matches_framework  # noqa: E402
from tf_models import randomize_batch_norms  # noqa: E402

import forge  # noqa: E402

pytestmark = pytest.mark.corpus



@dataclass(frozen=True)
class Family:
    constructor: str
    """The smallest member of the family, a ``keras.applications`` function."""
    size: int
    """The input's height and width: the smallest each family accepts, or 32."""
    compile: bool = False

    @property
    def id(self) -> str:
        return self.constructor + ("-compile" if self.compile else "")


FAMILIES = [
    Family("ConvNeXtTiny", 32),
    Family("DenseNet121", 32),
    Family("EfficientNetB0", 32),
    Family("EfficientNetV2B0", 32),
    Family("InceptionResNetV2", 75),
    Family("InceptionV3", 75),
    Family("MobileNet", 32, compile=True),
    Family("MobileNetV3Small", 32),
    Family("NASNetMobile", 32),
    Family("ResNet50", 32),
    Family("ResNet50V2", 32),
    Family("VGG16", 32),
    Family("Xception", 71),
]


def he_normal_kernels(model: keras.Model, seed: int) -> keras.Model:
    """Convolution and dense kernels re-drawn as N(0, 2 / fan_in): without batch norms (VGG), Keras's
    Glorot initialization halves the signal at every ReLU and the logits come out near 1e-4."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
            kernel, *rest = layer.get_weights()
            fan_in = int(np.prod(kernel.shape[:-1]))
            layer.set_weights([rng.normal(0.0, np.sqrt(2.0 / fan_in), kernel.shape).astype("float32"),
                               *[rng.normal(0.0, 0.1, w.shape).astype("float32") for w in rest]])
    return model


def build(family: Family, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    constructor = getattr(keras.applications, family.constructor)
    model = constructor(input_shape=(family.size, family.size, 3), weights=None, classifier_activation=None)
    model = randomize_batch_norms(model, seed)
    if not any(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers):
        model = he_normal_kernels(model, seed)
    return model


@pytest.mark.parametrize("family", [pytest.param(f, id=f.id) for f in FAMILIES])
def test_keras_application(family, tmp_path):
    model = build(family)
    image = np.random.default_rng(len(family.constructor)).uniform(-1, 1, (1, family.size, family.size, 3))
    image = image.astype("float32")
    want = model(image, training=False).numpy()
    assert want.std() > 1e-2, "the logits should vary: the check is weak otherwise"
    ir = forge.from_keras(model)
    assert ir.input_shapes == [(1, 3, family.size, family.size)] and ir.output_shapes == [want.shape]
    assert "nn.batch_norm" not in ir.operators
    nchw = np.ascontiguousarray(image.transpose(0, 3, 1, 2))
    assert_matches_framework(ir.get_inference_function()(nchw), want)
    if family.compile:
        ir.compile(output_path=tmp_path / "artifact")
        assert_matches_framework(forge.Runtime(tmp_path / "artifact").infer(nchw), want)


def test_every_family_is_covered():
    """One member of every family keras.applications has (MobileNetV2's test is in test_tf_plugin.py)."""
    families = {name for name in dir(keras.applications) if not name.startswith("_") and name.islower()}
    families -= {"imagenet_utils", "resnet50", "vgg19", "mobilenet_v2"}  # aliases, VGG's bigger member, tested
    modules = {getattr(keras.applications, f.constructor).__module__.rsplit(".", 1)[-1] for f in FAMILIES}
    assert modules == families


def test_dense_on_a_flattened_one_by_one_map_gives_keras_rank():
    """VGG16's head at 32x32: Flatten of a 1x1 map, which TFLite folds into a FULLY_CONNECTED on the rank-4
    map; TVM kept that rank ((1, 1, 1, 10) instead of (1, 10))."""
    keras.utils.set_random_seed(5)
    image = keras.Input((2, 2, 3), name="image")
    features = keras.layers.MaxPooling2D()(keras.layers.Conv2D(6, 1)(image))
    logits = keras.layers.Dense(10)(keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(features)))
    model = keras.Model(image, logits)
    x = np.random.default_rng(5).standard_normal((1, 2, 2, 3)).astype("float32")
    want = model(x, training=False).numpy()
    ir = forge.from_keras(model, layout="NHWC")
    assert ir.output_shapes == [(1, 10)]
    assert_matches_framework(ir.get_inference_function()(x), want)
