"""ONNX's signal operators (opset 17): ``STFT``, ``DFT`` and the ``MelWeightMatrix`` constant (the window
functions are in ``elementwise.py``).

Speech models ship their feature extraction as ONNX (onnx-asr's preprocessors for NeMo, Whisper, GigaAM and
Kaldi features: ``STFT``; WeSpeaker's: ``DFT``). TVM's importer has none of these operators.

* ``STFT`` and ``DFT`` are matrix products with the DFT's cosine and sine matrices (built in float64 at import,
  stored as float32), over frames gathered from the signal: ``frames = (length - frame_length) // frame_step
  + 1`` of a dynamic length too; a real or a complex input, ``onesided``, a window, ``inverse`` (DFT, scaled by
  1 / n), ``dft_length`` padding or cropping the axis. onnxruntime uses an FFT: the results agree to float32
  rounding (a relative 1e-6 of the output's range on 512-point transforms).
* ``MelWeightMatrix`` takes sizes and rates known at import; its constant is computed by ONNX's reference
  implementation (``onnx.reference``), the definition onnxruntime's kernel follows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from tvm import relax, tirx

from forge_core.errors import InvalidModelError, ModelImportError
from forge_onnx.converters import ConverterContext, constant_value
from forge_onnx.converters.shapes import static_or_symbolic_dims


def _scalar(value: Any, what: str, op: str, node: str) -> int:
    known = constant_value(value)
    if known is None or np.asarray(known).size != 1:
        raise ModelImportError(f"{op} {node!r}: its {what} must be a constant of the model (Forge builds the "
                               "transform's matrices at import), given a value computed at run time")
    return int(np.asarray(known).reshape(-1)[0])


def _matrices(length: int, bins: int, inverse: bool) -> tuple[relax.Expr, relax.Expr]:
    """``cos(2 pi k n / length)`` and ``sign * sin(...)`` as ``[length, bins]`` float32 constants, where the DFT is
    ``X_k = sum_n x_n (cos - i sin)`` (``inverse``: ``+ i sin``, scaled by ``1 / length``)."""
    n = np.arange(length, dtype=np.float64).reshape(-1, 1)
    k = np.arange(bins, dtype=np.float64).reshape(1, -1)
    angle = 2.0 * np.pi * ((n * k) % length) / length
    scale = 1.0 / length if inverse else 1.0
    cos = np.cos(angle) * scale
    sin = np.sin(angle) * scale * (1.0 if inverse else -1.0)
    return relax.const(cos.astype(np.float32)), relax.const(sin.astype(np.float32))


def _transform(bb: relax.BlockBuilder, real: relax.Expr, imag: relax.Expr | None, length: int, bins: int,
               inverse: bool) -> relax.Expr:
    """The DFT over the last axis (``length`` points) of ``real + i imag``: ``[..., bins, 2]``."""
    cos, sin = _matrices(length, bins, inverse)
    out_real = relax.op.matmul(real, cos)
    out_imag = relax.op.matmul(real, sin)
    if imag is not None:
        out_real = relax.op.subtract(out_real, relax.op.matmul(imag, sin))
        out_imag = relax.op.add(out_imag, relax.op.matmul(imag, cos))
    return bb.normalize(relax.op.stack([bb.normalize(out_real), bb.normalize(out_imag)], axis=-1))


def _parts(bb: relax.BlockBuilder, x: relax.Expr, op: str, node: str) -> tuple[relax.Expr, relax.Expr | None]:
    """A signal's real and imaginary parts (``[..., 1]`` real, ``[..., 2]`` complex), the last axis dropped."""
    dims = static_or_symbolic_dims(x)
    if dims is None or not dims or int(dims[-1]) not in (1, 2):
        raise InvalidModelError(f"{op} {node!r}: the signal's last dim must be 1 (real) or 2 (complex), given {x.ty}")
    if str(x.ty.dtype) != "float32":
        x = bb.normalize(relax.op.astype(x, "float32"))
    last = len(dims) - 1  # TVM's strided_slice takes no negative axis
    real = bb.normalize(relax.op.squeeze(relax.op.strided_slice(x, [last], [0], [1]), [last]))
    if int(dims[-1]) == 1:
        return real, None
    return real, bb.normalize(relax.op.squeeze(relax.op.strided_slice(x, [last], [1], [2]), [last]))


def _output(bb: relax.BlockBuilder, y: relax.Expr, dtype: str) -> relax.Expr:
    return y if dtype == "float32" else relax.op.astype(y, dtype)


def stft(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """STFT: ``[batch, frames, bins, 2]`` from ``[batch, length, 1 or 2]`` (see the module docstring)."""
    node = context.node
    signal, step_value = inputs[0], inputs[1]
    window = inputs[2] if len(inputs) > 2 else None
    length_value = inputs[3] if len(inputs) > 3 else None
    dtype = str(signal.ty.dtype)
    step = _scalar(step_value, "frame_step", "STFT", node)
    frame_length = _scalar(length_value, "frame_length", "STFT", node) if length_value is not None else None
    if window is not None:
        window_dims = static_or_symbolic_dims(window)
        if window_dims is None or len(window_dims) != 1 or not isinstance(window_dims[0], (int, tirx.IntImm)):
            raise InvalidModelError(f"STFT {node!r}: the window must be 1-D, given {window.ty}")
        size = int(window_dims[0])
        if frame_length is not None and frame_length != size:
            raise InvalidModelError(f"STFT {node!r}: frame_length {frame_length} differs from the window's length "
                                    f"{size}")
        frame_length = size
    if frame_length is None or frame_length < 1 or step < 1:
        raise InvalidModelError(f"STFT {node!r}: needs a window or a frame_length, and a frame_step >= 1 (given "
                                f"frame_length {frame_length}, frame_step {step})")
    if signal.ty.ndim == 2:  # [batch, length]: a real signal without its last axis (onnx-asr's exports);
        real, imag = signal, None  # onnxruntime reads it so
        if dtype != "float32":
            real = bb.normalize(relax.op.astype(real, "float32"))
    else:
        real, imag = _parts(bb, signal, "STFT", node)
    onesided = int(attrs.get("onesided", 1))
    if onesided and imag is not None:
        raise InvalidModelError(f"STFT {node!r}: onesided=1 takes a real signal ([..., 1]), given a complex one")
    _, samples = static_or_symbolic_dims(real)
    frames = (samples - frame_length) // step + 1
    starts = relax.op.multiply(relax.op.reshape(relax.op.arange(0, frames, 1, "int64"), [frames, 1]),
                               relax.const(step, "int64"))
    indices = bb.normalize(relax.op.add(starts, relax.const(np.arange(frame_length, dtype=np.int64).reshape(1, -1),
                                                             "int64")))

    def framed(part: relax.Expr) -> relax.Expr:
        y = bb.normalize(relax.op.take(part, indices, axis=1))  # [batch, frames, frame_length]
        if window is not None:
            y = bb.normalize(relax.op.multiply(y, relax.op.astype(window, "float32")))
        return y

    bins = frame_length // 2 + 1 if onesided else frame_length
    out = _transform(bb, framed(real), framed(imag) if imag is not None else None, frame_length, bins, False)
    return _output(bb, out, dtype)


def dft(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """DFT (opset 17: ``axis`` an attribute; 20: the third input): the transform along one axis, ``[..., 2]``."""
    node = context.node
    x = inputs[0]
    dtype = str(x.ty.dtype)
    rank = x.ty.ndim
    if context.opset >= 20:
        axis = _scalar(inputs[2], "axis", "DFT", node) if len(inputs) > 2 and inputs[2] is not None else -2
    else:
        axis = int(attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank - 1:
        raise InvalidModelError(f"DFT {node!r}: axis {axis} is not a signal axis of a rank-{rank} input (the last "
                                "axis holds the real and imaginary parts)")
    inverse, onesided = bool(int(attrs.get("inverse", 0))), bool(int(attrs.get("onesided", 0)))
    real, imag = _parts(bb, x, "DFT", node)
    if onesided and (imag is not None or inverse):
        raise InvalidModelError(f"DFT {node!r}: onesided=1 takes a real signal and a forward transform")
    dims = static_or_symbolic_dims(real)
    given = dims[axis]
    if not isinstance(given, (int, tirx.IntImm)):
        raise ModelImportError(f"DFT {node!r}: the transformed axis must have a static length, given {x.ty}")
    points = _scalar(inputs[1], "dft_length", "DFT", node) if len(inputs) > 1 and inputs[1] is not None \
        else int(given)
    order = [i for i in range(rank - 1) if i != axis] + [axis]
    back = [order.index(i) for i in range(rank - 1)]

    def prepared(part: relax.Expr) -> relax.Expr:
        part = relax.op.permute_dims(part, order)
        size = int(given)
        if points < size:
            part = relax.op.strided_slice(part, [rank - 2], [0], [points])
        elif points > size:
            pads = [0] * (2 * (rank - 1))
            pads[-1] = points - size
            part = relax.op.nn.pad(part, pads)
        return bb.normalize(part)

    bins = points // 2 + 1 if onesided else points
    out = _transform(bb, prepared(real), prepared(imag) if imag is not None else None, points, bins, inverse)
    out = relax.op.permute_dims(out, [*back, rank - 1])
    return _output(bb, bb.normalize(out), dtype)


def _reference_constant(op_type: str, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext,
                        names: tuple[str, ...]) -> relax.Expr:
    """``op_type`` evaluated by ``onnx.reference`` on its constant inputs."""
    values = []
    for name, value in zip(names, inputs, strict=False):
        known = constant_value(value)
        if known is None:
            raise ModelImportError(f"{op_type} {context.node!r}: its {name} must be a constant of the model, given "
                                   "a value computed at run time")
        values.append(np.asarray(known))
    from onnx.reference import ReferenceEvaluator

    feeds = {f"in{i}": v for i, v in enumerate(values)}
    node = helper.make_node(op_type, list(feeds), ["out"], **attrs)
    graph = helper.make_graph([node], "constant", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(
        v.dtype), v.shape) for k, v in feeds.items()], [helper.make_value_info("out", onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(context.opset, 17))])
    result = ReferenceEvaluator(model).run(None, feeds)[0]
    return relax.const(np.ascontiguousarray(result), str(result.dtype))


def mel_weight_matrix(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                      context: ConverterContext) -> relax.Expr:
    """MelWeightMatrix: a constant ``[dft_length // 2 + 1, num_mel_bins]`` (ONNX's reference implementation)."""
    return _reference_constant("MelWeightMatrix", inputs, attrs, context,
                               ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"))


CONVERTERS = {"STFT": stft, "DFT": dft, "MelWeightMatrix": mel_weight_matrix}
