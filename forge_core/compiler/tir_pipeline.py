"""The TIR lowering of Forge's builds: TVM's default pipeline, with two CPU passes of Forge's around it.

**Small buffers on the stack.**

TVM 0.27's ``LowerTVMBuiltin`` turns every ``local``-scope allocation into a
``TVMBackendAllocWorkspace`` / ``TVMBackendFreeWorkspace`` pair (only
``global``-scope ones under 1 KiB stay stack arrays). A schedule's register
tile (the accumulators of a convolution's output tile, 1.5 KiB) is such an
allocation inside the parallel loop, so every task of every kernel called the
runtime's workspace pool twice, which also zeroed the tile with a ``memset``:
measured on MobileNetV2 (batch 1, 2 threads), 12% of the fp32 time and 18% of
the int8 time.

:func:`keep_small_buffers_on_stack` marks each CPU allocation of a constant
size up to :data:`STACK_LIMIT` bytes with ``disable_lower_builtin``, TVM's own
annotation for an allocation ``LowerTVMBuiltin`` leaves alone; LLVM's code
generator then places it as a stack array in the entry block of its function
(the parallel loop's body is a function of its own). Larger allocations (a
repacked input, a padded feature map) still come from the workspace pool, once
a call. GPU builds are left as they are: their host functions allocate device
buffers.

**Rounding that vectorizes.** ``round`` (ties to even, what ``QuantizeLinear``
and every requantizing epilogue use) is TIR's ``tirx.nearbyint``, and TVM 0.27
registers no ``TVectorizable`` attribute for that one op (``tirx.round``,
``floor``, ``exp`` and the others have it). ``VectorizeLoop`` then turns any
vectorized loop whose body rounds back into a scalar loop, and LLVM's own
vectorizer recovers it only sometimes: a pixel-lane int8 convolution's
epilogue (28x28, 32 to 192 channels) became gathers and byte-by-byte stores
and took 0.076 ms, 0.026 ms once vectorized. :func:`vectorizable_rounding`
rewrites it, on LLVM targets before TVM's passes, as the call TVM's own
lowering makes of it, ``llvm.nearbyint``, through ``call_llvm_pure_intrin``,
which vectorizes. The same instruction runs, so the results are bit-identical.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import compilation_pipeline

from forge_core.passes import replace_functions

PIPELINE = "forge"
STACK_LIMIT = 16 * 1024  # bytes: well inside a worker thread's stack (8 MiB by default on Linux)
_ANNOTATION = "disable_lower_builtin"  # tvm::tirx::transform::kDisableLowerTVMBuiltin


def _allocation_bytes(buffer: tirx.Buffer) -> int | None:
    dtype = tvm.runtime.DataType(buffer.dtype)
    size = dtype.bits // 8 * dtype.lanes
    for dim in buffer.shape:
        if not isinstance(dim, tirx.IntImm):
            return None
        size *= int(dim.value)
    return size


def _on_stack(stmt: tirx.AllocBuffer) -> tirx.AllocBuffer:
    scope = stmt.buffer.scope()
    size = _allocation_bytes(stmt.buffer)
    if not (scope == "global" or scope.startswith("local")) or size is None or not 0 < size <= STACK_LIMIT \
            or _ANNOTATION in stmt.annotations:
        return stmt
    annotations = dict(stmt.annotations)
    annotations[_ANNOTATION] = tirx.IntImm("bool", 1)
    return tirx.AllocBuffer(stmt.buffer, annotations, stmt.span)


def _runs_on_cpu(func: tirx.PrimFunc) -> bool:
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is None or target.get_target_device_type() == tvm_ffi.DLDeviceType.kDLCPU


@tvm.transform.module_pass(opt_level=0, name="forge.KeepSmallBuffersOnStack")
def keep_small_buffers_on_stack(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Mark each CPU function's allocations of at most :data:`STACK_LIMIT` bytes as stack arrays (see the module doc).

    Not in a module with device kernels: there the host functions allocate the kernels' buffers (a recurrent
    kernel's state) for the device, and a stack array handed to a GPU kernel is a host address
    (``cudaErrorIllegalAddress`` on an H200).
    """
    funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    if not all(_runs_on_cpu(func) for _, func in funcs):
        return mod
    updated = {}
    for gv, func in funcs:
        body = tvm_ffi.structural_map(func.body, [(tirx.AllocBuffer, _on_stack)])
        if not body.same_as(func.body):
            updated[gv] = func.with_body(body)
    return replace_functions(mod, updated)


def _llvm_nearbyint(call: tvm.ir.expr.Call) -> tvm.ir.expr.Expr:
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.nearbyint"):
        return call
    return tirx.call_llvm_pure_intrin(str(call.ty.dtype), "llvm.nearbyint", *call.args)


@tirx.transform.prim_func_pass(opt_level=0, name="forge.VectorizableRounding")
def vectorizable_rounding(func: tirx.PrimFunc, _mod: tvm.IRModule,
                          _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Write an LLVM function's ``tirx.nearbyint`` calls as ``llvm.nearbyint``, which vectorizes (see the module doc)."""
    target = func.attrs.get("target") if func.attrs is not None else None
    if target is None or target.kind.name != "llvm":
        return func
    body = tvm_ffi.structural_map(func.body, [(tvm.ir.expr.Call, _llvm_nearbyint)])
    return func if body.same_as(func.body) else func.with_body(body)


def _forge_pipeline():  # noqa: ANN202 - TVM's (pipeline, finalize host, finalize device) triple
    pipeline, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("default")
    passes = [vectorizable_rounding, pipeline, keep_small_buffers_on_stack]
    return tvm.transform.Sequential(passes), finalize_host, finalize_device


def tir_pipeline() -> str:
    """The name of Forge's TIR pipeline for ``tvm.compile(..., tir_pipeline=...)``, registered on first use."""
    if PIPELINE not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(PIPELINE, _forge_pipeline)
    return PIPELINE
