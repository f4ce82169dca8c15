"""``partition_for_tensorrt``: TVM's TensorRT patterns, and the four flags of the docs as Forge passes.

TVM 0.27 ships the Relax pattern table of its TensorRT bridge
(``tvm.relax.backend.contrib.tensorrt``: one composite per supported operator,
then ``FuseOpsByPattern`` and ``MergeCompositeFunctions``), with no flags.
Forge runs its flags around it:

* ``remove_stacks`` (before): ``stack(xs, axis)`` has no TensorRT pattern; it
  becomes ``concat([expand_dims(x, axis) for x in xs], axis)``, which has.
* ``simplify_batch_matmul`` (before): a "static" batch matmul, whose second
  operand is a constant with unit batch dimensions (``[1, .., K, N]``),
  becomes one 2-D matmul: ``reshape(matmul(reshape(x, [-1, K]), W[K, N]),
  [.., M, N])``, the fully connected form TensorRT takes best.
* ``simplify_scalar_add`` (before): ``x + c`` with a scalar (or one-element)
  constant ``c`` of lower rank gets ``c`` as a tensor of ``x``'s rank
  (``[1, .., 1]``, broadcast): the bridge takes no scalar operand in an
  elementwise layer, where TensorRT needs equal ranks.
* ``remove_no_mac_subgraphs`` (after): a partition holding no
  multiply-accumulate operator (convolution, transposed convolution,
  matmul) is not worth a TensorRT engine and its copies at the boundary; it is
  inlined back into ``main``.

Dropout, an identity at inference that TensorRT drops too, is removed first
(Forge's ``remove_dropout``): left in, it split AlexNet, VGG, SqueezeNet
and Inception v1 into two or three partitions each.

Each flag is also a registered pass of its own (``tensorrt_remove_stacks``...)
that ``ir.apply_pass`` runs alone. Partitions are named ``tensorrt_0``,
``tensorrt_1``... in the order ``main`` calls them, carry ``Codegen:
"tensorrt"``, and keep the composite functions of TVM's bridge inside.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from forge_core.builtin.folding_passes import inline_partitions_where
from forge_core.compiler.run_checks import with_check_messages, without_check_messages
from forge_core.errors import ModelStateError, OptionError
from forge_core.ir.introspection import static_shape
from forge_core.passes import PassContext, rewrite_functions, run_passes

CODEGEN = "tensorrt"
MAC_OPS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv1d_transpose",
                     "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose", "relax.matmul"})
FLAGS = ("remove_stacks", "simplify_batch_matmul", "simplify_scalar_add", "remove_no_mac_subgraphs")


def _constant(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _ndim(expr: relax.Expr) -> int:
    return int(getattr(expr.ty, "ndim", -1))


def remove_stacks(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """``stack(xs, axis)`` -> ``concat([expand_dims(x, axis) ...], axis)``."""

    pattern = is_op("relax.stack")(wildcard())

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        call = matches[pattern]
        items = call.args[0]
        fields = (list(items.fields) if isinstance(items, relax.Tuple)
                  else [relax.TupleGetItem(items, i) for i in range(len(items.ty.fields))])
        rank = _ndim(fields[0]) if isinstance(fields[0], relax.Expr) and _ndim(fields[0]) >= 0 else None
        axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
        if rank is None:
            return expr
        axis = axis % (rank + 1)
        return relax.op.concat([relax.op.expand_dims(f, axis) for f in fields], axis)

    return rewrite_functions(mod, pattern, rewrite)


def simplify_batch_matmul(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """``matmul(x, W[1, .., K, N])`` with ``W`` constant -> a 2-D matmul between reshapes."""
    pattern = is_op("relax.matmul")(wildcard(), is_const())

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        call = matches[pattern]
        data, weight = call.args
        w_shape, x_shape = static_shape(weight), static_shape(data)
        if w_shape is None or x_shape is None or len(w_shape) < 3 or any(d != 1 for d in w_shape[:-2]):
            return expr
        if len(x_shape) < 2:
            return expr
        k, n = w_shape[-2:]
        values = _constant(weight).reshape(k, n)
        w2d = relax.const(values, str(values.dtype))
        flat = relax.op.reshape(data, [int(np.prod(x_shape[:-1])), k])
        product = relax.op.matmul(flat, w2d, out_dtype=call.attrs.out_dtype)
        return relax.op.reshape(product, [*x_shape[:-1], n])

    return rewrite_functions(mod, pattern, rewrite)


def simplify_scalar_add(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """``x + c`` (either order) with a one-element constant ``c`` of lower rank -> ``c`` shaped ``[1] * rank(x)``."""
    pattern = is_op("relax.add")(wildcard(), wildcard())

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        lhs, rhs = matches[pattern].args
        for tensor, scalar, scalar_first in ((lhs, rhs, False), (rhs, lhs, True)):
            value = _constant(scalar)
            if value is None or _constant(tensor) is not None:
                continue
            rank = _ndim(tensor)
            if value.size != 1 or rank <= value.ndim:
                continue
            widened = relax.const(value.reshape([1] * rank), str(value.dtype))
            return relax.op.add(widened, tensor) if scalar_first else relax.op.add(tensor, widened)
        return expr

    return rewrite_functions(mod, pattern, rewrite)


def _holds_mac(func: relax.Function) -> bool:
    """Whether ``func`` (the composite functions inside it included) calls a convolution or matmul."""
    found = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in MAC_OPS:
            found.append(expr)

    relax.analysis.post_order_visit(func.body, visit)  # it enters the local functions too
    return bool(found)


def _is_tensorrt_partition(func: relax.Function) -> bool:
    return func.attrs is not None and func.attrs.get("Codegen") == CODEGEN


def remove_no_mac_subgraphs(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Inline the TensorRT partitions that hold no convolution or matmul back into ``main``."""
    return _renamed(inline_partitions_where(
        mod, lambda gv, func: _is_tensorrt_partition(func) and not _holds_mac(func)))


def _call_order(mod: tvm.IRModule) -> list[str]:
    order: list[str] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar) and expr.op.name_hint not in order:
            order.append(expr.op.name_hint)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return order


def _renamed(mod: tvm.IRModule) -> tvm.IRModule:
    """The TensorRT partitions named ``tensorrt_<i>`` in the order main calls them."""
    partitions = {gv.name_hint: gv for gv, f in mod.functions.items()
                  if isinstance(f, relax.Function) and _is_tensorrt_partition(f)}
    if not partitions:
        return mod
    order = [name for name in _call_order(mod) if name in partitions]
    order += sorted(set(partitions) - set(order))
    wanted = {name: f"{CODEGEN}_{index}" for index, name in enumerate(order)}
    if all(old == new for old, new in wanted.items()):
        return mod
    result = tvm.IRModule(attrs=mod.attrs)
    for gv, func in mod.functions.items():
        name = wanted.get(gv.name_hint, gv.name_hint)
        result[name] = func.with_attr("global_symbol", name) if gv.name_hint in wanted else func
    mapping = {partitions[old]: result.get_global_var(new) for old, new in wanted.items()}
    for old, new in mapping.items():
        relax.expr._update_type(new, old.ty)  # a GlobalVar gets its type from the module's pass, not from Add
    for gv, func in list(result.functions.items()):
        if isinstance(func, relax.Function):
            result[gv] = _swap_calls(func, mapping)
    return result


def _swap_calls(func: relax.Function, mapping: dict[tvm.ir.GlobalVar, tvm.ir.GlobalVar]) -> relax.Function:
    @relax.expr_functor.mutator
    class Swap(relax.PyExprMutator):
        def visit_global_var_(self, op: tvm.ir.GlobalVar) -> relax.Expr:  # noqa: N802 - TVM's visitor name
            return mapping.get(op, op)

    return Swap().visit_expr(func)


def partition_for_tensorrt(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """The flags before, TVM's TensorRT partitioning, then ``remove_no_mac_subgraphs``; options are the flags.

    Raises ``ModelStateError`` for a module that holds TensorRT partitions
    already, ``OptionError`` for a flag that is not a bool or not a flag.
    """
    from tvm.relax.backend.contrib import tensorrt  # registers the pattern table

    unknown = sorted(set(context.options) - set(FLAGS))
    if unknown:
        raise OptionError(f"partition_for_tensorrt takes the flags {', '.join(FLAGS)}; given {', '.join(unknown)}")
    for flag in FLAGS:
        value = context.options.get(flag, True)
        if not isinstance(value, bool):
            raise OptionError(f"{flag} must be True or False, given {value!r}")
    if any(_is_tensorrt_partition(func) for func in mod.functions.values() if isinstance(func, relax.Function)):
        raise ModelStateError("The module is partitioned for TensorRT already; call inline_partitions() first")
    options = {flag: bool(context.options.get(flag, True)) for flag in FLAGS}
    mod = run_passes(mod, ["remove_dropout"], context)  # inference: dropout would split partitions
    for flag, run in (("remove_stacks", remove_stacks), ("simplify_batch_matmul", simplify_batch_matmul),
                      ("simplify_scalar_add", simplify_scalar_add)):
        if options[flag]:
            mod = run(mod, context)
    mod, messages = without_check_messages(mod)  # TVM's partitioner cannot visit a check's message string
    mod = with_check_messages(_renamed(tensorrt.partition_for_tensorrt(mod)), messages)
    if options["remove_no_mac_subgraphs"]:
        mod = remove_no_mac_subgraphs(mod, context)
    return mod


def inline_tensorrt_partitions(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Every partition of ``mod`` and the composites inside it inlined where ``main`` calls them.

    The same computation as the partitioned module (alias bindings removed).
    ``IRModule.inline_partitions()`` restores the exact module from before
    ``partition_for_tensorrt`` instead, when nothing changed in between.
    """
    return inline_partitions_where(mod, lambda gv, func: True)
