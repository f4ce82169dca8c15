"""``ONNXModule.export`` and ``build_engine``: a checked ONNX file, its metadata, and a TensorRT engine from it.

``export`` writes two files, ``<stem>.onnx`` (the path given) and
``<stem>_metadata.json`` beside it, after two checks on the bytes about to be
written; a failed check raises :class:`ONNXExportError` and writes nothing:

1. ``onnx.checker.check_model(full_check=True)`` (strict shape inference too);
2. onnxruntime runs the file and the *original* model (the one the
   ``ONNXModule`` was built from, at the batch size set since): float models
   agree within ``rtol = atol = 1e-5`` on seeded standard-normal inputs; a
   model quantized by ``quantize()`` keeps every float output's SQNR against
   the original at or above ``min_sqnr_db`` (20 dB by default) on the first
   calibration samples (calibration-like data: random inputs would exercise
   ranges calibration never saw).

Both files are staged in a temporary directory beside the target and moved in
with :func:`os.replace`.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import hashlib
import json
import os
import shutil
import tempfile
import uuid as uuid_lib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from forge_core import __version__ as forge_version
from forge_core.errors import CompilationError, ForgeError, OptionError
from forge_tensorrt.onnx_graph import (
    QDQ_OPSET,
    default_opset,
    input_specs,
    logger,
    output_specs,
    random_inputs,
    session,
    upgrade_opset,
)

METADATA_SUFFIX = "_metadata.json"
FP32_TOLERANCE = 1e-5
DEFAULT_MIN_SQNR_DB = 20.0
INTEGER_OPS = ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear",
               "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearGlobalAveragePool", "QLinearSigmoid",
               "QLinearLeakyRelu", "QLinearAveragePool", "QLinearSoftmax")


class ONNXExportError(CompilationError):
    """``ONNXModule.export`` refused to write: a check failed. The message says which and by how much."""


class TensorRTUnavailableError(ForgeError):
    """``build_engine`` needs the ``tensorrt`` package and a CUDA GPU."""


def metadata_path(path: Path) -> Path:
    """Where the metadata of the ONNX file ``path`` goes: ``model.onnx`` -> ``model_metadata.json``."""
    return path.with_name(path.stem + METADATA_SUFFIX)


def check_uuid(value: Any) -> str:
    """The uuid as compile() validates it: a UUID string, or a random uuid4 when None."""
    if value is None:
        return str(uuid_lib.uuid4())
    try:
        return str(uuid_lib.UUID(str(value)))
    except ValueError:
        raise OptionError(
            f"uuid must be a UUID such as '123e4567-e89b-12d3-a456-426614174000', given {value!r}") from None


def tensorrt_ready(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ``is_tensorrt=True`` asks of a model: opset >= 13 and nothing TensorRT's ONNX parser refuses outright.

    The opset is raised with ``onnx.version_converter`` when lower. Refused:
    operators of another domain than ONNX's (custom ops need a TensorRT
    plugin), integer operators other than QuantizeLinear/DequantizeLinear
    (QLinearConv, MatMulInteger...: TensorRT reads only explicit QDQ), and
    Q/DQ whose zero point is not an int8 zero (TensorRT's int8 is symmetric).

    Raises:
        ONNXExportError: naming the node and why.
    """
    try:
        model = upgrade_opset(model, QDQ_OPSET)
    except ValueError as exc:
        raise ONNXExportError(f"is_tensorrt=True: {exc}") from None
    zero_points = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        name = node.name or node.output[0]
        if node.domain not in ("", "ai.onnx"):
            raise ONNXExportError(f"is_tensorrt=True: node {name!r} is {node.domain}.{node.op_type}, an operator "
                                  f"outside ONNX's domain that TensorRT's ONNX parser cannot take without a plugin; "
                                  f"export with is_tensorrt=False to write it anyway")
        if node.op_type in INTEGER_OPS:
            raise ONNXExportError(f"is_tensorrt=True: node {name!r} is {node.op_type}; TensorRT reads int8 only "
                                  f"as QuantizeLinear/DequantizeLinear pairs (quantize the float model instead)")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            zp = zero_points.get(node.input[2])
            values = onnx.numpy_helper.to_array(zp) if zp is not None else None
            if values is None or values.dtype != np.int8 or np.any(values != 0):
                raise ONNXExportError(f"is_tensorrt=True: node {name!r} ({node.op_type}) has a zero point that is "
                                      f"not an int8 zero constant; TensorRT's int8 is symmetric")
    return model


def _sqnr_db(reference: np.ndarray, value: np.ndarray) -> float:
    signal = float(np.sum(np.square(reference, dtype=np.float64)))
    noise = float(np.sum(np.square(reference.astype(np.float64) - value.astype(np.float64))))
    if noise == 0:
        return float("inf")
    return 10.0 * np.log10(signal / noise) if signal > 0 else float("-inf")


def check_numbers(candidate: bytes, reference: onnx.ModelProto, *, quantized: bool,
                  samples: Sequence[dict[str, np.ndarray]], min_sqnr_db: float) -> dict[str, Any]:
    """Run ``candidate`` and ``reference`` on the same inputs; raise :class:`ONNXExportError` past the bar.

    Returns what was measured, for the metadata's ``check`` entry.
    """
    specs = input_specs(reference)
    feeds = list(samples) if quantized and samples else [random_inputs(specs, seed) for seed in range(2)]
    ours, theirs = session(candidate), session(reference)
    names = [spec.name for spec in output_specs(reference)]
    worst_diff, worst_sqnr = 0.0, float("inf")
    for feed in feeds:
        for name, want, got in zip(names, theirs.run(None, feed), ours.run(None, feed)):
            want, got = np.asarray(want), np.asarray(got)
            if want.shape != got.shape:
                raise ONNXExportError(f"check against the original model: output {name!r} has shape {got.shape}, "
                                      f"the original's {want.shape}")
            if want.dtype.kind != "f":
                if not quantized and not np.array_equal(want, got):
                    raise ONNXExportError(f"check against the original model: output {name!r} differs")
                continue
            diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
            worst_diff = max(worst_diff, diff)
            if quantized:
                worst_sqnr = min(worst_sqnr, _sqnr_db(want, got))
            elif not np.allclose(got, want, rtol=FP32_TOLERANCE, atol=FP32_TOLERANCE, equal_nan=True):
                raise ONNXExportError(f"check against the original model: output {name!r} differs by up to {diff:.3g}, "
                                      f"beyond rtol = atol = {FP32_TOLERANCE:g}")
    if quantized and worst_sqnr < min_sqnr_db:
        raise ONNXExportError(
            f"check against the original model: the int8 model's output SQNR is {worst_sqnr:.1f} dB, below the "
            f"{min_sqnr_db:g} dB bar, on {len(feeds)} calibration sample(s). Keep the layers that lose accuracy float "
            f"with quantize(exclude=[...]), try another calib_method, or lower export(min_sqnr_db=...)")
    check: dict[str, Any] = {"inputs": "calibration samples" if quantized and samples else "random normal",
                             "count": len(feeds), "max_abs_diff": worst_diff}
    if quantized:
        check.update(sqnr_db=None if worst_sqnr == float("inf") else round(worst_sqnr, 3), min_sqnr_db=min_sqnr_db)
    else:
        check.update(rtol=FP32_TOLERANCE, atol=FP32_TOLERANCE)
    return check


def export(model: onnx.ModelProto, reference: onnx.ModelProto, path: str | os.PathLike[str], *, uuid: Any = None,
           is_tensorrt: Any = True, force_overwrite: Any = False, precision: str,
           quantization: dict[str, Any] | None, check_samples: Sequence[dict[str, np.ndarray]] = (),
           min_sqnr_db: float = DEFAULT_MIN_SQNR_DB) -> dict[str, Any]:
    """Check ``model`` and write it with its metadata (see the module docstring); returns the metadata."""
    for name, value in (("is_tensorrt", is_tensorrt), ("force_overwrite", force_overwrite)):
        if not isinstance(value, bool):
            raise OptionError(f"{name} must be True or False, given {value!r}")
    if isinstance(min_sqnr_db, bool) or not isinstance(min_sqnr_db, (int, float)):
        raise OptionError(f"min_sqnr_db must be a number, given {min_sqnr_db!r}")
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise OptionError(f"path must be a file path such as 'model.onnx', given {path!r}")
    uuid_text = check_uuid(uuid)
    target = Path(path)
    meta_target = metadata_path(target)
    if target.is_dir():
        raise OptionError(f"{str(target)!r} is a directory; give the ONNX file's path, "
                         f"e.g. {str(target / 'model.onnx')!r}")
    if not force_overwrite:
        for existing in (target, meta_target):
            if existing.exists():
                raise OptionError(f"{str(existing)!r} already exists; pass force_overwrite=True to replace it")

    candidate = tensorrt_ready(model) if is_tensorrt else model
    data = candidate.SerializeToString()
    try:
        onnx.checker.check_model(data, full_check=True)
    except Exception as exc:  # ValidationError, or shape inference's InferenceError
        raise ONNXExportError(f"onnx.checker rejects the model: {str(exc).strip().splitlines()[0]}") from exc
    check = check_numbers(data, reference, quantized=quantization is not None, samples=check_samples,
                          min_sqnr_db=float(min_sqnr_db))

    metadata = {
        "forge_artifact": "onnx_model",
        "schema_version": 1,
        "uuid": uuid_text,
        "forge_version": forge_version,
        "onnx_version": onnx.__version__,
        "opset": default_opset(candidate),
        "inputs": [spec.to_json() for spec in input_specs(candidate)],
        "outputs": [spec.to_json() for spec in output_specs(candidate)],
        "precision": precision,
        "is_tensorrt": is_tensorrt,
        "quantization": quantization,
        "check": check,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"file": target.name, "sha256": hashlib.sha256(data).hexdigest()},
    }
    _write_pair(target, data, meta_target, (json.dumps(metadata, indent=2) + "\n").encode())
    logger.info("exported %s (%s, is_tensorrt=%s) and %s", target, precision, is_tensorrt, meta_target.name)
    return metadata


def _write_pair(path: Path, data: bytes, meta_path: Path, meta: bytes) -> None:
    """Stage both files in a temporary directory beside ``path``, then :func:`os.replace` each into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        for name, content in ((path.name, data), (meta_path.name, meta)):
            with open(staging / name, "wb") as f:
                f.write(content)
        os.replace(staging / path.name, path)
        os.replace(staging / meta_path.name, meta_path)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)


# ----------------------------------------------------------------------
# TensorRT
# ----------------------------------------------------------------------


def _cuda_device_count() -> int:
    for library in ("libcuda.so.1", "libcuda.so"):
        try:
            cuda = ctypes.CDLL(library)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def tensorrt_unavailable_reason() -> str | None:
    """None when ``tensorrt`` imports and a CUDA GPU exists; else why not, in words."""
    try:
        import tensorrt

        del tensorrt  # imported to see that it imports
    except ImportError as exc:
        return f"the tensorrt package does not import ({exc}); install it with pip install tensorrt"
    if _cuda_device_count() == 0:
        return "no CUDA GPU was found (libcuda reports no device)"
    return None


def build_engine(onnx_path: str | os.PathLike[str], engine_path: str | os.PathLike[str] | None = None, *,
                 workspace_bytes: int = 1 << 30, force_overwrite: bool = False) -> str:
    """Build a serialized TensorRT engine from an exported ONNX file; returns the engine's path.

    The int8 flag is set when the ONNX file holds QuantizeLinear nodes
    (explicit quantization: TensorRT takes the scales as they are); fp16 is
    not enabled.
    """
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise TensorRTUnavailableError(f"TensorRT and a CUDA GPU are not available: {reason}")
    import tensorrt as trt

    source = Path(onnx_path)
    if not source.is_file():
        raise OptionError(f"ONNX file {str(source)!r} does not exist; export() it first")
    target = Path(engine_path) if engine_path is not None else source.with_suffix(".engine")
    if target.exists() and not force_overwrite:
        raise OptionError(f"{str(target)!r} already exists; pass force_overwrite=True to replace it")
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):  # implicit in TensorRT 10
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(source)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise CompilationError(f"TensorRT's ONNX parser rejects {str(source)!r}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if any(node.op_type == "QuantizeLinear" for node in onnx.load(str(source), load_external_data=False).graph.node):
        config.set_flag(trt.BuilderFlag.INT8)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise CompilationError(f"TensorRT failed to build an engine from {str(source)!r} (see its log above)")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with open(staging / target.name, "wb") as f:
            f.write(bytes(serialized))
        os.replace(staging / target.name, target)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return str(target)
