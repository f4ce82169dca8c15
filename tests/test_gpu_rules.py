"""Forge's own GPU schedule rules, checked without a GPU.

:class:`forge_core.schedules.gpu.ShortReduction` gives each output of a
short-window reduction (a depthwise convolution, a pool) a thread of its own;
:class:`forge_core.schedules.gpu.SizedMatmul` sizes dlight's matmul tile to the
kernel. Their numbers are checked on the CPU: each rule's trace, with its thread bindings
left out, is replayed on the unscheduled function (the same loops, split,
fused, cached, inlined and unrolled, run in order) and compared with the
unscheduled function on random inputs by verification mode's checker. What
the bindings add is checked by nvcc, which compiles every CUDA library that
the suite builds (``test_cuda_code.py``, ``test_c_names.py``).
"""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, s_tir

from forge_core.schedules.gpu import (
    LONG_K, NARROW_TILE, SMALL_TILE, TVM_TILE, ShortReduction, SizedMatmul, _matmul_extents, _TiledMatmul, gpu_rules,
    matmul_tile,
)
from forge_core.schedules.verify import verify_function

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 49152,
                          "max_threads_per_block": 1024, "thread_warp_size": 32})


def _fused(build, *inputs: tuple[tuple[int, ...], str]) -> tvm.tirx.PrimFunc:
    """The one PrimFunc of a Relax function, legalized and fused as the CUDA pipeline does before its rules."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(list(shape), dtype)) for i, (shape, dtype) in enumerate(inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    funcs = [func for func in mod.functions.values() if isinstance(func, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1, [gv.name_hint for gv in mod.functions]
    return funcs[0]


def _check(func: tvm.tirx.PrimFunc, rule=None) -> None:
    """``rule`` (ShortReduction) takes ``func``, binds it to threads, and computes what the unscheduled function
    does."""
    sch = (rule or ShortReduction()).apply(func, CUDA, False)
    assert sch is not None, "the rule declined"
    assert "threadIdx.x" in sch.mod["main"].script()
    serial = s_tir.Schedule(func)
    kept = [inst for inst in sch.trace.insts if inst.kind.name != "Bind"]
    s_tir.schedule.Trace(kept, {}).apply_to_schedule(serial, remove_postproc=False)
    assert verify_function("kernel", "ShortReduction", func, serial.mod["main"], tvm.target.Target("llvm")) is None


def _depthwise(channels: int, kernel: int, stride: int, pad: int, epilogue: str, dilation: int = 1):
    def build(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, dilation=dilation,
                                       groups=channels))
        if epilogue == "relu6":
            y = bb.emit(relax.op.clip(relax.op.add(y, b), 0, 6))
        elif epilogue == "residual":
            y = bb.emit(relax.op.add(relax.op.add(y, b), x))
        return y
    return build


@pytest.mark.parametrize("shape,kernel,stride,pad,epilogue,dtype", [
    ((1, 5, 13, 17), 3, 1, 1, "relu6", "float32"),      # odd sizes: 1105 outputs, a partial last block
    ((2, 8, 15, 15), 3, 2, 1, "none", "float32"),       # stride 2, batch 2, no epilogue
    ((1, 4, 20, 20), 5, 1, 2, "relu6", "float32"),      # 5x5
    ((1, 6, 11, 9), 3, 1, 1, "residual", "float32"),    # a residual add after the bias
    ((1, 8, 16, 16), 3, 1, 1, "relu6", "float16"),      # float16, as set_float16 leaves it
])
def test_depthwise_convolutions_with_and_without_epilogues(shape, kernel, stride, pad, epilogue, dtype):
    channels = shape[1]
    func = _fused(_depthwise(channels, kernel, stride, pad, epilogue), (shape, dtype), ((channels, 1, kernel, kernel), dtype),
                  ((1, channels, 1, 1), dtype))
    _check(func)


def test_dilated_depthwise_convolution():
    func = _fused(_depthwise(4, 3, 1, 2, "relu6", dilation=2), ((1, 4, 17, 19), "float32"),
                  ((4, 1, 3, 3), "float32"), ((1, 4, 1, 1), "float32"))
    _check(func)


def test_pools():
    _check(_fused(lambda bb, x: relax.op.nn.avg_pool2d(x, 3, 2, 1), ((2, 7, 17, 13), "float32")))
    _check(_fused(lambda bb, x: relax.op.nn.max_pool2d(x, 3, 1, 1), ((1, 9, 12, 12), "float32")))
    # a global average pool over 7x7 (49 elements) of 1280 channels, batch 3
    _check(_fused(lambda bb, x: relax.op.mean(x, axis=[2, 3]), ((3, 1280, 7, 7), "float32")))


def test_declines_long_windows_few_outputs_and_several_reductions():
    rule = ShortReduction()
    long_window = _fused(_depthwise(4, 9, 1, 4, "relu6"), ((1, 4, 20, 20), "float32"), ((4, 1, 9, 9), "float32"),
                         ((1, 4, 1, 1), "float32"))
    few_outputs = _fused(_depthwise(2, 3, 1, 1, "none"), ((1, 2, 4, 4), "float32"), ((2, 1, 3, 3), "float32"),
                         ((1, 2, 1, 1), "float32"))
    softmax = _fused(lambda bb, x: relax.op.nn.softmax(x), ((64, 32), "float32"))
    for func in (long_window, few_outputs, softmax):
        assert rule.apply(func, CUDA, False) is None
    assert rule.apply(long_window, tvm.target.Target("llvm"), False) is None  # GPU targets only


def test_rule_order():
    """ShortReduction sees the kernels that TVM's matmul and GEMV rules leave, before its reduction rules."""
    names = [type(rule.rule).__name__ for rule in gpu_rules()]
    assert names == ["SizedMatmul", "GEMV", "ShortReduction", "Reduction", "GeneralReduction", "Fallback"]


def test_a_long_convolution_window_over_many_outputs_takes_one_thread_an_output():
    """DBNet's head: a stride-2 transposed convolution from 24 channels to 1, 96 products an output."""
    def head(bb, x, w):
        return relax.op.sigmoid(relax.op.nn.conv2d_transpose(x, w, strides=2))
    func = _fused(head, ((1, 24, 160, 160), "float32"), ((24, 1, 2, 2), "float32"))
    _check(func)  # dlight's Fallback schedules it: its numbers checked as the unrolled form's are
    rows = _fused(lambda bb, x: relax.op.sum(x, axis=[1]), ((70000, 100), "float32"))
    assert ShortReduction().apply(rows, CUDA, False) is None  # a row's sum: TVM's reduction rules


# --- SizedMatmul: the measured tiles --------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,columns,tile", [
    (49, 512, SMALL_TILE),      # ResNet-50's last stage at batch 1: 16 blocks of dlight's tile
    (392, 512, SMALL_TILE),     # the same at batch 8
    (1024, 768, LONG_K),        # a BERT encoder (hidden 768) at batch 8
    (6272, 128, LONG_K),        # ResNet-50's second stage at batch 8
    (51200, 24, NARROW_TILE),   # DBNet's 24-channel convolutions at batch 8: J padded to 64 by dlight's tile
    (12800, 24, SMALL_TILE),    # the same, four times fewer outputs
])
def test_the_tile_follows_the_kernels_size(rows, columns, tile):
    assert matmul_tile(rows, columns) is tile


def _conv3x3(bb, x, w, b):
    y = bb.emit(relax.op.nn.conv2d(x, w, strides=1, padding=1))
    return bb.emit(relax.op.clip(relax.op.add(y, b), 0, 6))


def _dense(bb, x, w):
    return relax.op.matmul(x, w)


@pytest.mark.parametrize("config", [TVM_TILE, LONG_K, NARROW_TILE, SMALL_TILE], ids=["tvm", "long_k", "narrow", "small"])
@pytest.mark.parametrize("case", ["conv3x3_relu6", "conv1x1_residual", "dense", "dense_float16"])
def test_every_tile_computes_the_kernel(config, case):
    """Odd sizes (partial tiles on I, J and K), with an epilogue and without one, in float32 and float16."""
    if case == "conv3x3_relu6":
        func = _fused(_conv3x3, ((1, 12, 9, 11), "float32"), ((20, 12, 3, 3), "float32"), ((1, 20, 1, 1), "float32"))
    elif case == "conv1x1_residual":
        def conv(bb, x, w):
            return bb.emit(relax.op.add(relax.op.nn.conv2d(x, w), x))
        func = _fused(conv, ((2, 24, 7, 5), "float32"), ((24, 24, 1, 1), "float32"))
    elif case == "dense":
        func = _fused(_dense, ((37, 50), "float32"), ((50, 29), "float32"))
    else:
        func = _fused(_dense, ((37, 50), "float16"), ((50, 29), "float16"))
    _check(func, _TiledMatmul(config))
    _check(func, SizedMatmul())


def test_symbolic_extents_keep_dlights_tile():
    n = tvm.tirx.Var("n", "int64")
    func = _fused(_dense, ((n, 64), "float32"), ((64, 48), "float32"))
    assert _matmul_extents(func) is None
    assert SizedMatmul().apply(func, CUDA, False) is not None
    assert _matmul_extents(_fused(_dense, ((37, 50), "float32"), ((50, 29), "float32"))) == (37, 29)
