"""Forge's TIR lowering: small CPU buffers (a schedule's register tile) are stack arrays, not workspace allocations."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
import torch
from tvm import relax
from tvm.script import tirx as T

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
