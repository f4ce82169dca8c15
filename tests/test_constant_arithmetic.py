"""Constant arithmetic folded with numpy gives, bit for bit, the constants Relax's FoldConstant builds and runs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from forge_core.ir.constant_arithmetic import fold_arithmetic

RNG = np.random.default_rng(7)


def _module(build) -> tvm.IRModule:
    """``main(x) = x + build(bb)``: the operand ``build`` makes from constants only, added to an input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 4, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = build(bb)
            out = bb.emit_output(bb.emit(relax.op.add(x, value)))
        bb.emit_func_output(out)
    return bb.get()


def _const(*shape: int, dtype: str = "float32", positive: bool = False) -> relax.Expr:
    values = RNG.normal(0.5, 2.0, shape)
    return relax.const((np.abs(values) + 0.01 if positive else values).astype(dtype))


def _the_constant(mod: tvm.IRModule) -> np.ndarray:
    """The constant operand of the one add left after folding."""
    func = mod["main"]
    adds = [b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and str(b.value.op.name) == "relax.add"]
    assert len(adds) == 1, func
    constant = adds[0].args[1]
    assert isinstance(constant, tvm.ir.GenericConst), f"not folded: {func}"
    return constant.value.numpy()


def _folded_calls(mod: tvm.IRModule) -> int:
    after = fold_arithmetic(mod)["main"]
    return sum(isinstance(b.value, tvm.ir.GenericConst) for block in after.body.blocks for b in block.bindings)


# A batch norm decomposed for inference, as DenseNet's pre-activation blocks are: the chain numpy folds.
def _batch_norm_scale(bb: relax.BlockBuilder) -> relax.Expr:
    var, gamma, mean, beta = _const(3, positive=True), _const(3), _const(3), _const(3)
    eps = relax.const(np.float32(1e-5))
    scale = bb.emit(relax.op.divide(gamma, relax.op.sqrt(relax.op.add(var, eps))))
    shift = bb.emit(relax.op.subtract(beta, relax.op.multiply(mean, scale)))
    both = bb.emit(relax.op.add(relax.op.expand_dims(scale, [1, 2]), relax.op.expand_dims(shift, [1, 2])))
    return bb.emit(relax.op.reshape(relax.op.permute_dims(relax.op.broadcast_to(both, (3, 4, 5)), [0, 2, 1]),
                                    (3, 4, 5)))


CASES = {
    "batch-norm-chain": _batch_norm_scale,
    "rsqrt-negative": lambda bb: bb.emit(relax.op.negative(relax.op.rsqrt(_const(3, 4, 5, positive=True)))),
    "max-min-broadcast": lambda bb: bb.emit(relax.op.minimum(relax.op.maximum(_const(4, 1), _const(1, 5)),
                                                             _const(3, 1, 1))),
    "squeeze-all-and-axis": lambda bb: bb.emit(relax.op.squeeze(relax.op.squeeze(_const(1, 3, 1, 4, 1, 5), [0]),
                                                                None)),
    "expand-dims-negative-axis": lambda bb: bb.emit(relax.op.expand_dims(_const(4, 5), [-3])),
    "permute-reversed": lambda bb: bb.emit(relax.op.permute_dims(_const(5, 4, 3), None)),
    # IEEE's special values: x/0, 0/0, inf/inf, sqrt of a negative (no warning, the same bits).
    "division-by-zero-and-nan": lambda bb: bb.emit(relax.op.broadcast_to(relax.op.add(relax.op.divide(
        relax.const(np.array([1, -1, 0, np.inf, 2], "float32")),
        relax.const(np.array([0, 0, 0, np.inf, -0.0], "float32"))),
        relax.op.sqrt(relax.const(np.array([-1, 4, 0, 1, 9], "float32")))), (2, 3, 4, 5))),
    # Left to FoldConstant (not exact in numpy, or not floating point): still the same constant.
    "exp-and-cast": lambda bb: bb.emit(relax.op.astype(relax.op.exp(_const(3, 4, 5, dtype="float64")), "float32")),
    "integer-division": lambda bb: bb.emit(relax.op.broadcast_to(relax.op.astype(relax.op.divide(
        relax.const(np.array([-7, 7, 9, 5, 1], "int32")), relax.const(np.array([2, -2, 4, 3, 1], "int32"))),
        "float32"), (2, 3, 4, 5))),
}
FOLDED_BY_NUMPY = {"batch-norm-chain": 11, "rsqrt-negative": 2, "max-min-broadcast": 2, "squeeze-all-and-axis": 2,
                   "expand-dims-negative-axis": 1, "permute-reversed": 1, "exp-and-cast": 0, "integer-division": 0,
                   "division-by-zero-and-nan": 4}


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_folding_gives_fold_constants_bits(case):
    mod = _module(CASES[case])
    reference = _the_constant(relax.transform.FoldConstant()(mod))
    ours = _the_constant(relax.transform.FoldConstant()(fold_arithmetic(mod)))
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))
    assert _folded_calls(mod) == FOLDED_BY_NUMPY[case]


def test_an_input_operand_is_never_folded():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.sqrt(relax.op.add(x, _const(3, positive=True)))))
        bb.emit_func_output(out)
    mod = bb.get()
    assert fold_arithmetic(mod).same_as(mod)


def test_a_slice_with_ends_computed_at_run_time_survives_constant_folding_and_builds():
    """Relax's FoldConstant legalized ``dynamic_strided_slice`` (an ONNX Slice whose ends come from the input's
    shape: torch's ``chunk`` on a dynamic batch and sequence) and dropped the PrimFunc it then called; the module
    failed to build ("There is no definition of I.GlobalVar("shape_func")"). ``fold_constant`` holds such calls."""
    from tvm import tirx

    from forge_core.ir.constant_arithmetic import fold_constant

    batch, sequence = tirx.Var("batch", "int64"), tirx.Var("sequence", "int64")
    x = relax.Var("x", relax.TensorType([batch, sequence, 12], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            shape = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(x)))
            ends = bb.emit(relax.op.scatter_elements(shape, relax.const(np.array([2]), "int64"),
                                                     relax.const(np.array([4]), "int64")))
            zeros, ones = (relax.const(np.full(3, v), "int64") for v in (0, 1))
            out = bb.emit_output(bb.emit(relax.op.dynamic_strided_slice(x, zeros, ends, ones)))
        bb.emit_func_output(out)
    folded = fold_constant(bb.get())
    assert [gv.name_hint for gv in folded.functions] == ["main"]
    assert "dynamic_strided_slice" in folded.script()  # the call as it was, for the pipeline to legalize
    executable = tvm.compile(folded, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    data = RNG.standard_normal((2, 3, 12)).astype("float32")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(data)).numpy(), data[:, :, :4])
