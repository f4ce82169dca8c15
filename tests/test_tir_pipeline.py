"""Forge's TIR lowering: small CPU buffers (a schedule's register tile) are stack arrays, not workspace allocations."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
import torch
from tvm import relax
from tvm.script import tirx as T

from cpu_features import VNNI, needs_vnni
from forge_core.compiler.pipeline import build
from forge_core.compiler.tir_pipeline import STACK_LIMIT, tir_pipeline

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
WORKSPACE = "TVMBackendAllocWorkspace"


def _tiled(elements: int, scope: str) -> tvm.IRModule:
    """A parallel loop whose body fills a tile of ``elements`` floats, then writes it out plus one."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((8, elements), "float32"), b: T.Buffer((8, elements), "float32")):
        T.func_attr({"tirx.noalias": True, "global_symbol": "main"})
        for i in T.parallel(8):
            tile = T.alloc_buffer((elements,), "float32", scope=scope)
            for j in range(elements):
                tile[j] = a[i, j] * T.float32(2.0)
            for j in range(elements):
                b[i, j] = tile[j] + T.float32(1.0)

    return tvm.IRModule({"main": main})


def _run(mod: tvm.IRModule, pipeline: str, elements: int) -> tuple[np.ndarray, np.ndarray, str]:
    lib = tvm.compile(mod, target=TARGET, tir_pipeline=pipeline)
    a = np.random.default_rng(0).standard_normal((8, elements)).astype(np.float32)
    b = tvm.runtime.tensor(np.zeros_like(a))
    lib["main"](tvm.runtime.tensor(a), b)
    return b.numpy(), a * 2 + 1, lib.mod.inspect_source("ll")


@pytest.mark.parametrize("scope", ["local", "global"])
@pytest.mark.parametrize("elements", [16, 384, STACK_LIMIT // 4])
def test_small_buffers_are_stack_arrays(scope, elements):
    got, want, code = _run(_tiled(elements, scope), tir_pipeline(), elements)
    np.testing.assert_array_equal(got, want)
    assert WORKSPACE not in code


def test_tvm_default_pipeline_allocates_them_in_the_workspace_pool():
    """What the pass works around: TVM 0.27 lowers a 64-byte local tile to a workspace call per task."""
    got, want, code = _run(_tiled(16, "local"), "default", 16)
    np.testing.assert_array_equal(got, want)
    assert WORKSPACE in code


@pytest.mark.parametrize("scope", ["local", "global"])
def test_larger_buffers_stay_in_the_workspace_pool(scope):
    elements = STACK_LIMIT // 4 + 16
    got, want, code = _run(_tiled(elements, scope), tir_pipeline(), elements)
    np.testing.assert_array_equal(got, want)
    assert WORKSPACE in code


def _compute_functions(code: str) -> dict[str, str]:
    """The LLVM functions of a library's parallel loop bodies (``__tvm_parallel_lambda...``), by name."""
    found = {}
    for chunk in code.split("\ndefine ")[1:]:
        name = re.match(r"[^@]*@([\w.]+)", chunk).group(1)
        if name.startswith("__tvm_parallel_lambda"):
            found[name] = chunk.split("\n}\n")[0]
    return found


def _conv_relu(weight: np.ndarray, bias: np.ndarray, shape: tuple[int, ...]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(shape, "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(data, relax.const(weight), padding=1))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(bias.reshape(1, -1, 1, 1)))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("opt_level", [0, 3])
def test_forge_kernels_take_no_workspace_per_task(opt_level):
    """Forge's build of a convolution with its epilogue: no parallel loop body allocates from the pool."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.2
    bias = rng.standard_normal(32).astype(np.float32)
    x = rng.standard_normal((1, 16, 15, 15)).astype(np.float32)
    schedules: dict = {}
    executable = build(_conv_relu(weight, bias, x.shape), TARGET, opt_level, schedules=schedules)
    assert "Conv2dNCHW" in schedules["rules"].values(), schedules
    bodies = _compute_functions(executable.mod.imports[0].inspect_source("ll"))
    assert bodies, "no parallel loop bodies"
    assert not [name for name, body in bodies.items() if WORKSPACE in body]
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(weight),
                                                 torch.from_numpy(bias), padding=1)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _rounding(elements: int) -> tvm.IRModule:
    """A vectorized loop that rounds (``tirx.nearbyint``, ties to even), as every requantizing epilogue does."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((elements,), "float32"), b: T.Buffer((elements,), "float32")):
        T.func_attr({"tirx.noalias": True, "global_symbol": "main"})
        for i in T.vectorized(elements):
            b[i] = T.nearbyint(a[i] * T.float32(0.5))

    return tvm.IRModule({"main": main})


def _ties_and_more(elements: int) -> np.ndarray:
    """Halves (ties: 0.5, 1.5, 2.5, -0.5, ...), values near them, large values, signed zeros, inf and NaN."""
    rng = np.random.default_rng(5)
    special = np.array([1.0, 3.0, 5.0, -1.0, -3.0, 0.0, -0.0, 2.9999998, 1.0000001, 2 ** 25 + 1, -2 ** 24 - 2,
                        np.inf, -np.inf, np.nan], np.float32)
    values = (rng.standard_normal(elements) * 20).astype(np.float32)
    values[: len(special)] = special
    return values


@pytest.mark.parametrize("pipeline", ["forge", "default"])
def test_rounding_vectorizes_in_forges_pipeline_and_rounds_ties_to_even(pipeline):
    """TVM 0.27 cannot vectorize ``tirx.nearbyint``; Forge's pipeline writes it as ``llvm.nearbyint``, which can.

    Both give numpy's ``rint`` (ties to even) bit for bit; only in Forge's is the loop TVM's vector.
    """
    elements = 64
    lib = tvm.compile(_rounding(elements), target=TARGET,
                      tir_pipeline=tir_pipeline() if pipeline == "forge" else "default")
    a = _ties_and_more(elements)
    b = tvm.runtime.tensor(np.zeros_like(a))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_array_equal(b.numpy(), np.rint(a * np.float32(0.5)))
    # TVM's vector: the whole 64-lane loop (LLVM may still vectorize a scalar loop its own way, 4 lanes here).
    assert ("@llvm.nearbyint.v64f32" in lib.mod.inspect_source("ll")) == (pipeline == "forge")


def test_rounding_is_left_alone_outside_llvm_targets():
    """``call_llvm_pure_intrin`` means nothing to the CUDA code generator: GPU functions keep ``nearbyint``."""
    from forge_core.compiler.tir_pipeline import vectorizable_rounding

    for target, rewritten in [(tvm.target.Target("cuda"), False), (TARGET, True)]:
        mod = tvm.tirx.transform.BindTarget(target)(_rounding(16))
        text = vectorizable_rounding(mod).script()
        assert ("llvm.nearbyint" in text) == rewritten
        assert ("T.nearbyint" in text) != rewritten


def _requantized_pointwise_conv(weight: np.ndarray, bias: np.ndarray, scale: np.ndarray, shape) -> tvm.IRModule:
    """uint8 x int8 -> int32 1x1 convolution, then bias, scale, round, clamp to 0..255 and a uint8 cast."""
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(shape, "uint8"))
    with bb.function("main", [data]):
        with bb.dataflow():
            acc = bb.emit(relax.op.nn.conv2d(data, relax.const(weight), out_dtype="int32"))
            acc = bb.emit(relax.op.add(acc, relax.const(bias.reshape(-1, 1, 1))))
            y = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale.reshape(-1, 1, 1))))
            y = bb.emit(relax.op.clip(relax.op.round(y), 0, 255))
            out = bb.emit_output(relax.op.astype(y, "uint8"))
        bb.emit_func_output(out)
    return bb.get()


@needs_vnni
@pytest.mark.parametrize("opt_level", [1, 3, 4])
def test_requantizing_epilogue_rounds_in_vectors_and_stays_exact(opt_level):
    """MobileNetV2's 28x28 expansion (32 -> 192), pixel-lane int8 rule: its epilogue rounds whole vectors.

    With ``nearbyint`` scalar, LLVM had rebuilt this epilogue with gathers and byte stores (0.076 ms; 0.026 ms
    vectorized). Checked against numpy's int64 products, requantized in float32 as the epilogue does.
    """
    rng = np.random.default_rng(11)
    weight = rng.integers(-128, 128, (192, 32, 1, 1)).astype(np.int8)
    bias = rng.integers(-3000, 3000, 192).astype(np.int32)
    scale = (rng.random(192) * 4e-3 + 1e-3).astype(np.float32)
    x = rng.integers(0, 256, (1, 32, 28, 28)).astype(np.uint8)
    schedules: dict = {}
    executable = build(_requantized_pointwise_conv(weight, bias, scale, x.shape), VNNI, opt_level,
                       schedules=schedules)
    assert "Int8PointwiseConv2dNCHW" in schedules["rules"].values(), schedules
    code = executable.mod.imports[0].inspect_source("ll")
    assert re.search(r"@llvm\.nearbyint\.v16f32", code)
    assert "llvm.masked.gather" not in code
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    acc = np.einsum("nchw,fc->nfhw", x.astype(np.int64), weight[:, :, 0, 0].astype(np.int64)) + bias.reshape(-1, 1, 1)
    want = np.clip(np.rint(acc.astype(np.float32) * scale.reshape(-1, 1, 1)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, want)
