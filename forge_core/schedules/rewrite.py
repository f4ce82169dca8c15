"""Replacing an operator's stages in a fused PrimFunc with loop nests built here, on the same buffers.

A schedule cannot change what a function computes, only in which order. Some
legalized operators compute the wrong thing for speed: TOPI's transposed
convolution multiplies a zero-inserted input (``s**2`` times the work at
stride ``s``, most of it by zeros). A rule that wants another algorithm
rebuilds the operator's stages with :func:`stage` and splices them into the
fused function with :func:`replace_stages`; the fused epilogue (bias,
activation, residual add) keeps its own stages, reading the same buffer.

In TVM 0.27 a buffer is a ``Var`` whose type is a ``BufferType``: the new
stages load and store the function's own buffer variables, so nothing else
in the function changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.analysis import get_sblock_read_write_region
from tvm.sym import Analyzer

from forge_core.errors import OptionError

Expr = tvm.ir.expr.Expr
BufferVar = tvm.ir.expr.Var


def const(value: int | Expr) -> Expr:
    """An index constant (legalized functions index in int64); an expression (a dynamic extent) as it is."""
    return tirx.IntImm("int64", value) if isinstance(value, int) else value


def shape_of(buffer: BufferVar) -> list[int]:
    """A static buffer's shape."""
    return [int(d) for d in buffer.ty.shape]


def dims_of(buffer: BufferVar) -> list[int | Expr]:
    """A buffer's shape: ints where static, the expressions of its dynamic dims (``height * 2``) otherwise."""
    return [int(d) if isinstance(d, tirx.IntImm) else d for d in buffer.ty.shape]


def dtype_of(buffer: BufferVar) -> str:
    """A buffer's element type."""
    return str(buffer.ty.dtype)


def alloc(name: str, shape: Sequence[int | Expr], dtype: str) -> BufferVar:
    """A new intermediate buffer, to list in :func:`replace_stages`'s ``allocs``."""
    return tirx.decl_buffer([const(d) for d in shape], dtype, name)


def load(buffer: BufferVar, indices: Sequence[Expr]) -> Expr:
    """``buffer[indices]``."""
    return tirx.BufferLoad(buffer, list(indices))


def substitute(expr: Expr, values: Sequence[tuple[tirx.Var, Expr]]) -> Expr:
    """``expr`` with each variable of ``values`` replaced by its expression."""
    def replace(var: tirx.Var) -> Expr:
        return next((value for old, value in values if var.same_as(old)), var)

    return tvm_ffi.structural_map(expr, [(tvm.ir.expr.Var, replace)])


def redirect_loads(expr: Expr, old: BufferVar, new: BufferVar, index: Callable[..., Sequence[Expr]], *,
                   cast: str | None = None) -> Expr:
    """``expr`` with each load ``old[i...]`` turned into ``new[index(i...)]`` (indices simplified).

    With ``cast``, only the loads converted to that type are redirected, the
    conversion with them (``Cast(cast, old[i])`` becomes ``new[index(i)]``:
    ``new`` holds the converted values); other loads of ``old`` stay.
    """
    analyzer = Analyzer()

    def redirected(access):  # noqa: ANN001, ANN202 - a TensorLoad
        return tirx.BufferLoad(new, [analyzer.simplify(i) for i in index(*access.indices)])

    def replace_load(access):  # noqa: ANN001, ANN202 - a TensorLoad
        return redirected(access) if access.source.same_as(old) else access

    def replace_cast(node):  # noqa: ANN001, ANN202 - a Cast
        value = node.value
        if str(node.ty) == cast and isinstance(value, tvm.ir.expr.TensorLoad) and value.source.same_as(old):
            return redirected(value)
        return node

    if cast is None:
        return tvm_ffi.structural_map(expr, [(tvm.ir.expr.TensorLoad, replace_load)])
    return tvm_ffi.structural_map(expr, [(tirx.Cast, replace_cast)])


def loads_of(expr: Expr, buffer: BufferVar) -> list:
    """The loads of ``buffer`` in ``expr``."""
    found: list = []

    def visit(access):  # noqa: ANN001, ANN202 - a TensorLoad
        if access.source.same_as(buffer):
            found.append(access)
        return access

    tvm_ffi.structural_map(expr, [(tvm.ir.expr.TensorLoad, visit)])
    return found


def stage(name: str, out: BufferVar, value: Callable[..., Expr], inputs: Sequence[BufferVar],
          reduce: Sequence[int] = (), annotations: dict | None = None, *,
          reads: Callable[..., list[tirx.BufferRegion]] | None = None) -> tirx.Stmt:
    """A loop nest of one block writing every element of ``out`` from the buffers ``inputs``.

    ``value(*spatial, *reduction)`` gives the element (the block iterators as
    int64 expressions); with ``reduce`` extents the block sums it over those
    iterators, from zero. The block's read and write regions are derived.

    ``reads(*spatial)``, when given, are the block's read regions instead: a
    declared superset, so that a producer placed under one of this block's
    loops is computed over all of it (not over the bounding box of the
    elements read).
    """
    spatial_extents = dims_of(out)
    extents = spatial_extents + list(reduce)
    block_vars = [tirx.Var(f"v{i}", "int64") for i in range(len(extents))]
    loop_vars = [tirx.Var(f"i{i}", "int64") for i in range(len(extents))]
    kinds = [tirx.IterVar.DataPar] * len(spatial_extents) + [tirx.IterVar.CommReduce] * len(reduce)
    iter_vars = [tirx.IterVar(tvm.ir.Range.from_min_extent(const(0), const(e)), v, k)
                 for v, e, k in zip(block_vars, extents, kinds)]
    index = block_vars[:len(spatial_extents)]
    element = value(*block_vars)
    init = None
    if reduce:
        init = tirx.BufferStore(out, tirx.const(0, dtype_of(out)), index)
        element = load(out, index) + element
    body = tirx.BufferStore(out, element, index)
    block = s_tir.SBlock(iter_vars, [], [], name, body, init, annotations=annotations)
    derived, writes = get_sblock_read_write_region(block, {b: b for b in (*inputs, out)})
    block = s_tir.SBlock(iter_vars, reads(*index) if reads is not None else derived, writes, name, body, init,
                         annotations=annotations)
    nest: tirx.Stmt = s_tir.SBlockRealize(loop_vars, True, block)
    for var, ext in reversed(list(zip(loop_vars, extents))):
        nest = tirx.For(var, const(0), const(ext), tirx.ForKind.SERIAL, nest)
    return nest


def _top_level(func: tirx.PrimFunc) -> tuple[s_tir.SBlock, list[tirx.Stmt]]:
    root = func.body.block
    body = root.body
    return root, list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def _block_of(stmt: tirx.Stmt) -> s_tir.SBlock | None:
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt.block if isinstance(stmt, s_tir.SBlockRealize) else None


def top_level_blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    """The blocks of the function's top-level loop nests, in order; empty unless each nest holds one block."""
    _, stmts = _top_level(func)
    found = [_block_of(s) for s in stmts]
    return [b for b in found if b is not None] if all(b is not None for b in found) else []


def replace_stages(func: tirx.PrimFunc, replaced: Sequence[str], stmts: Sequence[tirx.Stmt],
                   allocs: Sequence[BufferVar]) -> tirx.PrimFunc:
    """``func`` with the top-level stages named ``replaced`` (consecutive) swapped for ``stmts``.

    Root allocations no stage uses any more are dropped; ``allocs`` are added.
    """
    root, old = _top_level(func)
    names = [str(_block_of(s).name_hint) for s in old]
    positions = [names.index(n) for n in replaced]
    first, last = min(positions), max(positions)
    if sorted(positions) != list(range(first, last + 1)):
        raise OptionError(f"stages {replaced} are not consecutive in {names}")
    body = list(old[:first]) + list(stmts) + list(old[last + 1:])
    used = [r.source for s in body for r in (*_block_of(s).reads, *_block_of(s).writes)]
    buffers = [b for b in root.alloc_buffers if any(b.same_as(u) for u in used)]
    buffers += [b for b in allocs if not any(b.same_as(kept) for kept in buffers)]
    new_root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt(body), None, alloc_buffers=buffers,
                            annotations=root.annotations)
    return func.with_body(s_tir.SBlockRealize([], True, new_root))
