"""The TFLite, PyTorch and Keras families of the malformed-model fuzz corpus (issue 17), at CI size.

Each case runs in a worker subprocess of tests/model_fuzz.py (a crash or a hang
is seen as one) and must end in a ``forge.ForgeError`` whose message names what
is wrong, or load and compute what TFLite's interpreter, eager PyTorch or Keras
computes. The families' cases are in tests/fuzz_frameworks.py; a larger run::

    .venv/bin/python tests/model_fuzz.py --family tflite --cases 2000 --jobs 2
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("tensorflow", reason="the tf extra is installed by ./scripts/setup")
pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")

from model_fuzz import is_defect, run_corpus, summarize  # noqa: E402

SEED = 17
# Cases per family: every torch and keras construction once, and TFLite mutations, which are cheap.
COUNTS = {"tflite": 160, "torch": 36, "keras": 24}


def test_framework_corpus(tmp_path):
    """Two workers: one runs the TFLite mutations, the other the torch then the keras constructions."""
    with ThreadPoolExecutor(2) as pool:
        tflite = pool.submit(run_corpus, ["tflite"], COUNTS["tflite"], SEED, jobs=1, workdir=tmp_path / "tflite")

        def frameworks() -> list[dict]:
            return [result for family in ("torch", "keras")
                    for result in run_corpus([family], COUNTS[family], SEED, jobs=1, workdir=tmp_path / family)]

        others = pool.submit(frameworks)
        results = tflite.result() + others.result()
    print(summarize(results))
    assert {family: sum(r["family"] == family for r in results) for family in COUNTS} == COUNTS
    defects = [r for r in results if is_defect(r)]
    assert not defects, summarize(defects)


# -- regressions the corpus found, each on its own ---------------------------------------------------


def _flatten_cnn_tflite() -> bytes:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    image = keras.Input((6, 6, 2), name="image")
    x = keras.layers.Flatten()(keras.layers.MaxPooling2D()(keras.layers.Conv2D(3, 3, padding="same")(image)))
    return tf.lite.TFLiteConverter.from_keras_model(keras.Model(image, keras.layers.Dense(4)(x))).convert()


def test_tflite_flatten_of_a_batch_the_converter_left_dynamic():
    """Keras's Flatten converted with a batch of None reshapes through SHAPE, STRIDED_SLICE and PACK; TVM's
    RESHAPE failed on the computed shape even with the stored batch of 1. rtol/atol 1e-5."""
    import numpy as np
    from fuzz_frameworks import _interpreter

    import forge

    data = _flatten_cnn_tflite()
    x = np.random.default_rng(0).standard_normal((1, 6, 6, 2)).astype("float32")
    interpreter = _interpreter(data)
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    want = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(forge.from_tflite(data).get_inference_function()(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("field, value, message", [
    ("buffer", 99, r"tensor \d+ \('[^']+'\): its buffer index 99 is out of range: the model has \d+ buffers"),
    ("opcode_index", 40, r"operator \d+: its opcode_index 40 is out of range: the model has \d+ operator codes"),
    ("type", 23, r"tensor \d+ \('[^']+'\): its type 23 is no TFLite TensorType"),
    ("shape", 5, r"tensor \d+ \('[^']+'\): its shape \[5.*\] and type \w+ need \d+ bytes of data; its buffer "
                 r"\d+ holds \d+"),
])
def test_corrupt_tflite_fields_are_named(field, value, message):
    """An index, type or shape a corrupt file gets wrong: an InvalidModelError naming the tensor or operator and
    the field, where the tflite package and TVM raised IndexError, struct.error or TypeError."""
    import struct

    import tflite

    import forge

    data = bytearray(_flatten_cnn_tflite())
    model = tflite.Model.GetRootAsModel(data, 0)
    subgraph = model.Subgraphs(0)
    slot = {"buffer": 2, "opcode_index": 0, "type": 1, "shape": 0}[field]
    tables = [subgraph.Operators(i) for i in range(subgraph.OperatorsLength())] if field == "opcode_index" else [
        t for t in map(subgraph.Tensors, range(subgraph.TensorsLength()))
        if field != "shape" or (t.ShapeLength() and model.Buffers(t.Buffer()).DataLength())]  # a constant's
    # The first table that stores the field (a default value is not stored).
    table = next(t for t in tables if t._tab.Offset(4 + 2 * slot))
    offset = table._tab.Offset(4 + 2 * slot)
    position = table._tab.Vector(offset) if field == "shape" else table._tab.Pos + offset
    struct.pack_into("<b" if field == "type" else "<i", data, position, value)
    with pytest.raises(forge.InvalidModelError, match="the given bytes is not a valid TFLite flatbuffer: .*" + message):
        forge.from_tflite(bytes(data))


def test_torch_control_flow_on_input_values_is_refused_naming_the_line():
    """torch.export refuses a branch on x.sum(); the ONNX route used to trace the example's branch and compute
    it for every input."""
    import torch

    import forge

    class Branch(torch.nn.Module):
        def forward(self, x):  # noqa: ANN001, ANN202
            if x.sum() > 0:
                return x * 2
            return x - 1

    with pytest.raises(forge.ModelImportError, match=r"control flow depends on the values of its inputs, at "
                                                     r".*test_malformed_framework_models.py:\d+ in forward: "
                                                     r"if x.sum\(\) > 0:"):
        forge.from_torch(Branch(), example_inputs=(torch.ones(2, 3),))


def test_torch_forward_that_updates_a_buffer_converts_the_first_call():
    """Forge runs the model once to count its outputs: that run must not advance the module's buffers (the
    converted model computed the second call; the user's module was changed)."""
    import numpy as np
    import torch

    import forge

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("steps", torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.steps.add_(1)
            return x * self.steps

    model, x = Counter(), torch.randn(2, 3)
    run = forge.from_torch(model, example_inputs=(x,)).get_inference_function()
    assert model.steps.item() == 1.0
    np.testing.assert_allclose(run(x.numpy()), (x * 2).numpy(), rtol=1e-6)
