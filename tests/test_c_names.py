"""Names that every code generator accepts (``forge_core.compiler.c_names``).

A model whose node, input, output and weight names hold ``/``, ``.``, ``:``
and ``-`` (PyTorch's exporter names nodes ``/conv/Conv``; the onnx wheel's
ResNet-50 input is ``gpu_0/data_0``) compiled for CUDA into kernels whose
parameters were not C (``float* __restrict__ /relu/Relu_ptr``), which the GPU
then refused to load. Checked here with nvcc and without a GPU; the CPU
artifact of the same model against onnxruntime.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper

import forge
from forge_core.compiler.c_names import c_identifier, is_c_identifier

from cuda_checks import check_cuda_library, cuda_compiles

INPUT, OTHER = "gpu_0/data-0", "int"


def odd_names_model() -> bytes:
    """Conv, ReLU, a mean, a second input and a softmax (a kernel Forge's fast_math pass builds before the
    lowering): names with ``/ . : -``, a C keyword as an input's name, a name starting with a digit, and two names
    (``a/b``, ``a.b``) that are the same once made plain."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "conv.weight:0")
    scale = numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, 8)).astype("float32"), "0scale")
    nodes = [
        oh.make_node("Conv", [INPUT, "conv.weight:0"], ["/conv/Conv_output_0"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["/conv/Conv_output_0"], ["a/b"], name="/relu/Relu"),
        oh.make_node("ReduceMean", ["a/b"], ["a.b"], name="mean::1", axes=[2, 3], keepdims=0),
        oh.make_node("Mul", ["a.b", "0scale"], ["scaled-1"], name="scale.mul"),
        oh.make_node("Add", ["scaled-1", OTHER], ["/add/1:0"], name="add/1"),
        oh.make_node("Softmax", ["/add/1:0"], ["out.put:0"], name="/softmax/Softmax"),  # fast_math's own kernel
    ]
    graph = oh.make_graph(nodes, "odd-names", [oh.make_tensor_value_info(INPUT, TensorProto.FLOAT, [1, 3, 16, 16]),
                                               oh.make_tensor_value_info(OTHER, TensorProto.FLOAT, [1, 8])],
                          [oh.make_tensor_value_info("out.put:0", TensorProto.FLOAT, [1, 8])],
                          initializer=[weight, scale])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def kernel_parameters(source: str) -> list[str]:
    names = []
    for signature in re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?\S+\(([^)]*)\)', source):
        names += [param.split()[-1] for param in signature.split(",") if param.strip()]
    return names


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernel_parameters_are_c_identifiers_and_nvcc_compiles_them(arch, tmp_path, monkeypatch):
    sources = cuda_compiles(monkeypatch)
    ir = forge.from_onnx(odd_names_model())
    ir.compile(target=f"cuda -arch={arch}", output_path=tmp_path / "cuda")
    params = kernel_parameters(sources[0])
    assert params, "no kernel parameter found"
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in params), params
    assert "gpu_0_data_0_ptr" in params  # the input's name, made plain, still says which it is
    assert check_cuda_library(tmp_path / "cuda" / "model_library.so", arch)  # nvcc compiled them
    # the module the user holds keeps its names, and a second build gives the same kernels
    assert [spec.name for spec in ir.input_specs] == [INPUT, OTHER]
    ir.compile(target=f"cuda -arch={arch}", output_path=tmp_path / "again")
    assert sources[1] == sources[0]


def test_the_same_model_on_the_cpu_gives_onnxruntime_numbers(tmp_path):
    data = odd_names_model()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 16, 16)).astype("float32")
    other = rng.standard_normal((1, 8)).astype("float32")
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {INPUT: x, OTHER: other})[0]
    ir = forge.from_onnx(data)
    ir.compile(output_path=tmp_path / "cpu")
    runtime = forge.Runtime(tmp_path / "cpu")
    assert [spec.name for spec in runtime.input_specs] == [INPUT, OTHER]
    np.testing.assert_allclose(runtime.infer(x, other)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "plain"), [
    ("/conv/Conv", "_conv_Conv"), ("gpu_0/data_0", "gpu_0_data_0"), ("conv.weight:0", "conv_weight_0"),
    ("0scale", "v0scale"), ("__x", "v__x"), ("int", "int_"), ("threadIdx", "threadIdx_"), ("", "v"),
    ("already_plain", "already_plain"),
])
def test_c_identifier(name, plain):
    assert c_identifier(name) == plain and is_c_identifier(plain)
