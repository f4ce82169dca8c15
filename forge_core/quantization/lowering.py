"""From QDQ to integer arithmetic: the quantized convolutions and dense layers as uint8 x int8 -> int32 operators.

``quantize()`` leaves a module in QDQ form: every quantized operator reads
``dequantize(x_q)`` and ``dequantize(w_q)`` and computes in float. This pass
rewrites each such operator into integer arithmetic that gives the same
values, for kernels that use the CPU's byte dot products (x86 VNNI's
``vpdpbusd``: uint8 x int8 -> int32):

* **Activations as uint8.** An int8 activation ``q = clip(round(x/s) + z,
  -128, 127)`` equals the uint8 ``clip(round(x/s) + z + 128, 0, 255)`` minus
  128, so every activation ``quantize``/``dequantize`` pair whose quantized
  tensor feeds only ``dequantize`` is moved to uint8 with zero point ``z+128``:
  the same values, and VNNI's unsigned operand. Between layers the tensor
  stays 8-bit.
* **Weights as int8 with zero point 0.** Forge's weights are symmetric (int8:
  zero point 0; uint8: 128, shifted to int8 exactly), and so are
  onnxruntime's (``quantize_static``), whose QDQ models keep their integer
  weights through import (:mod:`forge_core.quantization.held_weights`). An
  operator whose weight has another zero point is left in float, its weight
  dequantized here, once.
* **The zero point folded out of the loop.** With ``u`` the uint8 input,
  ``z`` its zero point and ``w`` the weight::

      sum((u - z) * w) = sum(u * w) - z * sum(w)

  ``sum(w)`` is a per-output-channel constant computed here, and the int32
  bias (static quantization, scale ``s_x * s_w``, zero point 0) joins it:
  ``acc = conv(u, w) + (b - z * sum(w))``. Padding is explicit, with the value
  ``z`` (the quantized 0), so the border terms cancel too.
* **Dequantized once, in the epilogue.** ``acc`` is converted with the
  per-channel multiplier ``s_x * s_w``; the activation, the residual add and
  the next layer's ``quantize`` follow as elementwise operators, which fusion
  puts in the same kernel: the requantization epilogue.

On Arm with ``+dotprod`` (``sdot``: int8 x int8) activations stay int8
and the same rewrite applies with the int8 zero point.

Input channels are padded to a multiple of 4 (zero weights), the unit of
the byte dot product. Dynamic quantization (zero point and scale computed at
run time) lowers the same way, the compensation then computed at run time;
convolutions with padding need a constant zero point and stay in float.

Lowered: conv2d with groups=1 in NCHW/OIHW, and matmul with a constant
two-dimensional right-hand side. Depthwise and grouped convolutions have no
channel reduction for the byte dot products: they compute in float but read
the uint8 activation itself, the input scale folded into their weight and
the zero point's term into their bias (:meth:`_Lowering.rewrite_grouped_conv2d`),
so the layer before writes bytes, not floats. Everything else keeps its QDQ
form, which is always correct.

Last, :func:`fold_requantize` shortens each requantizing epilogue: the
activation's clamp (ReLU, ReLU6) joins the final clamp and the next layer's
reciprocal scale joins the multiplier before it. The final clamp compares
with the lower bound first, so NaN requantizes to 0, as ONNX's
``QuantizeLinear`` does (:mod:`forge_core.quantization.expand`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_core.graph.index import _handle
from forge_core.ir.introspection import static_shape
from forge_core.quantization.expand import saturate
from forge_core.quantization.held_weights import fold_dequantized_constants, is_dequantized_constant
from forge_core.quantization.held_weights import op_name as _op_name
from forge_core.transforms.rebind import Emit, rebind

logger = logging.getLogger("forge.quantization")

# The reduction unit of the byte dot products (VNNI and Arm's sdot/udot: 4 bytes per lane).
DOT_UNIT = 4


@dataclass
class _Activation:
    """A quantized activation as the integer operators read it: the uint8 tensor and its parameters."""

    quantized: relax.Expr  # uint8 (int8 for Arm's sdot)
    scale: relax.Expr
    zero_point: relax.Expr  # of the same dtype


def _constant(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


@dataclass
class _Bindings:
    """A function's dataflow, by variable handle: each bound value, the variable of each call, each reader."""

    value_of: dict[int, relax.Expr]
    var_of: dict[int, relax.Var]
    uses: dict[int, list[relax.Expr]]


def _bindings(func: relax.Function) -> _Bindings:
    found = _Bindings({}, {}, {})
    for block in func.body.blocks:
        for binding in block.bindings:
            found.value_of[_handle(binding.var)] = binding.value
            if isinstance(binding.value, relax.Call):
                found.var_of[_handle(binding.value)] = binding.var
            for arg in _operands(binding.value):
                found.uses.setdefault(_handle(arg), []).append(binding.value)
    for out in _operands(func.body.body):
        found.uses.setdefault(_handle(out), []).append(func.body.body)
    return found


class _Lowering:
    def __init__(self, func: relax.Function, data_dtype: str, weight_dtype: str = "int8") -> None:
        self.data_dtype = data_dtype
        self.weight_dtype = weight_dtype
        index = _bindings(func)
        self.value_of, self.var_of, self.uses = index.value_of, index.var_of, index.uses
        self.moved: dict[int, tuple[relax.Expr, relax.Expr]] = {}  # old quantize var -> (new scale, new zero point)
        self.activations: dict[int, _Activation] = {}  # old dequantize var -> the integer operand
        self.folded_bias: set[int] = set()  # old bias-add calls whose bias went into the accumulator
        self.lowered = 0
        self.grouped = 0  # depthwise and grouped convolutions reading 8-bit activations

    def bound(self, expr: relax.Expr) -> relax.Expr | None:
        return self.value_of.get(_handle(expr)) if isinstance(expr, relax.Var) else None

    # -- activations ---------------------------------------------------------------------------------------
    def movable(self, call: relax.Call) -> bool:
        """An int8 activation quantize whose result only feeds dequantize (so its dtype may change)."""
        var = self.var_of.get(_handle(call))
        if self.data_dtype != "uint8" or var is None or str(call.attrs.out_dtype) != "int8" \
                or isinstance(call.args[0], tvm.ir.GenericConst):
            return False
        readers = self.uses.get(_handle(var), [])
        return bool(readers) and all(_op_name(r) == "relax.dequantize" for r in readers)

    def shifted_zero_point(self, zero_point: relax.Expr, emit: Emit) -> relax.Expr:
        value = _constant(zero_point)
        if value is not None:
            return relax.const((value.astype(np.int32) + 128).astype(np.uint8), "uint8")
        widened = relax.op.add(relax.op.astype(zero_point, "int32"), relax.const(128, "int32"))
        return emit(relax.op.astype(widened, "uint8"), "zero_point_u8")

    def rewrite_quantize(self, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
        if not self.movable(call):
            return None
        zero_point = self.shifted_zero_point(args[2], emit)
        self.moved[_handle(self.var_of[_handle(call)])] = (args[1], zero_point)
        scale, offset = _constant(args[1]), _constant(zero_point)
        if scale is None or offset is None or scale.ndim != 0:
            return relax.op.quantize(args[0], args[1], zero_point, axis=int(call.attrs.axis), out_dtype="uint8")
        # relax.quantize divides by the scale; the requantizing epilogue multiplies by its reciprocal.
        reciprocal = relax.const(np.float32(1.0) / scale.astype(np.float32), "float32")
        shifted = relax.op.add(relax.op.round(relax.op.multiply(args[0], reciprocal)),
                               relax.const(np.float32(offset), "float32"))
        return relax.op.astype(saturate(shifted, 0, 255), "uint8")

    def rewrite_dequantize(self, call: relax.Call, args: list[relax.Expr]) -> relax.Expr | None:
        source = call.args[0]
        var = self.var_of.get(_handle(call))
        moved = self.moved.get(_handle(source))
        if moved is not None:
            scale, zero_point = moved
            if var is not None:
                self.activations[_handle(var)] = _Activation(args[0], scale, zero_point)
            return relax.op.dequantize(args[0], scale, zero_point, axis=int(call.attrs.axis), out_dtype="float32")
        if var is not None and _op_name(self.bound(source)) == "relax.quantize" and _dtype(args[0]) == self.data_dtype \
                and static_shape(args[1]) == [] and static_shape(args[2]) == []:
            self.activations[_handle(var)] = _Activation(args[0], args[1], args[2])
        return None

    # -- weights and bias ----------------------------------------------------------------------------------
    def weight(self, expr: relax.Expr) -> tuple[np.ndarray, np.ndarray, int | None] | None:
        """The int8 weight, its scale(s) and per-channel axis, from ``dequantize(const, const, const)``,
        or from a two-dimensional one transposed (``permute_dims``: ONNX ``Gemm`` with ``transB``)."""
        call = self.bound(expr)
        if _op_name(call) == "relax.permute_dims":
            found = self.weight(call.args[0])
            axes = call.attrs.axes
            if found is None or found[0].ndim != 2 or (axes is not None and [int(a) for a in axes] != [1, 0]):
                return None
            values, scale, axis = found
            return np.ascontiguousarray(values.T), scale, None if axis is None else 1 - axis
        if _op_name(call) != "relax.dequantize":
            return None
        values, scale, zero_point = (_constant(a) for a in call.args)
        if values is None or scale is None or zero_point is None:
            return None
        values = values.astype(np.int32) - zero_point.astype(np.int32).reshape(
            [-1 if d == int(call.attrs.axis) % values.ndim else 1 for d in range(values.ndim)]
            if zero_point.ndim == 1 else [])
        if values.min(initial=0) < -128 or values.max(initial=0) > 127:
            return None  # an asymmetric weight: not representable as int8 with zero point 0
        axis = int(call.attrs.axis) % values.ndim if scale.ndim == 1 else None
        return values.astype(np.int8), scale.astype(np.float32), axis

    def bias_add(self, call: relax.Call, channels: int) -> np.ndarray | None:
        """The int32 bias of the one ``add(call, dequantize(int32 const))`` reading ``call``, per channel."""
        var = self.var_of.get(_handle(call))
        readers = self.uses.get(_handle(var), []) if var is not None else []
        if len(readers) != 1 or _op_name(readers[0]) != "relax.add":
            return None
        add = readers[0]
        bias = self.bound(add.args[1])
        if not add.args[0].same_as(var) or _op_name(bias) != "relax.dequantize":
            return None
        values, _, zero_point = (_constant(a) for a in bias.args)
        if values is None or values.dtype != np.int32 or zero_point is None or np.any(zero_point != 0) \
                or values.size != channels:
            return None
        self.folded_bias.add(_handle(add))
        return values.reshape(-1).astype(np.int64)

    # -- operators -----------------------------------------------------------------------------------------
    def rewrite_conv2d(self, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
        attrs = call.attrs
        activation = self.activations.get(_handle(call.args[0]))
        weight = self.weight(call.args[1])
        if activation is None or weight is None or str(attrs.data_layout) != "NCHW" \
                or str(attrs.kernel_layout) != "OIHW" or str(attrs.out_layout) != "NCHW":
            return None
        values, weight_scale, axis = weight
        if axis not in (None, 0) or static_shape(args[0]) is None:
            return None
        if int(attrs.groups) != 1:
            return self.rewrite_grouped_conv2d(call, activation, weight, emit)
        padding = [int(p) for p in attrs.padding]
        zero_point = _constant(activation.zero_point)
        if any(padding) and zero_point is None:
            return None  # explicit padding needs a constant value
        data = activation.quantized
        extra = (-values.shape[1]) % DOT_UNIT
        if any(padding) or extra:
            top, left, bottom, right = padding
            pad_value = float(zero_point) if zero_point is not None else 0.0
            data = emit(relax.op.nn.pad(data, [0, 0, 0, extra, top, bottom, left, right], pad_value=pad_value),
                        "data_padded")
        if extra:
            values = np.pad(values, [(0, 0), (0, extra), (0, 0), (0, 0)])
        accumulated = emit(relax.op.nn.conv2d(data, relax.const(values.astype(self.weight_dtype)),
                                              strides=attrs.strides,
                                              padding=0, dilation=attrs.dilation,
                                              out_dtype="int32"), "conv2d_int32")
        channels = values.shape[0]
        return self.epilogue(call, accumulated, activation, values.reshape(channels, -1).sum(axis=1),
                             weight_scale, [channels, 1, 1], emit)

    def rewrite_grouped_conv2d(self, call: relax.Call, activation: _Activation,
                               weight: tuple[np.ndarray, np.ndarray, int | None], emit: Emit) -> relax.Expr | None:
        """A depthwise or grouped convolution reading the 8-bit activation itself, in float.

        ``conv(s_x (u - z), s_w w) = conv(u, s_x s_w w) - z sum(s_x s_w w)``: the
        weight, dequantized and multiplied by the input scale at compile time,
        multiplies the uint8 input converted in the kernel; the zero point's
        term and the bias are one per-channel constant. The kernel then reads
        one byte an element, not four, and the layer before writes bytes
        (its ``dequantize`` is gone). Padding is explicit, with the value ``z``,
        unless ``z`` is 0 (the convolution's own zero padding is then exact).
        Needs a constant scalar scale and zero point.
        """
        attrs = call.attrs
        scale, zero_point = _constant(activation.scale), _constant(activation.zero_point)
        values, weight_scale, _ = weight
        if scale is None or zero_point is None or scale.ndim or zero_point.ndim:
            return None
        channels = values.shape[0]
        multiplier = np.broadcast_to(weight_scale.astype(np.float64), (channels,)) * float(scale)  # s_x s_w
        folded = (values.astype(np.float64) * multiplier.reshape(channels, 1, 1, 1)).astype(np.float32)
        data, padding = activation.quantized, [int(p) for p in attrs.padding]
        if any(padding) and int(zero_point) != 0:
            top, left, bottom, right = padding
            data = emit(relax.op.nn.pad(data, [0, 0, 0, 0, top, bottom, left, right],
                                        pad_value=float(zero_point)), "data_padded")
            padding = [0, 0, 0, 0]
        out = emit(relax.op.nn.conv2d(data, relax.const(folded, "float32"), strides=attrs.strides, padding=padding,
                                      dilation=attrs.dilation, groups=int(attrs.groups), out_dtype="float32"),
                   "grouped_conv2d_u8")
        offset = -float(zero_point) * folded.astype(np.float64).reshape(channels, -1).sum(axis=1)
        bias = self.bias_add(call, channels)
        if bias is not None:
            offset = offset + bias.astype(np.float64) * multiplier
        self.grouped += 1
        if bias is None and int(zero_point) == 0:
            return out
        return relax.op.add(out, relax.const(offset.astype(np.float32).reshape(channels, 1, 1), "float32"))

    def rewrite_matmul(self, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
        activation = self.activations.get(_handle(call.args[0]))
        weight = self.weight(call.args[1])
        if activation is None or weight is None:
            return None
        values, weight_scale, axis = weight
        if values.ndim != 2 or axis not in (None, 1):
            return None
        accumulated = emit(relax.op.matmul(activation.quantized, relax.const(values.astype(self.weight_dtype)),
                                           out_dtype="int32"), "matmul_int32")
        return self.epilogue(call, accumulated, activation, values.astype(np.int64).sum(axis=0), weight_scale,
                             [values.shape[1]], emit)

    def epilogue(self, call: relax.Call, accumulated: relax.Expr, activation: _Activation, weight_sums: np.ndarray,
                 weight_scale: np.ndarray, channel_shape: list[int], emit: Emit) -> relax.Expr:
        """``(acc + bias - z * sum(w)) * s_x * s_w`` in float, for the fused epilogue."""
        channels = channel_shape[0]
        bias = self.bias_add(call, channels)
        zero_point = _constant(activation.zero_point)
        weight_sums = weight_sums.astype(np.int64)
        if zero_point is not None:
            offset = (bias if bias is not None else 0) - int(zero_point) * weight_sums
            offset_const = relax.const(offset.astype(np.int32).reshape(channel_shape), "int32")
            accumulated = emit(relax.op.add(accumulated, offset_const), "accumulated")
        else:
            zp = relax.op.astype(activation.zero_point, "int32")
            correction = relax.op.multiply(zp, relax.const((-weight_sums).astype(np.int32).reshape(channel_shape)))
            if bias is not None:
                correction = relax.op.add(correction, relax.const(bias.astype(np.int32).reshape(channel_shape)))
            accumulated = emit(relax.op.add(accumulated, correction), "accumulated")
        weight_scale = np.broadcast_to(weight_scale, (channels,)).reshape(channel_shape).astype(np.float32)
        input_scale = _constant(activation.scale)
        if input_scale is not None and input_scale.ndim == 0:  # one constant, for fold_requantize
            scale = relax.const((input_scale.astype(np.float32) * weight_scale).astype(np.float32), "float32")
        else:
            scale = relax.op.multiply(activation.scale, relax.const(weight_scale, "float32"))
        self.lowered += 1
        return relax.op.multiply(relax.op.astype(accumulated, "float32"), scale)

    def rewrite(self) -> Any:
        def rewrite_call(_binding: str, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
            name = _op_name(call)
            if name == "relax.quantize":
                return self.rewrite_quantize(call, args, emit)
            if name == "relax.dequantize":
                return self.rewrite_dequantize(call, args)
            if name == "relax.nn.conv2d":
                return self.rewrite_conv2d(call, args, emit)
            if name == "relax.matmul":
                return self.rewrite_matmul(call, args, emit)
            if name == "relax.add" and _handle(call) in self.folded_bias:
                return args[0]  # the bias is in the accumulator
            return None

        return rewrite_call


def _operands(expr: relax.Expr) -> list[relax.Expr]:
    if isinstance(expr, relax.Call):
        found = []
        for arg in expr.args:
            found.extend(_operands(arg) if isinstance(arg, relax.Tuple) else [arg])
        return [a for a in found if isinstance(a, relax.Var)]
    if isinstance(expr, relax.Tuple):
        return [f for f in expr.fields if isinstance(f, relax.Var)]
    if isinstance(expr, relax.TupleGetItem):
        return [expr.tuple_value] if isinstance(expr.tuple_value, relax.Var) else []
    return [expr] if isinstance(expr, relax.Var) else []


def _quantized(mod: tvm.IRModule, func_name: str) -> bool:
    """Whether ``func_name`` is a Relax function holding a ``dequantize`` (a QDQ operator to lower)."""
    func = mod[func_name]
    return isinstance(func, relax.Function) and any(
        _op_name(b.value) == "relax.dequantize" for block in func.body.blocks for b in block.bindings)


def lower_to_integer(mod: tvm.IRModule, func_name: str = "main", data_dtype: str = "uint8",
                     weight_dtype: str = "int8") -> tvm.IRModule:
    """``mod`` with ``func_name``'s QDQ convolutions and dense layers computed in integers (see the module doc).

    ``data_dtype`` is the activations' dtype in the integer operators: ``"uint8"`` (x86 VNNI's unsigned
    operand; int8 activations move to it) or ``"int8"`` (Arm's ``sdot``; uint8 activations stay float).
    ``weight_dtype`` is the dtype the int8 weight values are held in: ``"int8"``, or ``"int16"`` for x86
    without VNNI, whose ``vpmaddwd`` kernels read int16 pairs (the same values; the constants are repacked
    at compile time either way, so the artifact holds the packed weights in the dtype the kernels read).
    """
    if not _quantized(mod, func_name):
        return mod
    func = mod[func_name]
    lowering = _Lowering(func, data_dtype, weight_dtype)
    rewritten = rebind(mod, func_name, rewrite_call=lowering.rewrite())
    if lowering.lowered == 0 and lowering.grouped == 0:
        return _fold_weights(mod, func_name)
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated[func_name] = rewritten
    updated = relax.transform.DeadCodeElimination([func_name])(updated)
    updated[func_name] = fold_requantize(updated[func_name])
    updated = relax.transform.DeadCodeElimination([func_name])(updated)
    updated = _fold_weights(updated, func_name)
    logger.info("integer lowering: %d quantized operator(s) computed as %s x int8 -> int32, %d grouped "
                "convolution(s) reading %s", lowering.lowered, data_dtype, lowering.grouped, data_dtype)
    return updated


INT8_LOWERING_ENV = "FORGE_INT8_LOWERING"
"""``auto`` (default): integer kernels where the CPU target has a byte dot product or AVX2, else float32;
``integer``: integer kernels on every target (bit-exact integer sums, slower than float32 without a dot
product); ``float``: float32 everywhere."""


def int8_lowering() -> str:
    """What ``FORGE_INT8_LOWERING`` asks: ``"auto"``, ``"integer"`` or ``"float"``."""
    from forge_core.errors import OptionError

    value = os.environ.get(INT8_LOWERING_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "integer", "float"):
        raise OptionError(f"{INT8_LOWERING_ENV} must be auto, integer or float, given {value!r}")
    return value


def float_quantized(mod: tvm.IRModule, target: tvm.target.Target | None, func_name: str = "main",
                    reason: str | None = None) -> tvm.IRModule:
    """``mod`` with its QDQ operators left to compute in float, each weight dequantized once: for a CPU target
    with no byte dot product and no AVX2, or where ``reason`` says it was asked; the compile log says so when the module
    holds quantized operators.

    The activations are still quantized and dequantized where the model says (the same numbers as the
    fake-quantized reference); only the multiply-adds run in float32.
    """
    if not _quantized(mod, func_name):
        return mod
    if reason is not None:
        logger.info("int8: the quantized operators compute in float32 from their dequantized weights, as %s=float "
                    "asks", INT8_LOWERING_ENV)
        return _fold_weights(mod, func_name)
    attrs = getattr(target, "attrs", None)
    cpu = str(attrs.get("mcpu", "")) if attrs is not None else ""
    logger.warning(
        "int8: the target (%s) has no byte dot product (x86 AVX-512 VNNI or AVX-VNNI, Arm +dotprod) and no "
        "AVX2, where integer kernels run slower than float32; the quantized operators compute in float32 "
        "from their dequantized weights (the fake-quantized reference's numbers). Compile for such a CPU for "
        "integer kernels: -mcpu=x86-64-v3 (AVX2), alderlake, znver4, cascadelake, or an Arm core with "
        "+dotprod (%s=integer forces integer kernels).", cpu or "llvm", INT8_LOWERING_ENV)
    return _fold_weights(mod, func_name)


def _fold_weights(mod: tvm.IRModule, func_name: str) -> tvm.IRModule:
    """``mod`` with each weight left in QDQ form (an operator not lowered) dequantized now, not at run time."""
    if not any(is_dequantized_constant(b.value) for block in mod[func_name].body.blocks for b in block.bindings):
        return mod

    def rewrite_call(_binding: str, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
        if not is_dequantized_constant(call):
            return None
        values, scale, zero_point = (_constant(a) for a in call.args)
        folded = fold_dequantized_constants(values, scale, zero_point, int(call.attrs.axis),
                                            str(call.attrs.out_dtype))
        return relax.const(folded, str(call.attrs.out_dtype))

    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated[func_name] = rebind(mod, func_name, rewrite_call=rewrite_call)
    return updated


# -- the requantizing epilogue, shortened --------------------------------------------------------------------

def _scalar(expr: relax.Expr) -> float | None:
    value = _constant(expr) if isinstance(expr, tvm.ir.GenericConst) else None
    return float(value) if value is not None and value.size == 1 and value.dtype == np.float32 else None


def _bound_value(expr: relax.Expr, values: dict[int, relax.Expr]) -> relax.Expr:
    """The value bound to ``expr``, through aliases (``a = b``); ``expr`` itself when it is no bound variable."""
    while isinstance(expr, relax.Var) and _handle(expr) in values:
        expr = values[_handle(expr)]
    return expr


def _shared(expr: relax.Expr, values: dict[int, relax.Expr], uses: dict[int, int]) -> bool:
    """Whether ``expr`` or a variable it aliases is read more than once (so its value must stay as it is)."""
    while isinstance(expr, relax.Var):
        if uses.get(_handle(expr), 0) != 1:
            return True
        expr = values.get(_handle(expr))
    return False


def _scaled(expr: relax.Expr, factor: float, values: dict[int, relax.Expr], uses: dict[int, int]) -> relax.Expr | None:
    """``expr * factor`` with the factor folded into a constant of ``expr`` (None when there is none to fold into).

    ``multiply(y, c)`` -> ``multiply(y, c * f)``; ``add(y, b)`` -> ``add(y * f, b * f)``; a float convolution
    with a constant weight -> the weight times ``f``. Only float32 constants; values read by others stay.
    """
    if _shared(expr, values, uses):
        return None
    call = _bound_value(expr, values)
    name, f = _op_name(call), np.float32(factor)
    constant = _constant(call.args[1]) if name and len(call.args) > 1 else None
    if constant is None or constant.dtype != np.float32 or _dtype(call) != "float32":
        return None
    scaled_constant = relax.const((constant * f).astype(np.float32))
    if name == "relax.multiply":
        return relax.op.multiply(call.args[0], scaled_constant)
    if name == "relax.add":
        inner = _scaled(call.args[0], factor, values, uses)
        return None if inner is None else relax.op.add(inner, scaled_constant)
    if name == "relax.nn.conv2d":
        return relax.Call(call.op, [call.args[0], scaled_constant], call.attrs)
    return None


def _clamp(expr: relax.Expr, values: dict[int, relax.Expr], uses: dict[int, int]
           ) -> tuple[relax.Expr, float, float]:
    """``expr`` as ``clamp(inner, lo, hi)``: maximum/minimum with scalar constants, relu, clip; +-inf where absent."""
    lo, hi = -np.inf, np.inf
    while True:
        if _shared(expr, values, uses):
            return expr, lo, hi
        call = _bound_value(expr, values)
        name = _op_name(call)
        if name in ("relax.maximum", "relax.minimum") and _scalar(call.args[1]) is not None:
            bound = _scalar(call.args[1])
            lo, hi = (max(lo, bound), hi) if name == "relax.maximum" else (lo, min(hi, bound))
            expr = call.args[0]
        elif name == "relax.nn.relu":
            lo, expr = max(lo, 0.0), call.args[0]
        elif name == "relax.clip" and all(hasattr(a, "value") for a in call.args[1:]):
            lo, hi = max(lo, float(call.args[1].value)), min(hi, float(call.args[2].value))
            expr = call.args[0]
        else:
            return expr, lo, hi


def fold_requantize(func: relax.Function) -> relax.Function:
    """Shorten each requantizing epilogue: the activation's clamp moves into the final one, the scales into one.

    ``quantize(clamp(y, lo, hi))`` with the reciprocal scale ``r > 0`` and the
    zero point ``z``: ``clamp(round(clamp(y, lo, hi) r) + z, 0, 255)`` is exactly
    ``clamp(round(y r) + z, max(0, round(lo r) + z), min(255, round(hi r) + z))``
    (scaling by ``r > 0`` and rounding are monotonic), and ``y r`` folds ``r``
    into the constant before it: the per-channel multiplier of a lowered
    convolution, or a depthwise convolution's weight and bias. Ten operations
    an element become seven (relu6); the folded product rounds once instead of
    twice, which moves a value lying within an ulp of a rounding tie by one
    step, as the reciprocal already does.
    """
    index = _bindings(func)
    values = index.value_of
    uses = {handle: len(readers) for handle, readers in index.uses.items()}

    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, r, z, low_bound, high_bound = wildcard(), is_const(), is_const(), is_const(), is_const()
    rounded = is_op("relax.round")(is_op("relax.multiply")(x, r))
    clamped = is_op("relax.minimum")(is_op("relax.maximum")(is_op("relax.add")(rounded, z), low_bound), high_bound)
    pattern = is_op("relax.astype")(clamped)

    def rewriter(original: relax.Expr, matched: dict) -> relax.Expr:
        factor, offset = _scalar(matched[r]), _scalar(matched[z])
        if factor is None or offset is None or factor <= 0 or str(original.attrs.dtype) != "uint8" \
                or (_scalar(matched[low_bound]), _scalar(matched[high_bound])) != (0.0, 255.0):
            return original
        inner, lo, hi = _clamp(matched[x], values, uses)
        scaled = _scaled(inner, factor, values, uses)
        if scaled is None:
            return original
        f32 = np.float32
        low = 0 if lo == -np.inf else int(max(0, np.rint(f32(lo) * f32(factor)) + offset))
        high = 255 if hi == np.inf else int(min(255, np.rint(f32(hi) * f32(factor)) + offset))
        if low > high:
            return original
        shifted = relax.op.round(scaled)
        if offset != 0:
            shifted = relax.op.add(shifted, matched[z])
        return relax.op.astype(saturate(shifted, low, high), "uint8")

    return rewrite_call(pattern, rewriter, func)
