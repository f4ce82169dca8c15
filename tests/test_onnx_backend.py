"""forge_onnx.backend: the onnx.backend.base.Backend interface."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from model_factory import conv_bn_net, two_io_net
from onnx import TensorProto, helper

import forge_onnx.backend as backend


def test_prepare_and_run_matches_onnxruntime():
    model = conv_bn_net(seed=4)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    rep = backend.prepare(model, "CPU")
    (y,) = rep.run([x])
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(rep.run({"x": x})[0], y)
    np.testing.assert_array_equal(rep.run(x).y, y)  # outputs are a named tuple


def test_run_model_with_two_outputs():
    model = two_io_net(seed=1)
    a = np.ones((4, 16), np.float32)
    ids = np.array([1, 2, 3, 4], np.int64)
    outputs = backend.run_model(model, [a, ids])
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "ids": ids})
    assert len(outputs) == 2
    for got, want in zip(outputs, refs):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_run_node():
    node = helper.make_node("Celu", ["x"], ["y"], alpha=2.0)
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    (y,) = backend.run_node(node, [x], outputs_info=[(np.float32, (3, 4))])
    np.testing.assert_allclose(y, np.maximum(0, x) + np.minimum(0, 2.0 * (np.exp(x / 2.0) - 1)), rtol=1e-5, atol=1e-6)


def test_devices():
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    assert backend.is_compatible(conv_bn_net(), "CPU")


def test_compile_options_pass_through():
    model = conv_bn_net(seed=2)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    reference = backend.prepare(model).run([x])[0]
    for options in ({"opt_level": 0}, {"set_channel_layout": "last"}):
        np.testing.assert_allclose(backend.prepare(model, **options).run([x])[0], reference, rtol=1e-4, atol=1e-5)
