"""``IRModule.quantize``: QDQ (``relax.op.quantize``/``dequantize``) around the operators of the plan.

The quantized IR, for the integer lowering to match:

* each quantized activation ``x`` is bound once as ``x_q = quantize(x, s, z)``
  and ``x_dq = dequantize(x_q, s, z)``, and every quantized consumer reads
  ``x_dq`` (static: ``s`` and ``z`` are constants; dynamic: computed from
  ``x``'s extrema at run time, bound as ``x_scale`` and ``x_zero_point``);
* a weight is an integer constant read through ``<op>_weight_dq =
  dequantize(w_q, s_w, z_w, axis)`` (``axis``: the output channels, per-channel);
* a bias, in static quantization, is an int32 constant with scale
  ``s_x * s_w`` and zero point 0, read through ``<op>_bias_dq``; dynamic
  quantization keeps it float (the input scale is known only at run time).

Which node is quantized, and with which parameters, is recorded in
:class:`QuantizationInfo` (``IRModule.quantization_info``, and the compiled
artifact's metadata).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import ModelStateError, OptionError
from forge_core.graph.index import _handle
from forge_core.ir import weights
from forge_core.quantization.calibration_data import CalibrationData
from forge_core.quantization.plan import QuantOp, QuantPlan, build_plan
from forge_core.quantization.ranges import (
    BIAS_DTYPES,
    CALIB_METHODS,
    QUANT_DTYPES,
    QUANT_TYPES,
    QuantParams,
    activation_params,
    activation_range,
    dtype_limits,
    quantize_array,
    weight_params,
)
from forge_core.transforms.rebind import Emit, rebind

if TYPE_CHECKING:
    from forge_core.ir.parts import ModuleParts


@dataclass
class QuantizationInfo:
    """How a module was quantized: the settings, and each quantized operator's parameters.

    ``layers`` maps an operator's output node (its bias add when it has one) to ``{"kind", "inputs": {tensor:
    params}, "weight": params, "bias": params}`` (params as
    :meth:`QuantParams.to_json`; dynamic inputs have no fixed parameters).
    ``reference`` is the float module quantization started from, for the
    layer report.
    """

    activation_dtype: str
    kernel_dtype: str
    bias_dtype: str
    per_channel: bool
    calib_method: str | None
    quant_type: str  # "static" or "dynamic", as resolved
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    reference: ModuleParts | None = None

    def to_json(self) -> dict[str, Any]:
        """The settings and parameters, JSON-ready (the artifact metadata's ``quantization`` entry)."""
        return {"activation_dtype": self.activation_dtype, "kernel_dtype": self.kernel_dtype,
                "bias_dtype": self.bias_dtype, "per_channel": self.per_channel, "calib_method": self.calib_method,
                "quant_type": self.quant_type, "excluded": list(self.excluded), "layers": self.layers}


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise OptionError(f"{name} must be one of {', '.join(map(repr, choices))}; given {value!r}")
    return value


def resolve_settings(activation_dtype: str, kernel_dtype: str | None, bias_dtype: str | None, calib_method: str,
                     quant_type: str, calibrated: bool) -> tuple[str, str, str, str]:
    """Validated dtypes and the resolved quantization type (``"static"`` or ``"dynamic"``).

    ``kernel_dtype`` and ``bias_dtype`` default to ``activation_dtype``, as the
    docs say. Biases are accumulated in int32 whatever ``bias_dtype`` is: an
    8-bit bias at scale ``s_x * s_w`` would overflow, and every integer kernel
    (ONNX's QLinearConv, TFLite, TVM's QNN) adds an int32 bias.
    """
    _check_choice("activation_dtype", activation_dtype, QUANT_DTYPES)
    kernel = _check_choice("kernel_dtype", kernel_dtype if kernel_dtype is not None else activation_dtype, QUANT_DTYPES)
    bias = _check_choice("bias_dtype", bias_dtype if bias_dtype is not None else activation_dtype, BIAS_DTYPES)
    _check_choice("calib_method", calib_method, CALIB_METHODS)
    _check_choice("quant_type", quant_type, QUANT_TYPES)
    if quant_type == "static" and not calibrated:
        raise ModelStateError("quant_type='static' needs calibration data: call calibrate(calib_data) first, "
                              "or use quant_type='dynamic' (or 'any')")
    resolved = "static" if quant_type == "static" or (quant_type == "any" and calibrated) else "dynamic"
    return kernel, bias, resolved, calib_method


def _const(values: Any, dtype: str) -> relax.Constant:
    return relax.const(np.asarray(values).astype(dtype), dtype)


class _Rewriter:
    """Builds the QDQ form of ``main`` through :func:`rebind`."""

    def __init__(self, plan: QuantPlan, params: Mapping[str, Any], info: QuantizationInfo,
                 activation_params_of: Mapping[str, QuantParams]) -> None:
        self.plan = plan
        self.params = params
        self.info = info
        self.static = info.quant_type == "static"
        self.activation_params = activation_params_of
        self.ops = {op.name: op for op in plan.ops}
        self.bias_of = {op.bias: op for op in plan.ops if op.bias is not None}
        self.dequantized: dict[str, relax.Var] = {}
        self.weight_params: dict[str, QuantParams] = {}

    def value_names(self, func: relax.Function) -> dict[int, str]:
        """Call handle -> node name, for every binding of ``func``."""
        names: dict[int, str] = {}
        by_var = self.plan.index.by_var
        for block in func.body.blocks:
            for binding in block.bindings:
                name = by_var.get(_handle(binding.var))
                if name is not None and isinstance(binding.value, relax.Call):
                    names[_handle(binding.value)] = name
        return names

    def activation(self, name: str, value: relax.Expr, emit: Emit) -> relax.Expr:
        if name in self.dequantized:
            return self.dequantized[name]
        dtype = self.info.activation_dtype
        if self.static:
            params = self.activation_params[name]
            scale, zero_point = _const(params.scale, "float32"), _const(params.zero_point, dtype)
        else:
            scale, zero_point = self.runtime_params(name, value, dtype, emit)
        q = emit(relax.op.quantize(value, scale, zero_point, axis=-1, out_dtype=dtype), f"{name}_q")
        dq = emit(relax.op.dequantize(q, scale, zero_point, axis=-1, out_dtype="float32"), f"{name}_dq")
        self.dequantized[name] = dq
        return dq

    def runtime_params(self, name: str, value: relax.Expr, dtype: str, emit: Emit) -> tuple[relax.Expr, relax.Expr]:
        """Scale and zero point from ``value``'s extrema, at run time (dynamic quantization)."""
        qmin, qmax = dtype_limits(dtype)
        zero = relax.const(0.0, "float32")
        low = relax.op.minimum(relax.op.min(value), zero)
        high = relax.op.maximum(relax.op.max(value), zero)
        scale = relax.op.divide(relax.op.subtract(high, low), relax.const(float(qmax - qmin), "float32"))
        scale = emit(relax.op.maximum(scale, relax.const(np.finfo(np.float32).tiny, "float32")), f"{name}_scale")
        shifted = relax.op.round(relax.op.subtract(relax.const(float(qmin), "float32"), relax.op.divide(low, scale)))
        clipped = relax.op.minimum(relax.op.maximum(shifted, relax.const(float(qmin), "float32")),
                                   relax.const(float(qmax), "float32"))
        zero_point = emit(relax.op.astype(clipped, dtype), f"{name}_zero_point")
        return scale, zero_point

    def weight(self, op: QuantOp, emit: Emit) -> relax.Expr:
        assert op.weight is not None
        value = self.plan.constant_value(op.weight, self.params)
        params = weight_params(value, self.info.kernel_dtype, op.weight_axis if self.info.per_channel else None)
        self.weight_params[op.name] = params
        quantized = quantize_array(value, params)
        scale = _const(params.scale, "float32")
        zero_point = _const(params.zero_point, self.info.kernel_dtype)
        axis = op.weight_axis if params.axis is not None else -1
        return emit(relax.op.dequantize(_const(quantized, self.info.kernel_dtype), scale, zero_point, axis=axis,
                                        out_dtype="float32"), f"{op.name}_weight_dq")

    def bias(self, op: QuantOp, emit: Emit) -> tuple[relax.Expr, QuantParams]:
        assert op.bias_constant is not None and op.channel_axis is not None
        value = self.plan.constant_value(op.bias_constant, self.params)
        input_scale = np.float32(self.activation_params[op.activations[0]].scale)
        weight_scale = self.weight_params[op.name].scale
        scale = (input_scale * np.asarray(weight_scale, np.float32)).astype(np.float32)
        axis = None
        if scale.ndim == 1:  # per-channel: the bias's channel axis (the bias may have fewer dims than the output)
            out_rank = len(self.plan.index.records[op.name].ty.shape.values)
            axis = op.channel_axis % out_rank - (out_rank - value.ndim)
        params = QuantParams(scale, np.zeros(scale.shape, np.int32), "int32", axis)
        quantized = quantize_array(value.astype(np.float64), params)
        node = emit(relax.op.dequantize(_const(quantized, "int32"), _const(scale, "float32"),
                                        _const(params.zero_point, "int32"), axis=axis if axis is not None else -1,
                                        out_dtype="float32"), f"{op.name}_bias_dq")
        return node, params

    def rewrite(self, names: Mapping[int, str]) -> Any:
        def rewrite_call(binding: str, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr | None:
            name = names.get(_handle(call))
            if name is None:
                return None
            if name in self.ops:
                return self.rewrite_op(self.ops[name], call, args, emit)
            if name in self.bias_of and self.static:
                op = self.bias_of[name]
                bias, params = self.bias(op, emit)
                self.info.layers[op.output]["bias"] = params.to_json()
                return relax.Call(call.op, [args[0], bias], call.attrs, call.ty_args)
            return None

        return rewrite_call

    def rewrite_op(self, op: QuantOp, call: relax.Call, args: list[relax.Expr], emit: Emit) -> relax.Expr:
        layer: dict[str, Any] = {"kind": op.kind, "node": op.name, "inputs": {}}
        if op.kind in ("conv", "matmul"):
            data = self.activation(op.activations[0], args[0], emit)
            weight = self.weight(op, emit)
            layer["inputs"][op.activations[0]] = (self.activation_params[op.activations[0]].to_json()
                                                  if self.static else "dynamic")
            layer["weight"] = self.weight_params[op.name].to_json()
            self.info.layers[op.output] = layer
            return relax.Call(call.op, [data, weight], call.attrs, call.ty_args)
        fields = list(args[0].fields) if op.kind == "concat" else list(args)
        new_fields = []
        for tensor, value in zip(op.activations, fields):
            new_fields.append(self.activation(tensor, value, emit))
            layer["inputs"][tensor] = self.activation_params[tensor].to_json()
        self.info.layers[op.output] = layer
        if op.kind == "concat":
            return relax.Call(call.op, [relax.Tuple(new_fields)], call.attrs, call.ty_args)
        return relax.Call(call.op, new_fields, call.attrs, call.ty_args)


def quantize(ir: ModuleParts, calibration: CalibrationData | None, *, activation_dtype: str = "int8",
             kernel_dtype: str | None = None, bias_dtype: str | None = None, per_channel: bool = False,
             calib_method: str = "average", quant_type: str = "any", exclude: Iterable[str] = (),
             percentile: float = 99.0) -> tuple[tvm.IRModule, dict[str, weights.Tensor], QuantizationInfo]:
    """The QDQ module, its remaining params and the record of what was quantized.

    Raises:
        ValueError: A bad dtype, method or type string; static quantization
            without calibration; an ``exclude`` name that is no node; a
            quantized activation that calibration did not see.
    """
    kernel, bias, resolved, method = resolve_settings(activation_dtype, kernel_dtype, bias_dtype, calib_method,
                                                      quant_type, calibration is not None)
    if not isinstance(percentile, (int, float)) or not 0 < percentile <= 100:
        raise OptionError(f"percentile must be in (0, 100]; given {percentile!r}")
    exclude = list(exclude) if not isinstance(exclude, str) else [exclude]
    static = resolved == "static"
    info = QuantizationInfo(activation_dtype, kernel, bias, bool(per_channel), method if static else None, resolved,
                            excluded=sorted(exclude))
    # Weights held in params are frozen into the graph where they are quantized.
    first = build_plan(ir.mod, ir.params, joins=static, exclude=exclude)
    held = {first.index.records[name].param for op in first.ops for name in (op.weight, op.bias_constant)
            if name is not None and first.index.records[name].param is not None}
    if held:
        mod = weights.bind_params(ir.mod, {k: v for k, v in ir.params.items() if k in held})
        params = {k: v for k, v in ir.params.items() if k not in held}
        plan = build_plan(mod, params, joins=static, exclude=exclude)
    else:
        mod, params, plan = ir.mod, dict(ir.params), first
    act_params: dict[str, QuantParams] = {}
    if static:
        assert calibration is not None
        for name in plan.activations:
            stats = calibration.statistics.get(name)
            if stats is None or not stats.minima:
                raise ModelStateError(
                    f"node {name!r} is quantized but the calibration data has no statistics for it "
                    "(the graph changed after calibrating?): call calibrate(calib_data) again")
            low, high = activation_range(stats, method, percentile)
            act_params[name] = activation_params(low, high, activation_dtype)
    rewriter = _Rewriter(plan, params, info, act_params)
    names = rewriter.value_names(mod["main"])
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = rebind(mod, "main", rewrite_call=rewriter.rewrite(names))
    return updated, params, info
