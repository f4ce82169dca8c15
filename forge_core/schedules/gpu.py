"""GPU schedules: TVM's dlight rules, each kernel taken by the first rule that schedules it without failing.

TVM's CUDA pipeline applies ``dlight.gpu`` rules in order (Matmul, GEMV,
Reduction, GeneralReduction, Fallback), and a rule that raises stops the whole
build. Some raise on kernels with symbolic extents (a convolution over a
dynamic height and width: "There are some consumers of the cache-write stage
that are not properly inlined") rather than declining them. Here a rule that
raises declines: the kernel goes to the next rule, at worst to ``Fallback``,
which binds every kernel to threads. The compile log says which rule failed on
which kernel.

Forge sizes dlight's matmul tile to the kernel (:class:`SizedMatmul`): one
32x64 tile left most of an H200 idle where the outputs are few. And it adds a
rule of its own, :class:`ShortReduction`, ahead of TVM's reduction rules: a
kernel whose reduction is a few elements (a depthwise convolution's 3x3
window, a 7x7 global pool) computes one output per thread. TVM's
``GeneralReduction`` gave each output a block of 256 threads that reduce
together, 247 of them idle on a 3x3 window: MobileNetV2's depthwise
convolutions took most of its time on an H200, and grew with the batch (18.0
ms at batch 8, 1.60 ms with the rule).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import tvm
from tvm import s_tir
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import get_root_block, normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain

logger = logging.getLogger("forge.schedules")


class Declining(dlight.ScheduleRule):
    """``rule``, declining (None) where it raises."""

    def __init__(self, rule: dlight.ScheduleRule) -> None:
        self.rule = rule

    def apply(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> Any:
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as exc:  # noqa: BLE001 - dlight's rules fail with anything from ValueError to TVMError
            name = func.attrs["global_symbol"] if func.attrs is not None and "global_symbol" in func.attrs else "?"
            logger.info("GPU rule %s declined kernel %s, which it failed on: %s", type(self.rule).__name__, name,
                        str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
            return None


LONG_WINDOW = 512
MANY_OUTPUTS = 65536


class ShortReduction(dlight.ScheduleRule):
    """One output per thread for a kernel whose reduction is short: a depthwise convolution, a small pool.

    Takes a kernel with one reduction block (its producers inlinable: padding)
    whose iterators are spatial then reduction, all of static extent, with at
    most ``max_reduction`` elements reduced per output and at least ``threads``
    outputs. The outputs are fused and split over blocks of ``threads``
    threads; each thread reduces its window in registers, unrolled, and writes
    its output through the epilogue (bias, activation, residual add). A longer window, up to
    :data:`LONG_WINDOW` elements, over at least :data:`MANY_OUTPUTS` outputs, a convolution's (two reduction axes
    or more: a row reduction stays with TVM's rules, whose threads read a row together) goes to dlight's ``Fallback``
    (one output a thread, not unrolled), which measured faster there than both.
    """

    def __init__(self, max_reduction: int = 64, threads: int = 256) -> None:
        self.max_reduction = max_reduction
        self.threads = threads

    def apply(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> Any:
        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name not in ("cuda", "rocm", "vulkan", "metal"):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        infos = try_inline(sch, infos)
        reductions = [info for info in infos if info.is_reduction()]
        if len(reductions) != 1 or infos[0] is not reductions[0]:
            return None
        kinds = reductions[0].dom_kind()
        spatial = len(kinds) - len(kinds.lstrip("S"))
        if spatial == 0 or kinds != "S" * spatial + "R" * (len(kinds) - spatial):
            return None
        extents = reductions[0].dom()
        if not all(isinstance(extent, int) for extent in extents):
            return None
        outputs, window = 1, 1
        for extent in extents[:spatial]:
            outputs *= extent
        for extent in extents[spatial:]:
            window *= extent
        if outputs < self.threads:
            return None
        if window > self.max_reduction:
            # a convolution's window (over channels and kernel positions), not a row
            if window <= LONG_WINDOW and outputs >= MANY_OUTPUTS and len(kinds) - spatial >= 2 and spatial >= 2:
                # DBNet's head at batch 8 (a stride-2 transposed convolution, 96 products an output, 819200
                # outputs): 0.033 ms under dlight's Fallback, 0.105 ms unrolled here, 0.74 ms under
                # GeneralReduction, on an H200
                return dlight.gpu.Fallback().apply(func, target, tunable)
            return None
        block = reductions[0].block_rv
        loops = sch.get_loops(block)
        if len(loops) != len(kinds):
            return None
        bx, tx = sch.split(sch.fuse(*loops[:spatial]), factors=[None, self.threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        write = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write, tx, preserve_unit_loops=True)
        auto_inline_consumer_chain(sch, write)
        sch.decompose_reduction(block, loops[spatial])
        for loop in loops[spatial:]:
            sch.unroll(loop)
        for child in sch.get_child_blocks(get_root_block(sch)):  # every block under the threads, or decline
            if not any(sch.get(loop).thread_binding is not None for loop in sch.get_loops(child)):
                return None
        return sch


_Config = dlight.gpu.Matmul.Config
# (block x, block y, vthread x, vthread y, micro x, micro y, micro k, vector, unroll, shared, storage align, inner x)
TVM_TILE = _Config(8, 16, 1, 1, 4, 4, 16, 2, 256, True, True, False)
"""dlight's CUDA matmul: 128 threads, 4x4 outputs each, a 32x64 tile (I x J), 16 of K a step."""
LONG_K = _Config(8, 16, 1, 1, 4, 4, 32, 2, 256, True, True, False)
"""The same tile, 32 of K a step."""
NARROW_TILE = _Config(8, 8, 1, 1, 4, 4, 16, 2, 256, True, True, False)
"""64 threads, 4x4 outputs each: a 32x32 tile."""
SMALL_TILE = _Config(8, 16, 1, 1, 2, 2, 16, 2, 256, True, True, False)
"""128 threads, 2x2 outputs each: a 16x32 tile, four times the blocks."""


def matmul_tile(rows: int, columns: int) -> Any:
    """The tile for a matmul (or a convolution as one) with ``rows`` x ``columns`` outputs (I x J).

    Measured on an H200 (132 SMs), kernel by kernel, over the convolutions and matmuls of ResNet-50,
    MobileNetV2, a 6-layer BERT encoder and a DBNet detector at batch 1 and 8 against eight tiles
    (``benchmarks/gpu_kernels.py``; README, "On a real GPU"): dlight's one tile left most of the
    GPU idle where the outputs are few (ResNet-50's last stage at batch 1: 16 blocks) and padded a narrow J
    (DBNet's 24 channels) to 64.

    * fewer than 200 blocks of dlight's tile: the 16x32 tile (ResNet-50's 3x3 convolutions at batch 1: 0.49 to
      0.56 of dlight's time);
    * J padded by more than a quarter: the 32x32 tile where it gives 1000 blocks or more (DBNet's 24-channel
      convolutions at batch 8: 0.56 to 0.61), else the 16x32 one (0.54);
    * otherwise dlight's tile with 32 of K a step (the BERT encoder at batch 8: 0.89 to 0.93).
    """
    def blocks(tile_i: int, tile_j: int) -> int:
        return math.ceil(rows / tile_i) * math.ceil(columns / tile_j)

    def waste(tile_i: int, tile_j: int) -> float:
        return blocks(tile_i, tile_j) * tile_i * tile_j / (rows * columns)

    if blocks(32, 64) < 200:
        return SMALL_TILE
    if waste(32, 64) <= 1.25:
        return LONG_K
    if waste(32, 32) <= 1.5 and blocks(32, 32) >= 1000:
        return NARROW_TILE
    return SMALL_TILE


class _TiledMatmul(dlight.gpu.Matmul):
    def __init__(self, config: Any) -> None:
        self.config = config

    def get_configs(self, target: tvm.target.Target) -> Any:
        return self.config


class SizedMatmul(dlight.ScheduleRule):
    """TVM's dlight matmul rule (and its tensor-core rules), with a tile sized to the kernel on CUDA targets
    (:func:`matmul_tile`). A kernel with symbolic extents, and other GPU targets, keep dlight's tile."""

    def apply(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> Any:
        extents = _matmul_extents(func) if target.kind.name == "cuda" else None
        rule = dlight.gpu.Matmul() if extents is None else _TiledMatmul(matmul_tile(*extents))
        return rule.apply(func, target, tunable)


def _matmul_extents(func: tvm.tirx.PrimFunc) -> tuple[int, int] | None:
    """(I, J) of ``func`` as dlight's matmul rule normalizes it (``C[S, I, J] += A[S, I, K] * B[S, J, K]``);
    None when it is no matmul or an extent is symbolic."""
    from tvm.s_tir.dlight.gpu.matmul import get_index_map, get_reduction_blocks

    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if not reductions or not get_index_map(sch.get(reductions[0])):
            return None
        block = reductions[0]
        for index in (("read", 0), ("read", 1), ("write", 0)):
            sch.reindex(block, index)
        maps = get_index_map(sch.get(block))
        if maps is None:
            return None
        sch.transform_block_layout(block, maps[0])
        iters = sch.get(block).iter_vars
    except Exception:  # noqa: BLE001 - dlight's analysis raises on forms it does not take; the rule then decides
        return None
    if len(iters) != 4 or not all(isinstance(iv.dom.extent, tvm.tirx.IntImm) for iv in iters[1:3]):
        return None
    return int(iters[1].dom.extent), int(iters[2].dom.extent)


def gpu_rules() -> list[dlight.ScheduleRule]:
    """TVM's dlight GPU rules in TVM's order, the matmul rule's tile sized to the kernel (:class:`SizedMatmul`),
    Forge's :class:`ShortReduction` before the reduction rules; each declining where it fails."""
    rules = [SizedMatmul(), dlight.gpu.GEMV(), ShortReduction(), dlight.gpu.Reduction(),
             dlight.gpu.GeneralReduction(), dlight.gpu.Fallback()]
    return [Declining(rule) for rule in rules]


def gpu_fusion_passes() -> list[tvm.transform.Pass]:
    """TVM's GPU legalization and fusion: the kernels as the rules see them (``benchmarks/gpu_kernels.py``)."""
    return [
        tvm.relax.transform.LegalizeOps(),
        tvm.relax.transform.AnnotateTIROpPattern(),
        tvm.relax.transform.FoldConstant(),
        tvm.relax.transform.FuseOps(),
        tvm.relax.transform.FuseTIR(),
    ]


def gpu_legalize_passes() -> list[tvm.transform.Pass]:
    """TVM's GPU legalization and fusion, then its dlight rules, each declining where it fails."""
    return [*gpu_fusion_passes(), dlight.ApplyDefaultSchedule(*gpu_rules())]
