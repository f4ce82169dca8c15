"""Reading TIR blocks and loops: extents, iteration kinds, static shapes, the target's vectors."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.sym.pattern import detect_linear_equation


def extent(sch: s_tir.Schedule, loop: s_tir.LoopRV) -> int | None:
    """A loop's extent, or None when it is symbolic."""
    value = sch.get(loop).extent
    return int(value) if isinstance(value, (int, tirx.IntImm)) else None


def blocks(sch: s_tir.Schedule) -> list[s_tir.SBlockRV]:
    """The blocks directly under the function's root block, in program order."""
    return list(sch.get_child_blocks(get_root_block(sch)))


def iter_kinds(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> str:
    """``"SSSSRRR"``: one letter per block iterator, S spatial, R reduction, O other."""
    letters = []
    for iv in sch.get(block).iter_vars:
        if iv.iter_type == tirx.IterVar.DataPar:
            letters.append("S")
        elif iv.iter_type == tirx.IterVar.CommReduce:
            letters.append("R")
        else:
            letters.append("O")
    return "".join(letters)


ROW_BLOCK_BYTES = 512 * 1024
"""The activations of a matmul's row block (:func:`row_block`): a Zen 3's L2."""


def row_block(rows: int, tile: int, row_bytes: int) -> int:
    """Rows of a matmul's row block: the most, a whole number of ``tile``-row register tiles dividing ``rows``,
    whose activations (``row_bytes`` a row) fit in ``ROW_BLOCK_BYTES``; at least one tile.

    The matmul rules (:class:`~forge_core.schedules.matmul.Matmul`,
    :class:`~forge_core.schedules.int8.Int8Matmul`) loop over row blocks, then weight panels (a register
    tile's columns), then the block's tiles: each panel is loaded once a block, where with rows outermost each
    thread swept the whole weight, from L3, for every tile of rows. Measured on BERT-6 (the Zen 5 of
    2026-12-07, 10-12 interleaved rounds): fp32 16.2 -> 15.2 ms in the AVX2 class, 9.75 -> 9.14 ms in AVX-512;
    int8 in the AVX2 class 0.74 -> 0.68 of (the old) fp32 with every row of the 128 in one block, 0.71 with
    blocks of 128 KB; VNNI's int8 did not move (3.52 against 3.59 ms).
    """
    tiles = rows // tile
    fitting = max(1, ROW_BLOCK_BYTES // max(1, row_bytes * tile))
    return tile * largest_divisor(tiles, min(tiles, fitting))


def fewest_computed(size: int, tiles: Iterable[int]) -> int | None:
    """Of ``tiles`` (sizes at most ``size``), the one whose tiles over ``size`` elements, the last clamped to the
    end (overlapping the one before), compute the fewest elements; the widest among equals. None when none fits."""
    fits = [tile for tile in tiles if 0 < tile <= size]
    return min(fits, key=lambda tile: (-(-size // tile) * tile, -tile)) if fits else None


@dataclass(frozen=True)
class _Outline:
    """What the rules first ask of a PrimFunc: whether it is static, and its top-level blocks' names and kinds."""

    static: bool
    blocks: tuple[tuple[str, str], ...]


# Every rule asks the same of each function; a Schedule and TVM's type-checked calls cost about 5 ms a
# function a rule (a third of a small model's compile). Entries hold their function, so a handle is not reused.
_OUTLINES: OrderedDict[int, tuple[tirx.PrimFunc, _Outline]] = OrderedDict()
_OUTLINES_KEPT = 64
_OUTLINES_LOCK = threading.Lock()


def _outline(func: tirx.PrimFunc) -> _Outline:
    key = func.__hash__()
    with _OUTLINES_LOCK:
        cached = _OUTLINES.get(key)
        if cached is not None and cached[0].same_as(func):
            _OUTLINES.move_to_end(key)
            return cached[1]
    sch = s_tir.Schedule(func)
    top = blocks(sch)
    outline = _Outline(
        static=all(extent(sch, loop) is not None for block in top for loop in sch.get_loops(block)),
        blocks=tuple((name_of(sch, block), iter_kinds(sch, block)) for block in top))
    with _OUTLINES_LOCK:
        _OUTLINES[key] = (func, outline)
        if len(_OUTLINES) > _OUTLINES_KEPT:
            _OUTLINES.popitem(last=False)
    return outline


def is_static(func: tirx.PrimFunc) -> bool:
    """Whether every loop of every top-level block has a constant extent."""
    return _outline(func).static


def name_of(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> str:
    return str(sch.get(block).name_hint)


def producer(sch: s_tir.Schedule, main: s_tir.SBlockRV, buffer: tirx.Buffer) -> s_tir.SBlockRV | None:
    """The first top-level block other than ``main`` that writes ``buffer`` (a convolution's padding stage), or None."""
    for block in blocks(sch):
        if any(region.source.same_as(buffer) for region in sch.get(block).writes) \
                and name_of(sch, block) != name_of(sch, main):
            return block
    return None


def sole_block(func: tirx.PrimFunc, prefixes: str | tuple[str, ...], kinds: str, *,
               dynamic: bool = False) -> tuple[s_tir.Schedule, s_tir.SBlockRV] | None:
    """A schedule of a static ``func`` and its one top-level block named ``prefixes``* with iterators ``kinds``.

    None when ``func`` is not a static PrimFunc or has no such block, or several. With ``dynamic``, the
    other way round: ``func`` must have a symbolic extent.
    """
    if not isinstance(func, tirx.PrimFunc):
        return None
    outline = _outline(func)
    found = [i for i, (name, its) in enumerate(outline.blocks) if name.startswith(prefixes) and its == kinds]
    if outline.static == dynamic or len(found) != 1:
        return None
    sch = s_tir.Schedule(func)
    return sch, blocks(sch)[found[0]]


def largest_divisor(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap``."""
    for candidate in range(min(n, cap), 0, -1):
        if n % candidate == 0:
            return candidate
    return 1


@dataclass(frozen=True)
class PlaneLoops:
    """The loops of an ``N, C, spatial..., window...`` block, and the tile of its last spatial loop (the row)."""

    n: s_tir.LoopRV
    c: s_tir.LoopRV
    outer: list[s_tir.LoopRV]
    x: s_tir.LoopRV
    window: list[s_tir.LoopRV]
    tile_x: int


def plane_loops(sch: s_tir.Schedule, block: s_tir.SBlockRV, rank: int, max_tile: int) -> PlaneLoops:
    """``block``'s loops split as :class:`PlaneLoops`; the row tile is the row, or its largest divisor up to ``max_tile``."""
    loops = sch.get_loops(block)
    n, c, *spatial = loops[:2 + rank]
    width = extent(sch, spatial[-1]) or 1
    tile_x = width if width <= max_tile else largest_divisor(width, max_tile)
    return PlaneLoops(n, c, list(spatial[:-1]), spatial[-1], list(loops[2 + rank:]), tile_x)


@dataclass(frozen=True)
class VectorUnit:
    """What the target's SIMD unit holds: bits per register and how many registers."""

    bits: int
    registers: int

    def lanes(self, dtype: str) -> int:
        return max(1, self.bits // tvm.DataType(dtype).bits)

    def vector_factor(self, size: int, dtype: str) -> int:
        """The widest of 1, 1/2 or 1/4 of a register's lanes that divides ``size`` (1 if none)."""
        lanes = self.lanes(dtype)
        for candidate in (lanes, lanes // 2, lanes // 4):
            if candidate >= 2 and size % candidate == 0:
                return candidate
        return 1

    @property
    def accumulators(self) -> int:
        """How many vector accumulators a register tile may hold (room left for operands)."""
        return self.registers - 4 if self.registers >= 32 else self.registers - 2


def vector_unit(target: tvm.target.Target) -> VectorUnit:
    """The SIMD unit of ``target``'s CPU: AVX-512 (512 bits, 32 registers), AVX/AVX2 (256, 16), SSE (128, 16),
    Arm NEON (128, 32); 128 bits for a target that is not LLVM's.

    Read from the target's features: TVM 0.27's ``llvm_get_vector_width`` answers 512 for every x86 CPU (a
    Haswell, a Zen 1), so rules sized by it tiled AVX2 code for 32 zmm registers: two ymm registers a
    "vector" and twice the 16 ymm registers there are, spilled.
    """
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return VectorUnit(128, 16)
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple.startswith(("aarch64", "arm64")):
        return VectorUnit(128, 32)
    try:
        if codegen.target_has_features("avx512f", target):
            return VectorUnit(512, 32)
        if codegen.target_has_features("avx", target):
            return VectorUnit(256, 16)
    except Exception:  # noqa: BLE001 - a CPU LLVM does not know: the smallest unit, always correct
        pass
    return VectorUnit(128, 16)


def vectorize_by_registers(sch: s_tir.Schedule, loop: s_tir.LoopRV, lanes: int) -> None:
    """Vectorize ``loop`` one register (``lanes``) at a time, the registers unrolled.

    LLVM widens a vector of several registers whose count is not a power of two (24 or 40 float32 lanes
    on AVX2) to the next power of two and shuffles: a 4 x 3-vector matmul tile ran 5x slower.
    """
    if (extent(sch, loop) or 0) > lanes:
        registers, loop = sch.split(loop, [None, lanes])
        sch.unroll(registers)
    sch.vectorize(loop)


def _linear(index, var) -> list | None:
    """``[a, b]`` (expressions) when ``index`` is ``a * var + b`` with ``a`` and ``b`` free of ``var``; else None."""
    try:
        coefficients = detect_linear_equation(index, [var])
    except Exception:  # noqa: BLE001 - not linear
        return None
    return list(coefficients) if len(coefficients) == 2 else None


def linear_terms(index, var) -> tuple[int, int] | None:
    """``(a, b)`` when ``index`` is ``a * var + b`` with constant ``a`` and ``b``; else None."""
    coefficients = _linear(index, var)
    if coefficients is None or not all(isinstance(c, tirx.IntImm) for c in coefficients):
        return None
    return int(coefficients[0]), int(coefficients[1])


def coefficient(index, var) -> int | None:
    """``a`` when ``index`` is ``a * var + (anything free of var)`` with a constant ``a``; else None."""
    coefficients = _linear(index, var)
    if coefficients is None or not isinstance(coefficients[0], tirx.IntImm):
        return None
    return int(coefficients[0])


def x_stride(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> int:
    """A convolution block's stride along the output width: the coefficient of x in its input's last index."""
    stmt = sch.get(conv)
    x_var = stmt.iter_vars[3].var
    index = stmt.reads[0].region[-1].min
    try:
        coefficients = detect_linear_equation(index, [x_var])
        return int(coefficients[0]) if len(coefficients) else 1
    except Exception:  # noqa: BLE001 - a non-linear index: treat as stride 1
        return 1
