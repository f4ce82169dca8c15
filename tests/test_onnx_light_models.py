"""The 9 model-zoo "light" graphs that the onnx wheel ships load and match their stored references.

Tolerance: rtol=1e-3, atol=1e-5, as onnx's backend test runner uses for model
tests. These graphs build every weight with ConstantOfShape, so their outputs
are nearly uniform; test_onnx_numerics.py checks random-weight models.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from model_factory import LIGHT_MODELS, light_input, light_model_path, light_reference

import forge


def test_all_nine_light_models_are_found():
    assert len(LIGHT_MODELS) == 9, LIGHT_MODELS


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_reference(name):
    path = light_model_path(name)
    model = onnx.load(str(path))
    ir = forge.from_onnx(path)
    x = light_input(model)
    out = ir.get_inference_function()(x)
    ref = light_reference(name)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-5)
    # The folds removed every batch norm the graph had.
    assert "nn.batch_norm" not in ir.operators
