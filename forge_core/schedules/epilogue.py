"""Shared pieces of the rules: fused epilogues, padding stages, elementwise blocks."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.sym import Analyzer

from forge_core.schedules.blocks import blocks, extent, iter_kinds, name_of

# Below this many elements a parallel region costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 13


def split_epilogue(sch: s_tir.Schedule, main: s_tir.SBlockRV) -> s_tir.SBlockRV | None:
    """Inline every block after ``main`` but the last, and return that last one (None if ``main`` is last)."""
    all_blocks = blocks(sch)
    names = [name_of(sch, b) for b in all_blocks]
    after = all_blocks[names.index(name_of(sch, main)) + 1:]
    for block in after[:-1]:
        sch.compute_inline(block)
    return after[-1] if after else None


def inline_side_inputs(sch: s_tir.Schedule, main: s_tir.SBlockRV, keep: s_tir.SBlockRV | None) -> None:
    """Inline the elementwise stages before ``main`` that only its epilogue reads (a residual's dequantize).

    The epilogue is computed per tile, under ``main``'s loops; a stage at the
    root that feeds it would not be. ``keep``, when given, stays: a stage
    ``main`` itself reads (its padded input), which the rule places itself.
    """
    main_name, keep_name = name_of(sch, main), name_of(sch, keep) if keep is not None else None
    for block in blocks(sch):  # block statements change as stages are inlined: compare names
        name = name_of(sch, block)
        if name == main_name:
            return
        if name != keep_name and set(iter_kinds(sch, block)) == {"S"}:
            sch.compute_inline(block)


def attach_epilogue(sch: s_tir.Schedule, main: s_tir.SBlockRV, epilogue: s_tir.SBlockRV | None) -> s_tir.SBlockRV:
    """Keep ``main``'s output in registers; return the block that writes the real output."""
    if epilogue is None:
        return sch.cache_write(main, 0, "local")
    sch.set_scope(main, 0, "local")
    return epilogue


def vectorize_write_back(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> None:
    """Vectorize ``block``'s innermost loop when that loop holds ``block`` alone.

    A write-back moved under a tile loop (``reverse_compute_at``) gets a loop of its own there only when the
    tile is wider than one; at a tile of one its innermost loop is the tile loop itself, which also holds the
    reduction. Vectorized, that loop ran the reduction's serial loops as vectors: wrong numbers, no error (a
    depthwise convolution with 37, 61 or 71 outputs per row, whose only tile below 32 is one).
    """
    loops = sch.get_loops(block)
    if loops and len(sch.get_child_blocks(loops[-1])) == 1:
        sch.vectorize(loops[-1])


def parallel_vectorized(sch: s_tir.Schedule, block: s_tir.SBlockRV, lanes: int) -> None:
    """Parallel over the fused outer loops, vectorized innermost loop (an injective block)."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    inner_extent = extent(sch, inner)
    total = 1
    for loop in loops:
        total *= extent(sch, loop) or PARALLEL_MIN_ELEMENTS  # a symbolic extent (a dynamic dim): assume it large
    outer_loops = list(loops[:-1])
    if inner_extent and inner_extent > lanes and inner_extent % lanes == 0:
        outer, inner = sch.split(inner, [None, lanes])
        outer_loops.append(outer)
    # A vectorized bool store is wrong in LLVM 22's codegen here: bool buffers are bytes, and a vector
    # of i1 results stored into them read back as -1/-2 once cast (ViT's attention-mask "any" reduction).
    stores_bool = any(str(region.source.dtype) == "bool" for region in sch.get(block).writes)
    if inner_extent and inner_extent >= 4 and (inner_extent <= lanes or inner_extent % lanes == 0) \
            and not stores_bool:
        sch.vectorize(inner)
    if outer_loops and total >= PARALLEL_MIN_ELEMENTS:
        fused = sch.fuse(*outer_loops) if len(outer_loops) > 1 else outer_loops[0]
        sch.parallel(fused)


def parallel_leading(sch: s_tir.Schedule, loops: list[s_tir.LoopRV], most: int = 3) -> None:
    """Fuse up to ``most`` of ``loops`` (a block's leading spatial loops, outermost first) into one parallel
    loop, unless it runs once; a symbolic extent (a dynamic dim) is parallel whatever it is at run time."""
    outer = list(loops[:most])
    if not outer:
        return
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    size = extent(sch, fused)
    if size is None or size >= 2:
        sch.parallel(fused)


def schedule_padding(sch: s_tir.Schedule, lanes: int) -> None:
    """Padding stages not yet placed: inline a pure copy, else make it a parallel vectorized stage."""
    for block in blocks(sch):
        if not name_of(sch, block).startswith("pad_temp"):
            continue
        loops = sch.get_loops(block)
        if loops and sch.get(loops[0]).kind == tirx.ForKind.PARALLEL:
            continue  # already computed inside a parallel loop
        stmt = sch.get(block)
        source, dest = stmt.reads[0].source, stmt.writes[0].source
        analyzer = Analyzer()
        if len(source.shape) == len(dest.shape) and all(
                analyzer.can_prove_equal(a, b) for a, b in zip(source.shape, dest.shape)):
            sch.compute_inline(block)  # zero padding: a copy
        else:
            parallel_vectorized(sch, block, lanes)
