"""The passes ``compile()`` runs: graph preparation, then TVM's build by target.

Graph preparation (Forge):
    bind ``params`` as constants; names made C identifiers (every target); a quantized module's QDQ operators into
    integer ones (``lower_quantized``); ``opt_level >= 3``: the ``remove_dropout``
    pass, decompose inference ops (batch norm, layer norm...) and canonicalize
    bindings; channel layout
    conversion; float16 conversion; ``opt_level >= 2``: constant folding,
    common-subexpression and dead-code elimination; ``opt_level >= 3``: the
    ``fast_math`` pass (vectorizable exp/erf/tanh, a few ulps); ``opt_level 4``:
    LLVM fast-math flags.
Build (TVM's per-target stages):
    library dispatch, legalization and fusion (fusion from ``opt_level >= 1``),
    schedules (GPU: TVM's dlight rules), dataflow lowering, memory planning;
    TVM's TIR lowering with small CPU buffers on the stack
    (:mod:`forge_core.compiler.tir_pipeline`).
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import tvm
from tvm import relax

from forge_core.compiler.c_names import plain_names
from forge_core.compiler.run_checks import portable_run_checks
from forge_core.compiler.options import CompileOptions
from forge_core.compiler.legal_layouts import LegalLayouts
from forge_core.ir.index_checks import ClampedTakes
from forge_core import passes as forge_passes  # forge_passes.PassContext: a plugin pass's; tvm.transform.PassContext: TVM's
from forge_core.quantization.expand import ExpandQuantize
from forge_core.plugin_manager import get_plugin_manager, schedule_passes
from forge_core.compiler.metadata_builder import record_schedules, schedules_entry
from forge_core.compiler.tir_pipeline import tir_pipeline
from forge_core.schedules.apply import FALLBACK_RULES, fold_repacked_weights, log_fallbacks, schedule_report
from forge_core.schedules.gpu import gpu_legalize_passes
from forge_core.schedules.verify import take_failure, verification_enabled, verify_schedules

logger = logging.getLogger("forge.compile")

def prepare_graph(mod: tvm.IRModule, options: CompileOptions, target: tvm.target.Target | None = None) -> tvm.IRModule:
    """Forge's graph-level transforms, ``params`` already bound: registered passes, run by name.

    ``target``: what the module is compiled for (the integer lowering picks its activation dtype by it).
    Partitions for an external code generator (TensorRT) go to it first
    (:mod:`forge_core.compiler.external`).
    """
    from forge_core.compiler.external import run_external_codegens

    # C identifiers before any pass builds a PrimFunc from the bindings (fast_math's kernels take their names)
    mod = plain_names(run_external_codegens(mod))
    names: list[str] = ["lower_quantized"]
    if options.opt_level >= 3:
        names += ["remove_dropout", "decompose_for_inference"]
    if options.set_channel_layout is not None:
        names.append("set_channel_layout")
    if options.set_float16:
        names.append("set_float16")
    if options.opt_level >= 2:
        names.append("simplify")
    if options.opt_level >= 3:
        names.append("fast_math")
    context = forge_passes.PassContext(target=target,
                          options={"opt_level": options.opt_level, "layout": options.set_channel_layout})
    return forge_passes.run_passes(mod, names, context)


_BACKENDS = {"llvm": "cpu_generic", "cuda": "cuda", "rocm": "rocm"}


def _backend_stages(target: tvm.target.Target) -> ModuleType:
    """TVM's per-backend stage lists (``tvm.relax.pipeline``'s dispatch misses the dataflow stage)."""
    name = _BACKENDS.get(target.kind.name, "gpu_generic")
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


def _legalize_passes(target: tvm.target.Target, opt_level: int) -> list[tvm.transform.Pass]:
    # quantize saturates as ONNX's QuantizeLinear, NaN to the lowest value (forge_core.quantization.expand)
    before = [ExpandQuantize, LegalLayouts, ClampedTakes]
    if target.kind.name != "llvm":
        return [*before, *gpu_legalize_passes()]  # GPU: TVM's dlight schedules
    passes = [*before, relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()]
    if opt_level >= 2:
        passes.append(relax.transform.FoldConstant())
    return passes + [relax.transform.FuseOps(), relax.transform.FuseTIR()]


def lowering_passes(target: tvm.target.Target, opt_level: int) -> list[tvm.transform.Pass]:
    """Library dispatch, legalization and fusion: the module's PrimFuncs as schedules (and tuning) see them."""
    return list(_backend_stages(target).library_dispatch_passes(target)) + _legalize_passes(target, opt_level)


def lower_to_tir(mod: tvm.IRModule, target: tvm.target.Target, opt_level: int) -> tvm.IRModule:
    """``mod`` after :func:`lowering_passes`: fused, unscheduled PrimFuncs (what tuning extracts)."""
    with tvm.transform.PassContext(opt_level=opt_level), target:
        return tvm.transform.Sequential(lowering_passes(target, opt_level))(mod)


def schedule_stage(target: tvm.target.Target, opt_level: int, *, tuning_database: Path | None = None,
                   schedules: dict[str, Any] | None = None) -> tvm.transform.Pass:
    """Tuned schedules from ``tuning_database``, then the registered ``schedule`` passes.

    Every registered ``schedule`` pass that applies to the target (its
    ``targets``) and the module (its ``function_attrs``) runs, by ``order``
    then name (:func:`forge_core.plugin_manager.schedule_passes`): Forge's
    ``cpu_default_schedules`` has order 100, so a plugin's pass of the default
    order 0 sees the kernels first. Each pass
    schedules the PrimFuncs it recognises and leaves the others for the next;
    the compile log then says which functions fell back. In verification mode
    (:mod:`forge_core.schedules.verify`) every function a pass or a tuning
    record rewrote is checked against its unscheduled form. Last, the weight
    repacking stages the schedules marked run once, at compile time.

    Which rule scheduled each kernel, and which kernels fell back, goes into
    the metadata document the module carries (its ``schedules`` entry, which
    ``forge run --profile`` reads) and, when given, into ``schedules``.
    """
    specs = schedule_passes(get_plugin_manager().passes().values())
    context = forge_passes.PassContext(target=target, options={"opt_level": opt_level})

    @tvm.transform.module_pass(opt_level=0, name="forge_schedules")
    def _stage(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        verify = verification_enabled()
        if tuning_database is not None:
            from forge_core.tuning.database import TUNED_RULE, apply_database

            before, mod = mod, apply_database(mod, target, tuning_database)
            if verify:
                verify_schedules(before, mod, target, TUNED_RULE)
        for spec in specs:
            if not spec.applies_to(mod, target):
                continue
            logger.debug("schedule pass %s (plugin %s)", spec.name, spec.plugin)
            before, mod = mod, spec.transform(mod, context)
            if verify:
                verify_schedules(before, mod, target, f"schedule pass {spec.name!r} of plugin {spec.plugin!r}")
        mod = fold_repacked_weights(mod)
        report = schedule_report(mod)
        log_fallbacks(report)
        entry = schedules_entry(report, (*FALLBACK_RULES, "unscheduled"))
        if schedules is not None:
            schedules.update(entry)
        return record_schedules(mod, entry)

    return _stage


def build_pipeline(target: tvm.target.Target, opt_level: int, *, tuning_database: Path | None = None,
                   schedules: dict[str, Any] | None = None) -> tvm.transform.Pass:
    """TVM's build for ``target``, with Forge's legalization, fusion and schedules."""

    @tvm.transform.module_pass(opt_level=0, name="forge_build")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        stages_of = _backend_stages(target)
        with target:
            stages = (
                lowering_passes(target, opt_level)
                + [schedule_stage(target, opt_level, tuning_database=tuning_database, schedules=schedules)]
                + list(stages_of.dataflow_lower_passes(target))
                + list(stages_of.finalize_passes(target))
            )
            return tvm.transform.Sequential(stages)(mod)

    return _pipeline


FAST_MATH_FLAGS = ("fast-math-reassoc", "fast-math-contract", "fast-math-arcp", "fast-math-nsz")


def with_fast_math(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with LLVM's value-safe fast-math flags on (opt_level 4, CPU targets).

    Reassociation, contraction (FMA), reciprocal approximation and ignoring the
    sign of zero: results may differ in the last bits. Not ``nnan``/``ninf``
    (what plain ``fast-math`` adds): under them LLVM may assume no infinity
    ever appears, and a sigmoid whose ``exp`` overflows (a large negative input,
    or float16 beyond 11) became NaN; the fuzzer found it.
    """
    if target.kind.name != "llvm":
        return target
    from forge_core.targets.parsing import target_config

    config = target_config(target)
    config.update({flag: True for flag in FAST_MATH_FLAGS})
    return tvm.target.Target(config)


def build(mod: tvm.IRModule, target: tvm.target.Target, opt_level: int, *,
          tuning_database: Path | None = None, schedules: dict[str, Any] | None = None) -> relax.VMExecutable:
    """Lower and build ``mod`` into a VM executable, with tuned schedules from ``tuning_database``.

    ``schedules``, when given, receives the metadata's ``schedules`` entry (see :func:`schedule_stage`).
    """
    if opt_level >= 4:
        target = with_fast_math(target)
    with tvm.transform.PassContext(opt_level=opt_level):
        pipeline = build_pipeline(target, opt_level, tuning_database=tuning_database, schedules=schedules)
        take_failure()
        mod = portable_run_checks(mod)
        try:
            return tvm.compile(mod, target=target, relax_pipeline=pipeline, tir_pipeline=tir_pipeline())
        except Exception:
            failure = take_failure()  # TVM's pass infrastructure re-raises it as another type
            if failure is not None:
                raise failure from None
            raise
