"""fingerprint (structure + weights), hash (structure only), ==, and deep copies."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from model_factory import conv_bn_net
from onnx import numpy_helper

import forge


def _with_one_weight_changed(model: onnx.ModelProto) -> onnx.ModelProto:
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    init = changed.graph.initializer[0]
    array = numpy_helper.to_array(init).copy()
    array.flat[7] = np.nextafter(array.flat[7], np.float32(np.inf))
    init.CopyFrom(numpy_helper.from_array(array, init.name))
    return changed


def test_fingerprint_is_hex_and_stable_within_a_process():
    model = conv_bn_net(seed=1)
    a, b = forge.from_onnx(model), forge.from_onnx(model)
    assert len(a.fingerprint) == 64 and int(a.fingerprint, 16) >= 0
    assert a.fingerprint == b.fingerprint


def test_fingerprint_is_equal_across_processes(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_net(seed=1), str(path))
    code = f"import forge; ir = forge.from_onnx({str(path)!r}); print(ir.fingerprint); print(hash(ir))"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    here = forge.from_onnx(path)
    assert runs[0] == [here.fingerprint, str(hash(here))]


def test_fingerprint_changes_with_a_single_weight():
    model = conv_bn_net(seed=1)
    assert forge.from_onnx(model).fingerprint != forge.from_onnx(_with_one_weight_changed(model)).fingerprint


def test_fingerprint_covers_params_too():
    model = conv_bn_net(seed=1)
    a = forge.from_onnx(model, freeze_params=False)
    b = forge.from_onnx(_with_one_weight_changed(model), freeze_params=False)
    assert a.fingerprint != b.fingerprint
    assert hash(a) == hash(b)


def test_hash_is_structural_equal_for_other_weights_and_eq_follows_it():
    a = forge.from_onnx(conv_bn_net(seed=1))
    b = forge.from_onnx(conv_bn_net(seed=2))
    assert a.fingerprint != b.fingerprint
    assert hash(a) == hash(b)
    assert a == b
    other = forge.from_onnx(conv_bn_net(seed=1, channels=4))
    assert hash(other) != hash(a)
    assert other != a


def test_copy_is_deep_for_params():
    ir = forge.from_onnx(conv_bn_net(seed=1), freeze_params=False)
    before = ir.fingerprint
    copy = ir.copy()
    assert copy.fingerprint == before and copy is not ir
    name = sorted(copy.params)[0]
    copy.params[name].copyfrom(np.zeros(copy.params[name].shape, dtype="float32"))
    with pytest.raises(TypeError):
        copy.params["param_0"] = copy.params["param_0"]  # read-only: edits go through the graph API
    assert ir.fingerprint == before
    assert copy.fingerprint != before


def test_copy_is_deep_for_constants_frozen_in_the_graph():
    from forge_core.ir.weights import iter_constants

    ir = forge.from_onnx(conv_bn_net(seed=1))
    before = ir.fingerprint
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    expected = ir.get_inference_function()(x)
    copy = ir.copy()
    biggest = max(iter_constants(copy.mod), key=lambda c: c.value.numpy().size)
    biggest.value.copyfrom(np.zeros(biggest.value.shape, dtype=biggest.value.dtype))
    assert copy.fingerprint != before
    assert ir.fingerprint == before
    np.testing.assert_array_equal(ir.get_inference_function()(x), expected)
