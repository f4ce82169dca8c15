"""Built-in plugin: the passes an IRModule runs on import.

* ``fold_constants``: evaluate every subexpression whose inputs are all constants.
* ``fold_batch_norms``: fold inference-mode batch norms into the preceding
  convolution's weights and bias (with or without a bias add between them)
  when that convolution's weights are constant;
  a batch norm that cannot be folded (weights held in ``params``, or no
  convolution before it) is rewritten as the equivalent scale-and-shift
  arithmetic, so no ``nn.batch_norm`` remains either way.
* ``inline_partitions``: inline the functions that a partitioner (e.g. for
  TensorRT) split out of ``main`` back into it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import dpl

from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext, rewrite_functions


def fold_constants(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    return relax.transform.FoldConstant()(mod)


def _conv_bias_batch_norm_pattern() -> tuple[dpl.DFPattern, dict[str, dpl.DFPattern]]:
    parts = {
        "data": dpl.wildcard(),
        "weight": dpl.is_const(),
        "bias": dpl.is_const(),
        "gamma": dpl.is_const(),
        "beta": dpl.is_const(),
        "mean": dpl.is_const(),
        "var": dpl.is_const(),
    }
    conv = dpl.is_op("relax.nn.conv2d")(parts["data"], parts["weight"])
    parts["conv"] = conv
    biased = dpl.is_op("relax.add")(conv, parts["bias"])
    norm = dpl.is_op("relax.nn.batch_norm")(biased, parts["gamma"], parts["beta"], parts["mean"], parts["var"])
    parts["norm"] = norm
    return dpl.is_tuple_get_item(norm, 0), parts


def _fold_conv_bias_batch_norm(mod: tvm.IRModule) -> tvm.IRModule:
    """``batch_norm(conv2d(x, W) + b)`` with constant W, b and statistics -> ``conv2d(x, W') + b'``.

    TVM's FoldBatchnormToConv2D only folds a batch norm right after the
    convolution; convolutions with a bias (PyTorch's default) put an add between.
    """
    pattern, parts = _conv_bias_batch_norm_pattern()

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        conv, norm = matches[parts["conv"]], matches[parts["norm"]]
        if (conv.attrs.data_layout, conv.attrs.kernel_layout, int(norm.attrs.axis)) != ("NCHW", "OIHW", 1):
            return expr
        weight = matches[parts["weight"]].value.numpy()
        bias = matches[parts["bias"]].value.numpy()
        channels = weight.shape[0]
        if bias.size != channels:
            return expr
        gamma, beta, mean, var = (matches[parts[k]].value.numpy() for k in ("gamma", "beta", "mean", "var"))
        scale = (gamma if norm.attrs.scale else np.ones_like(gamma)) / np.sqrt(var + float(norm.attrs.epsilon))
        shift = beta if norm.attrs.center else np.zeros_like(beta)
        new_weight = (weight * scale.reshape(-1, 1, 1, 1)).astype(weight.dtype)
        new_bias = ((bias.reshape(-1) - mean) * scale + shift).astype(bias.dtype).reshape(bias.shape)
        folded = relax.Call(conv.op, [matches[parts["data"]], relax.const(new_weight)], conv.attrs)
        return relax.op.add(folded, relax.const(new_bias))

    return rewrite_functions(mod, pattern, rewrite)


def fold_batch_norms(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    mod = _fold_conv_bias_batch_norm(mod)
    mod = relax.transform.FoldBatchnormToConv2D()(mod)
    # Whatever batch norm is left becomes scale/shift arithmetic.
    mod = relax.transform.DecomposeOpsForInference()(mod)
    return relax.transform.FoldConstant()(mod)


def _is_partition(func: tvm.ir.BaseFunc) -> bool:
    attrs = func.attrs
    return isinstance(func, relax.Function) and attrs is not None and ("Codegen" in attrs or "Composite" in attrs)


def inline_partitions(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    partitions = {gv: func for gv, func in mod.functions.items() if _is_partition(func)}
    if not partitions:
        return mod
    # A partition's body may call composite functions bound locally; drop the
    # attributes that mark them as external so that they inline like any function.
    plain = {
        gv: func.without_attr("Codegen").without_attr("global_symbol").without_attr("Primitive")
        for gv, func in partitions.items()
    }
    updated = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in partitions}, attrs=mod.attrs)
    for gv, func in list(updated.functions.items()):
        if isinstance(func, relax.Function):
            updated[gv] = func.inline_functions(plain)
    updated = relax.transform.Normalize()(updated)
    updated = relax.transform.DeadCodeElimination()(updated)
    return updated


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
