"""The padded input of a per-plane kernel over a dynamic size, written a plane at a time with no per-element test.

A depthwise convolution or a pooling window over an image of any size reads
TOPI's padded copy of its input, ``pad[n, c, h, w] = x[n, c, h - T, w - L]``
inside the image, the pad value outside. Computed in the parallel loop of
its kernel's planes (the plane stays in cache), that stage tested each
element against the dynamic bounds: a branch per element that LLVM could not
vectorize. Here the stage of a plane is one block of plain loops: border rows
filled with the pad value, and in every image row the left border, a copy of
the row and the right border, each a loop of its own, the copy a contiguous
(stride 1) or interleaved (stride 2) read that LLVM vectorizes.

At stride 2 along the row the padded plane is stored de-interleaved (even
columns, then odd: ``[.., h, parity, w // 2]``) as the static rule stores it
(:func:`~forge_core.schedules.grouped_conv2d.deinterleave`), so that the
kernel's stride-2 row of outputs reads contiguous vectors; its width is
rounded up to an even number (the extra column, never read, holds the pad
value).

Measured for AVX2 (``x86-64-v3``) on an AMD EPYC Zen 4, 2 cores, DBNet's
depthwise layers over a dynamic size at the sizes of a 640x640 image (the
static kernel in brackets): 32 channels 3x3 stride 2 at 320x320, 1.8-2.3 ->
0.56 ms (0.35); 36 channels 3x3 at 160x160, 0.22 -> 0.19 ms (0.15); 5x5
stride 2 at 80x80, 0.12 -> 0.06 ms (0.06); 5x5 at 40x40, 0.072 -> 0.059 ms
(0.038).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from forge_core.schedules.blocks import linear_terms
from forge_core.schedules.rewrite import alloc, const, dims_of, dtype_of, load, redirect_loads


def read_padding(block: s_tir.SBlock) -> tuple[tirx.Buffer, tirx.Buffer, int, int, tirx.PrimExpr] | None:
    """``(input, padded, top, left, pad value)`` when ``block`` is TOPI's 2D padding of an NCHW plane:
    ``padded[n, c, h, w] = if_then_else(inside, x[n, c, h - top, w - left], value)``; else None."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or len(block.iter_vars) != 4 or len(block.reads) != 1:
        return None
    value = store.value
    if not (isinstance(value, tvm.ir.expr.Call) and value.op.same_as(tvm.ir.Op.get("prim.if_then_else"))):
        return None
    _, inside, outside = value.args
    if not isinstance(inside, tvm.ir.expr.TensorLoad) or not isinstance(outside, (tirx.FloatImm, tirx.IntImm)):
        return None
    padded, x = store.buffer, inside.source
    variables = [iv.var for iv in block.iter_vars]
    if len(dims_of(padded)) != 4 or len(dims_of(x)) != 4:
        return None
    if not all(i.same_as(v) for i, v in zip(store.indices, variables)) \
            or not all(i.same_as(v) for i, v in zip(inside.indices[:2], variables[:2])):
        return None
    top, left = (linear_terms(i, v) for i, v in zip(inside.indices[2:], variables[2:]))
    if top is None or left is None or top[0] != 1 or left[0] != 1 or top[1] > 0 or left[1] > 0:
        return None
    return x, padded, -top[1], -left[1], outside


def _plane_block(x: tirx.Buffer, padded: tirx.Buffer, top: int, left: int, value: tirx.PrimExpr,
                 deinterleaved: bool) -> tuple[s_tir.SBlock, tirx.Buffer]:
    """The block writing one (image, channel) plane of the padded input (iterators: the image and the channel),
    and the buffer it writes (``[n, c, H', 2, W' / 2]`` de-interleaved, else ``padded``'s shape)."""
    n, c, height_padded, width_padded = dims_of(padded)
    _, _, height, width = (const(d) for d in dims_of(x))
    dtype = dtype_of(padded)
    analyzer = Analyzer()
    # Stored column w of parity p is padded column s * w + p (s = 2 de-interleaved, else 1 with p = 0), image
    # column s * w + p - left.
    s = 2 if deinterleaved else 1
    stored = analyzer.simplify((const(width_padded) + s - 1) // s)
    out = alloc("pad_temp", [n, c, height_padded, 2, stored] if deinterleaved else [n, c, height_padded, stored],
                dtype)
    image, channel, row = (tirx.Var(name, "int64") for name in ("v_image", "v_channel", "h"))

    def store(parity: int, column: tirx.PrimExpr, element: tirx.PrimExpr) -> tirx.Stmt:
        where = [image, channel, row, const(parity), column] if deinterleaved else [image, channel, row, column]
        return tirx.BufferStore(out, element, where)

    def loop(begin: tirx.PrimExpr, end: tirx.PrimExpr, body) -> tirx.Stmt:  # noqa: ANN001 - body(column)
        column = tirx.Var("w", "int64")
        return tirx.For(column, const(0), analyzer.simplify(const(end) - const(begin)), tirx.ForKind.SERIAL,
                        body(column + const(begin)))

    def sequence(stmts: list[tirx.Stmt]) -> tirx.Stmt:
        return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)

    border_row, image_row = [], []
    for parity in range(s):
        # The stored columns whose image column is in [0, width): w in [ceil((left - p) / s), ceil((left + width - p) / s)).
        begin = analyzer.simplify(const(left - parity + s - 1) // s)
        end = analyzer.simplify((const(left - parity + s - 1) + width) // s)
        border_row.append(loop(0, stored, lambda w, p=parity: store(p, w, value)))
        image_row.append(loop(0, begin, lambda w, p=parity: store(p, w, value)))
        image_row.append(loop(begin, end, lambda w, p=parity: store(
            p, w, load(x, [image, channel, row - top, w * s + (p - left)]))))
        image_row.append(loop(end, stored, lambda w, p=parity: store(p, w, value)))
    inside = tirx.all(row >= top, row < const(top) + height)
    body = tirx.For(row, const(0), const(height_padded), tirx.ForKind.SERIAL,
                    tirx.IfThenElse(inside, sequence(image_row), sequence(border_row)))

    def whole(extent: tirx.PrimExpr) -> tvm.ir.Range:
        return tvm.ir.Range.from_min_extent(const(0), const(extent))

    def one(var: tirx.Var) -> tvm.ir.Range:
        return tvm.ir.Range.from_min_extent(var, const(1))

    reads = [tirx.BufferRegion(x, [one(image), one(channel), whole(height), whole(width)])]
    writes = [tirx.BufferRegion(out, [one(image), one(channel), *(whole(d) for d in dims_of(out)[2:])])]
    iter_vars = [tirx.IterVar(whole(n), image, tirx.IterVar.DataPar),
                 tirx.IterVar(whole(c), channel, tirx.IterVar.DataPar)]
    return s_tir.SBlock(iter_vars, reads, writes, "pad_temp", body), out


def pad_by_planes(func: tirx.PrimFunc, stride: int) -> tirx.PrimFunc | None:
    """``func``, whose padding stage (TOPI's 2D ``pad_temp``) is computed per (image, channel) plane under its
    kernel's parallel loop, with that stage written as :func:`_plane_block`'s plain loops, de-interleaved at
    ``stride`` 2 along the row (its readers' loads redirected); None when the stage is not of that form."""
    found: list[s_tir.SBlock] = []

    def visit(block: s_tir.SBlock) -> None:
        if str(block.name_hint) == "pad_temp":
            found.append(block)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit), order="pre")
    if len(found) != 1:
        return None
    padding = read_padding(found[0])
    if padding is None:
        return None
    x, padded, top, left, value = padding
    deinterleaved = stride == 2
    plane, out = _plane_block(x, padded, top, left, value, deinterleaved)
    old = found[0]

    def index(image, channel, row, column):  # noqa: ANN001, ANN202
        return [image, channel, row, column % 2, column // 2] if deinterleaved else [image, channel, row, column]

    def reader(block: s_tir.SBlock) -> s_tir.SBlock:
        if block.same_as(old) or not any(r.source.same_as(padded) for r in block.reads):
            return block
        whole = [tvm.ir.Range.from_min_extent(const(0), const(d)) for d in dims_of(out)[3:]]
        reads = [tirx.BufferRegion(out, [*r.region[:3], *whole]) if r.source.same_as(padded) else r
                 for r in block.reads]
        return s_tir.SBlock(block.iter_vars, reads, block.writes, block.name_hint,
                            redirect_loads(block.body, padded, out, index), block.init,
                            alloc_buffers=block.alloc_buffers, annotations=block.annotations)

    def nest(loop: tirx.For) -> tirx.Stmt:
        inner = loop.body
        while isinstance(inner, tirx.For):
            inner = inner.body
        if isinstance(inner, s_tir.SBlockRealize) and inner.block.same_as(plane):
            return inner  # an outer loop of the old stage's copy: gone with it
        if isinstance(inner, s_tir.SBlockRealize) and inner.block.same_as(old):
            # The old stage's loops under the plane loop: the plane's block, at the old block's image and channel.
            return s_tir.SBlockRealize(list(inner.iter_values[:2]), True, plane)
        return loop

    rewritten = tvm_ffi.structural_map(func, [(s_tir.SBlock, reader)])
    rewritten = tvm_ffi.structural_map(rewritten, [(tirx.For, nest)])
    root = rewritten.body.block
    buffers = [out if b.same_as(padded) else b for b in root.alloc_buffers]
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body, root.init,
                        alloc_buffers=buffers, annotations=root.annotations)
    return rewritten.with_body(s_tir.SBlockRealize([], True, root))
