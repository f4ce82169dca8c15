"""``ONNXModule.calibrate`` and ``quantize``: QDQ ONNX placed the way TensorRT reads it.

TensorRT builds int8 engines from *explicit* quantization: ``QuantizeLinear``
→ ``DequantizeLinear`` pairs in the ONNX graph, whose scales it uses as they
are. What it expects, and what this module writes:

* **Where:** a Q→DQ pair on the activation input of every ``Conv``,
  ``MatMul`` and ``Gemm`` whose weight is an initializer (one pair per
  tensor, shared by its quantized consumers); TensorRT fuses the pair into the
  int8 kernel that follows. Activation-by-activation matmuls, biases and every
  other operator stay float.
* **Activations:** per tensor, symmetric int8: zero point 0,
  ``scale = max(|low|, |high|) / 127`` over the range the calibration method
  derives (:func:`forge_core.quantization.ranges.activation_range`).
* **Weights:** symmetric int8, per output channel by default: an int8
  initializer read through ``DequantizeLinear(w_int8, scales, zeros, axis)``,
  ``axis`` 0 for a ``Conv`` weight ``[O, I, kh, kw]``, the last axis for a
  ``MatMul`` weight ``[K, N]``, and 0 or 1 for ``Gemm`` (``transB`` 1 or 0).
  Per-axis ``DequantizeLinear`` needs opset 13: a model below it is upgraded
  with ``onnx.version_converter``.

Calibration runs onnxruntime with the watched activations as extra graph
outputs, one sample at a time, and folds each into the numpy-only statistics
IRModule's calibration uses (:class:`TensorStatistics`): memory holds one
sample's tensors, whatever the sample count.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from forge_core.quantization.calibration_data import CalibrationData, TensorStatistics
from forge_core.quantization.observe import progress, sample_arrays
from forge_core.quantization.ranges import (
    CALIB_METHODS,
    QUANT_TYPES,
    activation_range,
    quantize_array,
    weight_params,
)
from forge_tensorrt.onnx_graph import QDQ_OPSET, initializer_names, input_specs, logger, session, upgrade_opset
from forge_core.errors import ModelStateError, OptionError

QUANTIZABLE_OPS = ("Conv", "MatMul", "Gemm")
CHECK_SAMPLES = 8
"""Calibration samples kept for ``export``'s accuracy check (the first ones; the rest are only folded)."""


@dataclass(frozen=True)
class QuantTarget:
    """One operator to quantize: its node, activation input, weight initializer and the weight's channel axis."""

    node: str
    op_type: str
    activation: str
    weight: str
    axis: int


def node_name(node: onnx.NodeProto) -> str:
    """A node's name, or its first output's when it has none (ONNX allows unnamed nodes)."""
    return node.name or node.output[0]


def quant_targets(model: onnx.ModelProto) -> list[QuantTarget]:
    """The ``Conv``/``MatMul``/``Gemm`` nodes with an activation input and a float initializer weight, in order."""
    weights = {init.name: init for init in model.graph.initializer}
    targets = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in QUANTIZABLE_OPS or len(node.input) < 2:
            continue
        activation, weight = node.input[0], weights.get(node.input[1])
        if activation in weights or weight is None or weight.data_type != TensorProto.FLOAT:
            continue
        rank = len(weight.dims)
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 0 if trans_b else 1
        else:
            if rank < 2:
                continue
            axis = rank - 1
        targets.append(QuantTarget(node_name(node), node.op_type, activation, weight.name, axis))
    return targets


def watched_tensors(model: onnx.ModelProto) -> list[str]:
    """Every activation tensor a quantized operator reads, each once, in order."""
    return list(dict.fromkeys(t.activation for t in quant_targets(model)))


# ----------------------------------------------------------------------
# Calibration
# ----------------------------------------------------------------------


def calibrate(model: onnx.ModelProto, calib_data: Iterable[Any], *, previous: CalibrationData | None = None,
              kept: list[dict[str, np.ndarray]] | None = None, use_cuda: bool = True,
              show_progress: bool = True) -> tuple[CalibrationData, list[dict[str, np.ndarray]]]:
    """Statistics of the activations quantization reads, over ``calib_data``, added to ``previous`` if given.

    Returns the statistics and the first :data:`CHECK_SAMPLES` samples (as
    ``{input name: array}``), which ``export`` checks the quantized model on.

    Raises:
        ValueError: ``calib_data`` is not an iterable of samples, or holds none.
        forge.InputError: a sample does not fit the model (names the sample's
            index, the input, the expected and given shape or dtype).
    """
    if isinstance(calib_data, (np.ndarray, str, bytes)) or not isinstance(calib_data, Iterable):
        raise OptionError(
            f"calib_data must be an iterable of samples (a list of arrays, a generator...); given "
            f"{type(calib_data).__name__}" + (" — wrap a single array in a list: [array]"
                                             if isinstance(calib_data, np.ndarray) else ""))
    specs = input_specs(model)
    names = watched_tensors(model)
    data = previous.copy() if previous is not None else CalibrationData()
    samples = list(kept) if kept is not None else []
    for name in names:
        data.statistics.setdefault(name, TensorStatistics())
    inputs = {spec.name for spec in specs}
    fetched = [name for name in names if name not in inputs]
    watching = onnx.ModelProto()
    watching.CopyFrom(model)
    declared = {value.name for value in watching.graph.output}
    watching.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                                 for name in fetched if name not in declared)
    runner = session(watching, use_cuda=use_cuda) if fetched else None
    total = len(calib_data) if hasattr(calib_data, "__len__") else None  # type: ignore[arg-type]
    count = 0
    with progress("Calibrating", total, show_progress) as advance:
        for index, sample in enumerate(calib_data):
            feeds = dict(zip([s.name for s in specs], sample_arrays(sample, specs, index)))
            values = dict(zip(fetched, runner.run(fetched, feeds))) if runner is not None else {}
            values.update((name, feeds[name]) for name in names if name in inputs)
            for name in names:
                data.statistics[name].observe(values[name])
            if len(samples) < CHECK_SAMPLES:
                samples.append({name: np.array(value, copy=True) for name, value in feeds.items()})
            count += 1
            advance()
    if count == 0:
        raise OptionError("calib_data held no samples")
    data.num_samples += count
    logger.info("calibrated %d tensors over %d samples", len(names), count)
    return data, samples


# ----------------------------------------------------------------------
# Quantization
# ----------------------------------------------------------------------


@dataclass
class ONNXQuantization:
    """How :func:`quantize` quantized a model: the settings, and each tensor's scales.

    ``activations`` maps a tensor to ``{"scale", "zero_point"}``; ``weights``
    maps a weight initializer to ``{"scale": [...], "zero_point": 0, "axis"}``
    (``axis`` None per tensor); ``layers`` maps each quantized node to its
    ``op_type``, ``input`` tensor and ``weight``.
    """

    calib_method: str
    per_channel: bool
    percentile: float | None
    num_samples: int
    activations: dict[str, dict[str, Any]] = field(default_factory=dict)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The settings and scales, JSON-ready (the export metadata's ``quantization`` entry)."""
        return {"quant_type": "static", "activation_dtype": "int8", "kernel_dtype": "int8", "bias_dtype": "float32",
                "scheme": "symmetric", "per_channel": self.per_channel, "calib_method": self.calib_method,
                "percentile": self.percentile, "num_samples": self.num_samples, "excluded": list(self.excluded),
                "activations": self.activations, "weights": self.weights, "layers": self.layers}


def _check_settings(activation_dtype: str, kernel_dtype: str | None, bias_dtype: str | None, calib_method: str,
                    quant_type: str, percentile: float) -> None:
    for name, value in (("activation_dtype", activation_dtype), ("kernel_dtype", kernel_dtype)):
        if value is not None and value != "int8":
            raise OptionError(f"{name} must be 'int8' (TensorRT's explicit quantization reads int8 "
                             f"QuantizeLinear/DequantizeLinear only); given {value!r}")
    if bias_dtype not in (None, "float32"):
        raise OptionError(f"bias_dtype must be None or 'float32': TensorRT takes biases in float and folds them into "
                         f"the int8 kernel; given {bias_dtype!r}")
    if not isinstance(calib_method, str) or calib_method not in CALIB_METHODS:
        raise OptionError(f"calib_method must be one of {', '.join(map(repr, CALIB_METHODS))}; given {calib_method!r}")
    if not isinstance(quant_type, str) or quant_type not in QUANT_TYPES:
        raise OptionError(f"quant_type must be one of {', '.join(map(repr, QUANT_TYPES))}; given {quant_type!r}")
    if quant_type == "dynamic":
        raise OptionError("quant_type='dynamic' is not available for ONNXModule: TensorRT needs static calibration "
                         "(explicit QDQ scales); call calibrate(calib_data), then quantize(quant_type='static')")
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not 0 < percentile <= 100:
        raise OptionError(f"percentile must be a number in (0, 100]; given {percentile!r}")


def _unique(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _scalar(name: str, value: Any, dtype: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def quantize(model: onnx.ModelProto, calibration: CalibrationData | None, *, activation_dtype: str = "int8",
             kernel_dtype: str | None = None, bias_dtype: str | None = None, per_channel: bool = True,
             calib_method: str = "average", quant_type: str = "any", exclude: Iterable[str] = (),
             percentile: float = 99.0) -> tuple[onnx.ModelProto, ONNXQuantization]:
    """The QDQ form of ``model`` (see the module docstring) and how it was quantized.

    Raises:
        ValueError: a setting TensorRT cannot take (uint8, int32 biases,
            ``quant_type="dynamic"``), an unknown ``calib_method``; no
            calibration; an ``exclude`` name that is no node (close matches
            suggested); a model whose opset cannot be raised to 13.
    """
    _check_settings(activation_dtype, kernel_dtype, bias_dtype, calib_method, quant_type, percentile)
    if not isinstance(per_channel, bool):
        raise OptionError(f"per_channel must be True or False, given {per_channel!r}")
    if not calibration:
        raise ModelStateError(f"quant_type={quant_type!r} needs calibration data, and TensorRT needs static scales: "
                         "call calibrate(calib_data) first")
    excluded = [exclude] if isinstance(exclude, str) else list(exclude)
    names = [node_name(n) for n in model.graph.node]
    for name in excluded:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            raise OptionError(f"exclude: no node is named {name!r}"
                             + (f"; close names: {', '.join(map(repr, close))}" if close else ""))
    source = model
    model = onnx.ModelProto()
    model.CopyFrom(source)  # the caller's model (the original export checks against) stays as it is
    model = upgrade_opset(model, QDQ_OPSET)
    graph = model.graph
    targets = [t for t in quant_targets(model) if t.node not in excluded]
    info = ONNXQuantization(calib_method, per_channel, float(percentile) if calib_method == "percentile" else None,
                            calibration.num_samples, excluded=excluded)
    taken = {n for node in graph.node for n in [*node.input, *node.output, node.name]} | initializer_names(graph)
    taken |= {v.name for v in [*graph.input, *graph.output]}
    weights = {init.name: init for init in graph.initializer}
    new_inits: list[onnx.TensorProto] = []
    qdq_of_activation: dict[str, tuple[str, list[onnx.NodeProto]]] = {}
    dq_of_weight: dict[tuple[str, int], tuple[str, list[onnx.NodeProto]]] = {}

    for target in targets:
        if target.activation not in qdq_of_activation:
            stats = calibration.statistics.get(target.activation)
            if stats is None or not stats.minima:
                raise ModelStateError(f"no calibration statistics for tensor {target.activation!r} (read by node "
                                 f"{target.node!r}); calibrate() again after changing the model")
            low, high = activation_range(stats, calib_method, percentile, symmetric=True)
            amax = max(abs(low), abs(high))
            scale = np.float32(amax / 127.0 if amax > 0 else 1.0)
            t = target.activation
            s_name, z_name = _unique(f"{t}_scale", taken), _unique(f"{t}_zero_point", taken)
            q_out, dq_out = _unique(f"{t}_quantized", taken), _unique(f"{t}_dequantized", taken)
            new_inits += [_scalar(s_name, scale, np.float32), _scalar(z_name, 0, np.int8)]
            nodes = [helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_out],
                                      name=_unique(f"{t}_QuantizeLinear", taken)),
                     helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out],
                                      name=_unique(f"{t}_DequantizeLinear", taken))]
            qdq_of_activation[t] = (dq_out, nodes)
            info.activations[t] = {"scale": float(scale), "zero_point": 0, "range": [low, high]}
        key = (target.weight, target.axis)
        if key not in dq_of_weight:
            w = target.weight
            values = numpy_helper.to_array(weights[w]).astype(np.float32)
            params = weight_params(values, "int8", target.axis if per_channel else None)
            q_name, s_name = _unique(f"{w}_int8", taken), _unique(f"{w}_scale", taken)
            z_name, dq_out = _unique(f"{w}_zero_point", taken), _unique(f"{w}_dequantized", taken)
            scales = np.asarray(params.scale, np.float32)
            new_inits += [numpy_helper.from_array(quantize_array(values, params), q_name),
                          numpy_helper.from_array(scales, s_name),
                          numpy_helper.from_array(np.zeros(scales.shape, np.int8), z_name)]
            attrs = {"axis": target.axis} if per_channel else {}
            dq_of_weight[key] = (dq_out, [helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dq_out],
                                                           name=_unique(f"{w}_DequantizeLinear", taken), **attrs)])
            info.weights[w] = {"scale": scales.reshape(-1).tolist(), "zero_point": 0,
                               "axis": target.axis if per_channel else None}
        info.layers[target.node] = {"op_type": target.op_type, "input": target.activation, "weight": target.weight}

    by_node = {t.node: t for t in targets}
    emitted: set[tuple[Any, ...]] = set()
    rebuilt: list[onnx.NodeProto] = []
    for node in graph.node:
        target = by_node.get(node_name(node))
        if target is not None:
            for key, (_, nodes) in ((("a", target.activation), qdq_of_activation[target.activation]),
                                    (("w", target.weight, target.axis), dq_of_weight[(target.weight, target.axis)])):
                if key not in emitted:  # right before the first consumer: the producer is already above
                    rebuilt += nodes
                    emitted.add(key)
            node.input[0] = qdq_of_activation[target.activation][0]
            node.input[1] = dq_of_weight[(target.weight, target.axis)][0]
        rebuilt.append(node)
    del graph.node[:]
    graph.node.extend(rebuilt)
    still_read = {name for node in graph.node for name in node.input} | {v.name for v in graph.output}
    dropped = {w for w, _ in dq_of_weight if w not in still_read}
    kept = [init for init in graph.initializer if init.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept + new_inits)
    listed = [value for value in graph.input if value.name not in dropped]  # IR 3 lists weights as inputs
    del graph.input[:]
    graph.input.extend(listed)
    onnx.checker.check_model(model)
    logger.info("quantized %d operators (%d excluded)", len(targets), len(excluded))
    return model, info


def rebatch_samples(samples: list[dict[str, np.ndarray]], batch_size: int) -> list[dict[str, np.ndarray]]:
    """The kept check samples regrouped at ``batch_size``: concatenated on the batch axis, cut in batches.

    When fewer rows than one batch exist, they repeat. Calibration statistics
    themselves do not depend on the batch and stay as they are.
    """
    if not samples:
        return []
    pooled = {name: np.concatenate([s[name] for s in samples], axis=0) for name in samples[0]}
    rows = min(len(v) for v in pooled.values())
    count = max(1, min(CHECK_SAMPLES, rows // batch_size))
    order = np.arange(count * batch_size) % rows
    return [{name: np.ascontiguousarray(v[order[i * batch_size:(i + 1) * batch_size]]) for name, v in pooled.items()}
            for i in range(count)]
