"""Constant ``call_tir`` calls evaluated together (one library) give FoldConstant's constants, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, topi

from forge_core.ir.constant_calls import fold_constant_calls

RNG = np.random.default_rng(11)


def _const(*shape: int) -> relax.Expr:
    return relax.const(RNG.normal(0.0, 1.0, shape).astype("float32"))


def _chain_module() -> tvm.IRModule:
    """A weight repacked in two steps (transpose, then a constant added: the second reads the first's result),
    a second weight in one step, each used by a call on the input; and a call on the input alone."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            packed = bb.emit_te(topi.transpose, _const(6, 4), [1, 0])
            shifted = bb.emit_te(topi.add, packed, _const(4, 6))
            scaled = bb.emit_te(topi.multiply, _const(4, 6), _const(4, 6))
            first = bb.emit_te(topi.add, x, shifted)
            second = bb.emit_te(topi.subtract, first, scaled)
            out = bb.emit_output(bb.emit_te(topi.exp, second))
        bb.emit_func_output(out)
    return bb.get()


def _constant_operands(mod: tvm.IRModule) -> list[np.ndarray]:
    return [arg.value.numpy() for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) for field in b.value.args[1:]
            for arg in (field.fields if isinstance(field, relax.Tuple) else [field])
            if isinstance(arg, tvm.ir.GenericConst)]


def test_folded_together_the_module_is_fold_constants():
    mod = _chain_module()
    reference = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))
    folded = fold_constant_calls(mod)
    ours = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(folded))
    tvm.ir.assert_structural_equal(ours, reference, map_free_vars=True)  # constants compared by content
    assert len(_constant_operands(ours)) == 2  # the chain's result and the product
    # Nothing was left for FoldConstant: every constant call is a constant binding already.
    calls = [b.value for block in folded["main"].body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]
    assert len(calls) == 3, folded  # the three calls on the input


def test_the_folded_module_computes_what_the_original_does():
    mod = _chain_module()
    data = RNG.standard_normal((4, 6)).astype("float32")
    results = []
    for module in (mod, relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(
            fold_constant_calls(mod)))):
        vm = relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())
        results.append(vm["main"](tvm.runtime.tensor(data)).numpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_a_call_with_tuple_results_is_folded_to_a_tuple_of_constants():
    weight = RNG.standard_normal((6, 4)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit_te(topi.split, relax.const(weight), 3, 0)
            top = bb.emit(relax.TupleGetItem(parts, 2))
            out = bb.emit_output(bb.emit_te(topi.add, x, top))
        bb.emit_func_output(out)
    folded = fold_constant_calls(bb.get())
    values = [b.value for block in folded["main"].body.blocks for b in block.bindings]
    assert isinstance(values[0], relax.Tuple), values[0]
    for field, want in zip(values[0].fields, np.split(weight, 3)):
        np.testing.assert_array_equal(field.value.numpy(), want)


def test_a_module_without_constant_calls_is_returned_as_is():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(topi.add, x, _const(3)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert fold_constant_calls(mod).same_as(mod)


def test_calls_the_host_cannot_build_are_left_to_fold_constant():
    """A PrimFunc bound to GPU threads does not build for the host CPU: the module is returned unchanged, as
    FoldConstant skips a function it cannot build."""
    data = te.placeholder((64,), name="data")
    doubled = te.compute((64,), lambda i: data[i] * 2.0, name="doubled")
    sch = s_tir.Schedule(te.create_prim_func([data, doubled]))
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("doubled"))[0], [None, 32])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            gpu = bb.add_func(sch.mod["main"], "gpu_double")
            out = bb.emit_output(bb.emit(relax.call_tir(gpu, [_const(64)], relax.TensorType((64,), "float32"))))
        bb.emit_func_output(out)
    mod = bb.get()
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever TVM raises: the premise of the test
        tvm.tirx.build(tvm.IRModule({"gpu_double": mod["gpu_double"]}), target="llvm")
    assert fold_constant_calls(mod).same_as(mod)
