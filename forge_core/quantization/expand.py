"""``relax.quantize`` as arithmetic that saturates as ONNX defines it, NaN included.

ONNX's ``QuantizeLinear`` (its reference implementation, and onnxruntime)
saturates to the integer type's range and sends NaN to the lowest value. A
NaN is what a model quantized with an infinite range computes: a transformer
whose attention mask holds ``-inf`` gets the scale ``inf`` from onnxruntime's
calibration, and ``-inf / inf`` is NaN, so the mask must quantize to -128 to
come back as ``-inf``.

TVM legalizes ``quantize`` with ``max(min(v, qmax), qmin)``, and its LLVM code
gives ``qmax`` for NaN: a masked attention score comes back as ``+inf``. Here
each ``quantize`` becomes ``minimum(maximum(round(x / s) + z, qmin), qmax)``,
whose first comparison already takes ``qmin`` for NaN, before TVM legalizes
it; finite values quantize exactly as before. :func:`saturate` is the same
clamp for the integer lowering's own requantizing epilogues.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from forge_core.passes import rewrite_functions


_INTEGER_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32"})


def saturate(value: relax.Expr, low: float, high: float) -> relax.Expr:
    """``value`` clamped to ``[low, high]``, NaN to ``low`` (the lower bound is compared first)."""
    return relax.op.minimum(relax.op.maximum(value, relax.const(np.float32(low))), relax.const(np.float32(high)))


def _along(param: relax.Expr, axis: int, ndim: int) -> relax.Expr:
    """A quantization parameter shaped to broadcast: a per-channel vector along ``axis``, a scalar as it is."""
    shape = param.ty.shape
    if shape is None or len(shape.values) == 0 or ndim <= 1:
        return param
    dims = [1] * ndim
    dims[axis % ndim] = -1
    return relax.op.reshape(param, dims)


def _expand(call: relax.Call) -> relax.Expr:
    data, scale, zero_point = call.args
    dtype, ndim = str(call.attrs.out_dtype), data.ty.ndim
    if dtype not in _INTEGER_DTYPES or ndim < 0 or str(data.ty.dtype) != "float32":
        return call  # TVM's legalization (float8 and 4-bit types, float16 data)
    info = np.iinfo(dtype)
    axis = int(call.attrs.axis)
    scaled = relax.op.divide(data, _along(scale, axis, ndim))
    shifted = relax.op.add(relax.op.round(scaled), relax.op.astype(_along(zero_point, axis, ndim), "float32"))
    return relax.op.astype(saturate(shifted, float(info.min), float(info.max)), dtype)


def expand_quantize(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each float32 ``relax.quantize`` to an integer type as saturating arithmetic (module doc)."""
    pattern = is_op("relax.quantize")(wildcard(), wildcard(), wildcard())
    # Not dpl.rewrite_call: it canonicalizes every function's bindings, which drops the match_cast that ties a
    # dynamic dim to one named earlier (a loop body's Concat of its carried value and a scanned slice then lost
    # its shape, and the inference function could not be built).
    return rewrite_functions(mod, pattern, lambda call, _matches: _expand(call))


@tvm.transform.module_pass(opt_level=0, name="forge_expand_quantize")
def ExpandQuantize(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 (TVM's style)
    """:func:`expand_quantize` as a TVM pass."""
    return expand_quantize(mod)
