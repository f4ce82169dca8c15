"""Built-in plugin: the passes an IRModule runs on import.

* ``fold_constants``: evaluate every subexpression whose inputs are all constants.
* ``fold_batch_norms``: fold inference-mode batch norms into the preceding
  convolution's weights and bias when that convolution's weights are constant;
  a batch norm that cannot be folded (weights held in ``params``, or no
  convolution before it) is rewritten as the equivalent scale-and-shift
  arithmetic, so no ``nn.batch_norm`` remains either way.
* ``inline_partitions``: inline the functions that a partitioner (e.g. for
  TensorRT) split out of ``main`` back into it.
"""

from __future__ import annotations

import tvm
from tvm import relax

from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext


def fold_constants(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    return relax.transform.FoldConstant()(mod)


def fold_batch_norms(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
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
