"""Kernels over dynamic rows (a batch and a sequence), scheduled as a static kernel of a block of rows.

A transformer exported with a dynamic batch and sequence (``input_ids: [batch,
sequence]``, as Hugging Face ships them) has kernels whose dynamic dims lead
every batched buffer: a dense layer reads ``[b, s, 384]`` and writes ``[b, s,
1536]``. When each row (one position of those leading dims) is computed from
that row alone, the rows are independent and contiguous in memory: the kernel
is specialized to a block of :data:`BLOCK_ROWS` rows, scheduled by the rules as
a static kernel, and run on each block of the ``R = b * s`` rows through buffer
views. Block ``i`` starts at ``min(i * BLOCK_ROWS, R - BLOCK_ROWS)``: the rows
left over (``R % BLOCK_ROWS``) run as a last block ending at the last row,
overlapping the one before (a row computed twice gets the same values: no
block reads what it writes), and one copy of the kernel serves every block;
fewer rows than a block are copied into a zeroed block-sized scratch,
computed there, and copied back. Stages that
touch no row (a rule's weight repacking) run once, before the loop.

This generalizes :mod:`forge_core.schedules.batch_loop` (one batch item, one
dynamic dim) to a prefix of dynamic dims whose items are rows; the batch loop
stays the choice where the batch is the only dynamic dim. A function without that form (a dim reduced over,
moved, broadcast, an index that reads another row, a row's position used as
a value, a buffer both read and overwritten) is left to the rules' symbolic
path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from forge_core.schedules.batch_loop import (_bound_vars, _contains, _is_static, _needs_alignment, _symbolic_vars,
                                             _touched, dims_as_values, only_as_leading_indices, split_stages)
from forge_core.schedules.rewrite import substitute

ROW_BLOCKS_ATTR = "forge.row_blocks"
"""Set on a function scheduled by row blocks; its value names the dynamic dims of the rows (``"b,s"``)."""

BLOCK_ROWS = 16
"""Rows a block: a whole AVX2 or AVX-512 matmul tile (8, 4 or 16 rows), and at most 15 rows computed twice."""


def _is_one(dim: object) -> bool:
    return isinstance(dim, (int, tirx.IntImm)) and int(dim) == 1


def _same_dim(a: object, b: object) -> bool:
    if isinstance(a, tirx.Var) or isinstance(b, tirx.Var):
        return isinstance(a, tirx.Var) and isinstance(b, tirx.Var) and a.same_as(b)
    return int(a) == int(b)


def _prefix_of(dims: list[object]) -> list[object] | None:
    """The leading dims through the last dynamic one, when each is a variable or 1 and the rest static; else None."""
    last = max(i for i, d in enumerate(dims) if not _is_static([d]))
    prefix = dims[:last + 1]
    if not all(isinstance(d, tirx.Var) or _is_one(d) for d in prefix) or not _is_static(dims[last + 1:]):
        return None
    return prefix


def row_prefix(func: tirx.PrimFunc) -> list[object] | None:
    """The dims whose positions are ``func``'s independent rows (``[b, s]``, ``[1, s]``), or None.

    Every parameter is a buffer, static or with the same leading dims (each a
    variable or 1; the variables the function's only symbolic dims) followed by
    static ones; intermediate buffers too. Every block that touches such a
    buffer ("batched") reads and writes one element of each leading axis of
    each, the same block iterator per variable axis for all of them, over the
    whole ``[0, dim)``; that iterator appears nowhere else in the block (not
    in another index, a value, a static buffer's index), and no block computes
    with a dim itself (:func:`dims_as_values`); a block that touches
    batched buffers writes only batched buffers; and no batched buffer is read
    before a block overwrites it (an in-place kernel: a row computed twice
    would read its own output).
    """
    prefix: list[object] | None = None
    batched: list[object] = []
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    if root is None:
        return None
    for buffer in [*func.params, *root.alloc_buffers]:
        shape = getattr(getattr(buffer, "ty", None), "shape", None)
        if shape is None:
            return None  # a scalar parameter (an extent passed as an argument)
        dims = list(shape)
        if _is_static(dims):
            continue
        own = _prefix_of(dims)
        if own is None:
            return None
        if prefix is None:
            prefix = own
        elif len(own) != len(prefix) or not all(_same_dim(a, b) for a, b in zip(own, prefix)):
            return None
        batched.append(buffer)
    if prefix is None or not any(isinstance(d, tirx.Var) for d in prefix):
        return None
    variables = [i for i, d in enumerate(prefix) if isinstance(d, tirx.Var)]
    if len({prefix[i].__chandle__() for i in variables}) != len(variables):
        # One dim twice, [s, s] (T5's relative positions): binding it to a block's rows binds both axes, and a
        # block of 16 rows would be read as 16 x 16 (past the buffer's end).
        return None
    ok = True

    def check(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        nonlocal ok
        block = realize.block
        if not ok or block.name_hint == "root":
            return realize
        regions = [*block.reads, *block.writes]
        touched = [r for r in regions if _contains(batched, r.source)]
        if not touched:
            return realize
        if any(not _contains(batched, r.source) for r in block.writes):
            ok = False  # a row's stage writing a buffer of no row: the blocks would overwrite each other
            return realize
        iterators = {iv.var.__chandle__(): iv for iv in block.iter_vars}
        rows: dict[int, tirx.Var] = {}
        for region in touched:
            for axis in range(len(prefix)):
                extent = region.region[axis].extent
                if not (isinstance(extent, (int, tirx.IntImm)) and int(extent) == 1):
                    ok = False
                    return realize
                if axis not in variables:
                    continue
                index = region.region[axis].min
                if not (isinstance(index, tirx.Var) and index.__chandle__() in iterators):
                    ok = False
                    return realize
                if rows.setdefault(axis, index).__chandle__() != index.__chandle__():
                    ok = False
                    return realize
        for axis, var in rows.items():
            iv = iterators[var.__chandle__()]
            if not (iv.iter_type == tirx.IterVar.DataPar and _is_static([iv.dom.min]) and int(iv.dom.min) == 0
                    and isinstance(iv.dom.extent, tirx.Var) and iv.dom.extent.same_as(prefix[axis])):
                ok = False
                return realize
        if len({v.__chandle__() for v in rows.values()}) != len(rows):
            ok = False  # one iterator for two dims: a diagonal
            return realize
        row_vars = list(rows.values())
        if row_vars and not only_as_leading_indices(realize, batched, len(prefix), row_vars):
            ok = False
            return realize
        return realize

    tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, check)])
    if not ok:
        return None
    if _reads_then_overwrites(func, batched):
        return None
    bound = _bound_vars(func.body)
    dims = [d for d in prefix if isinstance(d, tirx.Var)]
    if any(not any(v.same_as(d) for d in dims) for v in _symbolic_vars(func.body) if v.__chandle__() not in bound):
        return None
    if dims_as_values(func, dims):
        return None
    return prefix


def _is_param(func: tirx.PrimFunc, buffer: object) -> bool:
    return any(buffer.same_as(p) for p in func.params)


def _reads_then_overwrites(func: tirx.PrimFunc, batched: list[object]) -> bool:
    """Whether a batched parameter is read (its values on entry) by a stage before a later stage writes it."""
    read_first: list[object] = []
    written: list[object] = []

    def visit(block: s_tir.SBlock) -> s_tir.SBlock:
        if block.name_hint == "root":
            return block
        own = [w.source for w in block.writes]
        for region in block.reads:
            buffer = region.source
            accumulates = block.init is not None and _contains(own, buffer)
            if _contains(batched, buffer) and _is_param(func, buffer) and not accumulates \
                    and not _contains(written, buffer):
                read_first.append(buffer)
        written.extend(own)
        return block

    tvm_ffi.structural_map(func.body, [(s_tir.SBlock, visit)])
    return any(_contains(read_first, b) for b in written)


def bind_rows(func: tirx.PrimFunc, sizes: dict[str, int], *, scalars: bool = False) -> dict[object, object]:
    """Each parameter with dynamic dims -> a buffer of the same type with those dims bound (``{"s": 7}``; a dim
    that is an expression of them evaluated), for ``func.specialize``; with ``scalars``, each integer scalar
    parameter named in ``sizes`` (a dim passed by value: ``shape_to_tensor``'s) -> its value too."""
    analyzer = Analyzer()
    bound = {}
    plain = {str(d.name) for param in func.params for d in list(getattr(param.ty, "shape", None) or ())
             if isinstance(d, tirx.Var)}
    if scalars:
        for param in scalar_params(func):
            plain.add(str(param.name))
            if str(param.name) in sizes:
                bound[param] = tirx.IntImm(str(param.ty.dtype), sizes[str(param.name)])
    for param in func.params:
        dims = list(getattr(param.ty, "shape", None) or ())
        if not dims or _is_static(dims):
            continue
        if any(not isinstance(d, (tirx.Var, tirx.IntImm)) for d in dims) \
                and all(str(v.name) in plain for d in dims for v in _symbolic_vars(d)):
            continue  # a dim computed from others (a strided output's): TVM's specialize binds only variables,
            # and rewrites this buffer's shape from the others' bindings
        values = [(v, tirx.IntImm(str(v.ty), sizes[str(v.name)])) for d in dims for v in _symbolic_vars(d)]
        static = [analyzer.simplify(substitute(d, values)) if values else d for d in dims]
        bound[param] = tirx.decl_buffer(static, str(param.ty.dtype), str(param.name))
    return bound


def scalar_params(func: tirx.PrimFunc) -> list[tirx.Var]:
    """``func``'s integer parameters passed by value (not buffers)."""
    return [p for p in func.params if isinstance(p.ty, tvm.ir.PrimType) and str(p.ty.dtype).startswith(("int", "uint"))]


def dim_names(func: tirx.PrimFunc) -> list[str]:
    """The names of the symbolic dims of ``func``'s parameters, in order of first appearance."""
    names: list[str] = []
    for param in func.params:
        for dim in list(getattr(param.ty, "shape", None) or ()):
            names.extend(str(v.name) for v in _symbolic_vars(dim) if str(v.name) not in names)
    return names


def per_row_block(func: tirx.PrimFunc, schedule: Callable[[tirx.PrimFunc], tirx.PrimFunc | None],
                  rows: int = BLOCK_ROWS) -> tirx.PrimFunc | None:
    """``func`` scheduled as ``schedule`` schedules its ``rows``-row form, on every block of rows; or None.

    None when ``func`` has no row prefix of the form :func:`row_prefix` requires,
    or ``schedule`` declines the block's form.
    """
    prefix = row_prefix(func)
    if prefix is None:
        return None
    variables = [d for d in prefix if isinstance(d, tirx.Var)]
    block_sizes = {str(v.name): 1 for v in variables}
    block_sizes[str(variables[-1].name)] = rows
    single = bind_rows(func, block_sizes)
    scheduled = schedule(func.specialize(single))
    if scheduled is None or len(scheduled.params) != len(func.params):
        return None
    if not isinstance(scheduled.body, s_tir.SBlockRealize):
        return None
    index_type = str(variables[0].ty)

    def index(value: int) -> tirx.IntImm:
        return tirx.IntImm(index_type, value)

    total = variables[0]
    for var in variables[1:]:
        total = total * var
    batched = [i for i, param in enumerate(func.params) if param in single]
    written = _written_params(scheduled, batched)
    layout: dict[int, tuple[list[object], str, int, int]] = {}
    for i in batched:
        inner = scheduled.params[i]
        dims = list(inner.ty.shape)
        dtype = str(inner.ty.dtype)
        row = math.prod(int(d) for d in dims[len(prefix):])
        # A block of rows starts at any row: the buffer's alignment (64 bytes) and a multiple of a row's bytes.
        alignment = math.gcd(int(func.params[i].ty.data_alignment), row * max(1, tvm.DataType(dtype).bits // 8))
        if _needs_alignment(scheduled.body, inner) > alignment:
            return None  # a tensorized stage matches the buffer with more alignment than every block has
        layout[i] = (dims, dtype, row, alignment)

    first = scheduled
    first_root = first.body.block
    hoisted, _ = split_stages(first_root, [first.params[i] for i in batched])
    # The scratch block is read and written as itself, never through a view: TVM's storage planning tracks an
    # allocation's lifetime by its own accesses, and reused a scratch buffer that only views read.
    scratch = {i: tirx.decl_buffer(layout[i][0], layout[i][1], f"{func.params[i].name}_rows") for i in batched}

    def copy_of_body(start: tirx.PrimExpr | None) -> tirx.Stmt:
        """The looped stages of a fresh copy of the scheduled block, on views of the parameters from row
        ``start``, or on the scratch block when ``start`` is None."""
        copy = s_tir.renew_defs(scheduled)
        root = copy.body.block
        _, looped = split_stages(root, [copy.params[i] for i in batched])
        pairs: list[tuple[object, object]] = []
        views: list[tirx.Stmt] = []
        for i, (param, inner) in enumerate(zip(func.params, copy.params)):
            if i not in layout:
                pairs.append((inner, param))
                continue
            if start is None:
                pairs.append((inner, scratch[i]))
                continue
            dims, dtype, row, alignment = layout[i]
            view = tirx.decl_buffer(dims, dtype, str(inner.name), elem_offset=start * index(row),
                                    data_alignment=alignment, offset_factor=1)
            views.append(tirx.DeclBuffer(view, data=tirx.buffer_data(param)))
            pairs.append((inner, view))
        pairs.extend(zip(root.alloc_buffers, first_root.alloc_buffers))  # one set of intermediates, and of weights
        body = substitute(tirx.SeqStmt(looped) if len(looped) > 1 else looped[0], pairs)
        return tirx.SeqStmt([*views, body]) if views else body

    # Each block starts at min(block * rows, total - rows): the last one ends at the last row, overlapping the
    # block before when the rows are no multiple of a block; one copy of the kernel for all of them.
    block_index = tirx.Var("row_block", index_type)
    start = tirx.Var("row_start", index_type)
    main = tirx.For(block_index, index(0), tirx.floordiv(total + index(rows - 1), index(rows)), tirx.ForKind.SERIAL,
                    tirx.SeqStmt([tirx.LetStmt(start, tirx.Min(block_index * index(rows), total - index(rows))),
                                  copy_of_body(start)]))
    scheduled_reads, _ = _touched(scheduled.body)  # one walk for every batched parameter
    copies_in = [_copy(func.params[i], scratch[i], total * index(layout[i][2]), True)
                 for i in batched if i not in written or _contains(scheduled_reads, scheduled.params[i])]
    copies_out = [_copy(func.params[i], scratch[i], total * index(layout[i][2]), False) for i in written]
    padded = tirx.SeqStmt([*copies_in, copy_of_body(None), *copies_out])
    blocked = tirx.IfThenElse(total >= index(rows), main, padded)
    new_root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt([*hoisted, blocked]) if hoisted else blocked, None,
                            alloc_buffers=[*first_root.alloc_buffers, *scratch.values()],
                            annotations=first_root.annotations)
    wrapped = tirx.PrimFunc(list(func.params), s_tir.SBlockRealize([], True, new_root), scheduled.ret_type,
                            scheduled.attrs)
    return wrapped.with_attr(ROW_BLOCKS_ATTR, ",".join(str(v.name) for v in variables))


def _written_params(func: tirx.PrimFunc, indices: list[int]) -> list[int]:
    _, writes = _touched(func.body)
    return [i for i in indices if _contains(writes, func.params[i])]


def _copy(param: object, scratch: object, count: tirx.PrimExpr, into_scratch: bool) -> tirx.Stmt:
    """Copy the first ``count`` elements of ``param`` into the static ``scratch`` (zeros after them: an index
    read from the rows beyond stays in bounds), or back from it."""
    flat = tirx.decl_buffer([count], str(param.ty.dtype), f"{param.name}_flat")
    dims = [int(d) for d in scratch.ty.shape]
    index_type = str(count.ty)
    i = tirx.Var("i", index_type)
    position: list[tirx.PrimExpr] = []
    rest = i
    for extent in reversed(dims):
        position.insert(0, tirx.floormod(rest, tirx.IntImm(index_type, extent)))
        rest = tirx.floordiv(rest, tirx.IntImm(index_type, extent))
    if into_scratch:
        value = tirx.if_then_else(i < count, tirx.BufferLoad(flat, [i]), tirx.const(0, str(param.ty.dtype)))
        body = tirx.For(i, tirx.IntImm(index_type, 0), tirx.IntImm(index_type, math.prod(dims)), tirx.ForKind.SERIAL,
                        tirx.BufferStore(scratch, value, position))
    else:
        body = tirx.For(i, tirx.IntImm(index_type, 0), count, tirx.ForKind.SERIAL,
                        tirx.BufferStore(flat, tirx.BufferLoad(scratch, position), [i]))
    return tirx.SeqStmt([tirx.DeclBuffer(flat, data=tirx.buffer_data(param)), body])
