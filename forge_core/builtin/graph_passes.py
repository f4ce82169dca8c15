"""Built-in plugin: the graph-level passes ``compile()`` runs before lowering.

``compile()`` asks for them by name (``forge_core.compiler.pipeline.prepare_graph``),
so each also runs alone through ``ir.apply_pass(name, **options)``:

* ``lower_quantized``: a quantized module's QDQ convolutions and dense layers as
  uint8 x int8 -> int32 operators with a fused requantizing epilogue (every opt_level;
  :mod:`forge_core.quantization.lowering`);
* ``decompose_for_inference``: batch and layer norms into arithmetic (opt_level 3);
* ``set_channel_layout``: convolutions to ``layout="first"`` (NCHW) or ``"last"`` (NHWC);
* ``set_float16``: float16 storage with float32 accumulation; inputs and outputs stay float32, and so do
  values past float16's range (:mod:`forge_core.compiler.float16_range`);
* ``simplify``: constant folding, common-subexpression and dead-code elimination (opt_level 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax import dpl

from forge_core.compiler.options import CHANNEL_LAYOUTS
from forge_core.errors import OptionError
from forge_core.hookspecs import hookimpl
from forge_core.ir.constant_arithmetic import fold_constant
from forge_core.passes import PassContext, canonicalize_bindings, keeping_match_casts, rewrite_functions

logger = logging.getLogger("forge.quantization")

# TVM legalizes conv2d_transpose only as NCHW data with an IOHW (input-channels-first) kernel:
# under either channel layout it keeps that form, and ConvertLayout transposes around it.
_FIXED_LAYOUTS = {"relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


def _run(mod: tvm.IRModule, context: PassContext, passes: list[tvm.transform.Pass]) -> tvm.IRModule:
    with tvm.transform.PassContext(opt_level=int(context.options.get("opt_level", 3))):
        return tvm.transform.Sequential(passes)(mod)


def lower_quantized(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Compute quantized convolutions and dense layers in integers (uint8 x int8 -> int32), requantizing once.

    Only where the CPU has an integer multiply-add faster than float32: a byte dot product (x86 VNNI or
    AVX-VNNI, Arm ``+dotprod``), or x86 AVX2 / AVX-512 without VNNI, whose kernels widen the operands to
    int16 pairs for ``vpmaddwd`` (:mod:`forge_core.schedules.int8`). Without one (x86 before AVX2, Arm
    without ``+dotprod``), integer kernels run slower than float32 (plain int32 multiply-adds: MobileNetV2
    int8 23.9 ms against float32 12.7 ms on a Zen 1 before the AVX2 kernels), so the quantized operators
    compute in float from their dequantized weights, the fake-quantized reference's numbers, and the compile
    log says so (``float_quantized``).
    """
    from forge_core.quantization.lowering import INT8_LOWERING_ENV, float_quantized, int8_lowering, lower_to_integer
    from forge_core.schedules.int8 import dot_product

    target = context.target
    choice = int8_lowering()
    found = dot_product(target) if target is not None else None
    without_dot = target is not None and target.kind.name == "llvm" and found is None
    if choice == "float" or (choice == "auto" and without_dot):
        return float_quantized(mod, target, reason="asked" if choice == "float" else None)
    if without_dot:
        logger.info("int8: integer kernels without a byte dot product, as %s=integer asks", INT8_LOWERING_ENV)
    if found is None:
        return lower_to_integer(mod)
    return lower_to_integer(mod, data_dtype=found.data_dtype, weight_dtype=found.weight)


def decompose_for_inference(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Decompose batch and layer norms into arithmetic that fuses with its neighbours."""
    return canonicalize_bindings(_run(mod, context, [relax.transform.DecomposeOpsForInference()]))


def set_channel_layout(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Convert convolutions to ``layout`` "first" (NCHW) or "last" (NHWC); the model's inputs keep theirs."""
    layout = context.options.get("layout")
    if layout not in CHANNEL_LAYOUTS:
        raise OptionError(f"set_channel_layout: layout must be 'first' or 'last', given {layout!r}")
    data_layout, kernel_layout = CHANNEL_LAYOUTS[layout]
    desired = {"relax.nn.conv2d": [data_layout, kernel_layout], **_FIXED_LAYOUTS}
    return _run(mod, context, [relax.transform.ConvertLayout(desired)])


def set_float16(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Store in float16 and accumulate in float32 where the operator permits; values past float16's range
    (measured on the CPU on random inputs) stay in float32, named in the log."""
    from forge_core.compiler.float16_range import convert_keeping_range

    def convert(module: tvm.IRModule) -> tvm.IRModule:
        module = keeping_match_casts(module, relax.transform.ConvertToDataflow())
        return _run(module, context, [relax.transform.ToMixedPrecision(out_dtype="float32")])

    return convert_keeping_range(_clip_as_min_max(mod), convert, context.params)


def _clip_as_min_max(mod: tvm.IRModule) -> tvm.IRModule:
    """``clip(x, low, high)`` with constant bounds as ``maximum(minimum(x, high), low)`` (TOPI's clip, exactly).

    TVM's ``ToMixedPrecision`` stops on an argument that is not a tensor ("Expected TensorType, but got
    T.int64"): every model with a HardSwish, a HardSigmoid or a ReLU6 imported as ``clip`` (MobileNetV3, DBNet)
    failed ``set_float16``. As a minimum and a maximum the clip stays in float16 with its neighbours.
    """
    pattern = dpl.is_op("relax.clip")(dpl.wildcard(), dpl.wildcard(), dpl.wildcard())

    def rewrite(expr: relax.Expr, _matches: dict) -> relax.Expr:
        data, low, high = expr.args
        bounds = (low, high)
        dtype = getattr(data.ty, "dtype", None)
        if not all(isinstance(b, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) for b in bounds) or dtype is None:
            return expr  # symbolic bounds: kept in float32 (forge_core.compiler.float16_range)
        low_value, high_value = (relax.const(float(b.value), str(dtype)) for b in bounds)
        return relax.op.maximum(relax.op.minimum(data, high_value), low_value)

    return rewrite_functions(mod, pattern, rewrite)


def simplify(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    """Fold constants, then eliminate common subexpressions and dead code."""
    with tvm.transform.PassContext(opt_level=int(context.options.get("opt_level", 3))):
        mod = fold_constant(mod)
    return _run(mod, context, [relax.transform.EliminateCommonSubexpr(), relax.transform.DeadCodeElimination(["main"])])


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    for transform in (lower_quantized, decompose_for_inference, set_channel_layout, set_float16, simplify):
        register(transform.__name__, transform, stage="optimize", description=transform.__doc__.splitlines()[0])
