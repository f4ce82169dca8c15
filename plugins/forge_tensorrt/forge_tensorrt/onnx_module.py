"""``forge.ONNXModule``: an ONNX model prepared for TensorRT, which builds engines from ONNX.

TensorRT's route is ONNX: its parser builds the engine, and it quantizes from
explicit QuantizeLinear/DequantizeLinear nodes. ``ONNXModule`` keeps the model
as ONNX throughout: it reports the same input and output properties as
``IRModule``, sets the batch size, calibrates and quantizes with the same
statistics and methods (placing QDQ the way TensorRT reads it), and exports a
checked ``.onnx`` file with its metadata.

Each method is a docstring, a lazy import and one call to a free function:
:mod:`forge_tensorrt.onnx_graph` (reading, signatures, batch size),
:mod:`forge_tensorrt.onnx_quantize` (calibration, QDQ) and
:mod:`forge_tensorrt.onnx_export` (checks, files, engines).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from forge_core.runtime.signature import SignatureSurface, TensorSpec
from forge_core.settings import QUANTIZE_DEFAULTS as _Q
from forge_tensorrt import onnx_graph
from forge_core.errors import ModelStateError

if TYPE_CHECKING:
    from forge_core.quantization.calibration_data import CalibrationData
    from forge_tensorrt.onnx_quantize import ONNXQuantization


class ONNXModule(SignatureSurface):
    """An ONNX model on its way to TensorRT.

    Args:
        path_or_proto: An ``onnx.ModelProto`` (copied: later edits to it do not
            reach the module) or the path to a ``.onnx`` file.

    Raises:
        forge.ModelImportError: The file does not exist, is not ONNX, or the
            model fails ``onnx.checker``.
        TypeError: Neither a ModelProto nor a path.
    """

    def __init__(self, path_or_proto: onnx.ModelProto | str | os.PathLike[str]) -> None:
        model, self._source = onnx_graph.read_model(path_or_proto)
        self._model = model
        self._original = model  # what export() checks against; replaced (never edited) by set_batch_size
        self._calibration: CalibrationData | None = None
        self._check_samples: list[dict[str, np.ndarray]] = []
        self._quantization: ONNXQuantization | None = None
        self._arrived_quantized = onnx_graph.is_quantized(model)

    # ------------------------------------------------------------------
    # The model and its signature
    # ------------------------------------------------------------------

    @property
    def model(self) -> onnx.ModelProto:
        """A copy of the current ``onnx.ModelProto`` (the QDQ model after :meth:`quantize`).

        A copy, so that editing it cannot break what the module knows
        (calibration statistics, the original model export checks against).
        """
        return onnx_graph.copy_model(self._model)

    @property
    def input_specs(self) -> list[TensorSpec]:
        """Name, shape and dtype of each graph input that is not an initializer."""
        return onnx_graph.input_specs(self._model)

    @property
    def output_specs(self) -> list[TensorSpec]:
        """Name, shape and dtype of each graph output (shapes from ONNX inference when undeclared)."""
        return onnx_graph.output_specs(self._model)

    @property
    def operators(self) -> dict[str, int]:
        """Count of the model's nodes by op type, subgraphs included, e.g. ``{"Conv": 53, "Relu": 49}``."""
        return onnx_graph.count_operators(self._model)

    @property
    def opset(self) -> int:
        """The model's default-domain opset (``quantize()`` raises it to 13 when lower)."""
        return onnx_graph.default_opset(self._model)

    @property
    def is_calibrated(self) -> bool:
        """Flag to check if the module holds calibration statistics."""
        return bool(self._calibration)

    @property
    def is_quantized(self) -> bool:
        """Flag to check if the model is quantized: by :meth:`quantize`, or holding QDQ/integer ops on arrival."""
        return self._quantization is not None or self._arrived_quantized

    @property
    def quantization_info(self) -> ONNXQuantization | None:
        """How :meth:`quantize` quantized the model (settings, each tensor's scales), else None."""
        return self._quantization

    def copy(self) -> ONNXModule:
        """A deep copy: the model, the original export checks against, calibration data and quantization info.

        Useful as a checkpoint before :meth:`quantize`, e.g. to try several
        calibration methods on one calibration.
        """
        import copy as copy_lib

        other = ONNXModule.__new__(ONNXModule)
        other._source = self._source
        other._model = self.model
        other._original = other._model if self._original is self._model else onnx_graph.copy_model(self._original)
        other._calibration = self._calibration.copy() if self._calibration is not None else None
        other._check_samples = [dict(sample) for sample in self._check_samples]
        other._quantization = copy_lib.deepcopy(self._quantization)
        other._arrived_quantized = self._arrived_quantized
        return other

    def __copy__(self) -> ONNXModule:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> ONNXModule:
        return self.copy()

    # ------------------------------------------------------------------
    # Transforms
    # ------------------------------------------------------------------

    def set_batch_size(self, batch_size: int) -> None:
        """Sets the model's batch-size

        The leading dimension of every input and output becomes
        ``batch_size`` (a symbolic one is bound, a fixed one replaced),
        intermediate ``value_info`` is dropped and every shape inferred again
        (``onnx.shape_inference`` in strict mode); onnxruntime then runs the
        model once on zeros to prove it runs at the new batch. The original
        model that :meth:`export` checks against follows. Unlike
        ``IRModule.set_batch_size``, a node that spells out the old batch
        (``Reshape`` to ``[1, 2048]``) is not rewritten: the error names it.
        Calibration data stays valid.

        Args:
            batch_size: The desired batch-size for the model.

        Returns:
            None. This method operates in place.

        Raises:
            ValueError: ``batch_size`` is not a positive integer, or a node keeps
                the old batch; the error names it.
        """
        model = onnx_graph.set_batch_size(self._model, batch_size)
        original = model if self._original is self._model else onnx_graph.set_batch_size(self._original, batch_size)
        self._model, self._original = model, original
        if self._check_samples:
            from forge_tensorrt.onnx_quantize import rebatch_samples

            self._check_samples = rebatch_samples(self._check_samples, int(batch_size))

    # ------------------------------------------------------------------
    # Calibration and quantization
    # ------------------------------------------------------------------

    def calibrate(self, calib_data: Iterable[Any], reset: bool = True, use_cuda: bool = True) -> None:
        """Calibrates the model by tracking the statistics of the activations quantization reads.

        onnxruntime runs the model with the inputs of every ``Conv``,
        ``MatMul`` and ``Gemm`` exposed as extra outputs, one sample at a time;
        each sample's values are folded into the same numpy statistics
        ``IRModule.calibrate`` keeps (per-sample extrema, a histogram of
        ``|x|``) and dropped. The first 8 samples are kept for :meth:`export`'s
        accuracy check.

        Args:
            calib_data: An iterable of samples: each an array (single-input
                models), a tuple or list of arrays in input order, or a dict
                keyed by input name, matching ``input_shapes`` and
                ``input_dtypes`` (never cast).
            reset: If True, previous calibration data is cleared first.
                Defaults to True.
            use_cuda: If True, onnxruntime's CUDA provider runs the samples
                when present; else the CPU (logged once). Default is True.

        Returns:
            None. This method operates in place.

        Raises:
            ValueError: ``calib_data`` is not an iterable of samples, holds
                none, or a sample does not fit the inputs (the error names the
                sample's index, the input, and the expected and given shape or
                dtype); the model is already quantized.
        """
        from forge_tensorrt.onnx_quantize import calibrate

        if self.is_quantized:
            raise ModelStateError("the model is already quantized; calibrate the float model")
        data, samples = calibrate(self._model, calib_data, previous=None if reset else self._calibration,
                                  kept=None if reset else self._check_samples, use_cuda=use_cuda)
        self._calibration, self._check_samples = data, samples

    def quantize(
        self,
        activation_dtype: str = _Q.activation_dtype,
        kernel_dtype: str | None = _Q.kernel_dtype,
        bias_dtype: str | None = _Q.bias_dtype,
        per_channel: bool = _Q.per_channel,
        calib_method: str = _Q.calib_method,
        quant_type: str = _Q.quant_type,
        *,
        exclude: Iterable[str] = _Q.exclude,
        percentile: float = _Q.percentile,
    ) -> None:
        """Quantizes the model to QDQ ONNX, placed the way TensorRT reads it.

        A QuantizeLinear -> DequantizeLinear pair goes on the activation input
        of every ``Conv``, ``MatMul`` and ``Gemm`` with an initializer weight:
        per tensor, symmetric int8 (zero point 0, scale = max(|low|, |high|) /
        127 over the calibrated range). Weights become int8 initializers read
        through DequantizeLinear, symmetric, per output channel with
        ``per_channel=True`` (``axis`` 0 for
        Conv, the last axis for MatMul, by ``transB`` for Gemm). Biases and
        every other operator stay float. A model below opset 13 (per-axis
        DequantizeLinear) is upgraded. The parameters are ``IRModule.quantize``'s,
        with the values TensorRT takes.

        Note: Quantization is static only: TensorRT needs calibrated scales, so
        ``quant_type="dynamic"`` raises. The defaults are ``IRModule.quantize``'s
        (one each, :data:`forge_core.settings.QUANTIZE_DEFAULTS`): pass
        ``per_channel=True`` for the per-channel weight scales TensorRT
        recommends.

        Args:
            activation_dtype: "int8" (TensorRT's Q/DQ are int8; "uint8" raises).
            kernel_dtype: None or "int8".
            bias_dtype: None or "float32": biases stay float (TensorRT folds
                them into the int8 kernel); an integer dtype raises.
            per_channel: If True, one weight scale per output channel (what
                TensorRT recommends); else (the default) one per weight tensor.
            calib_method: "average", "entropy", "minmax", "percentile" or
                "mse", as ``IRModule.quantize`` derives ranges ("mse" weighs
                the rounding of the symmetric grid); default "average".
            quant_type: "static" or "any" (both static; calibration required).
            exclude: Node names (or, for an unnamed node, its first output)
                to keep float.
            percentile: The cut-off of the "percentile" method, e.g. 99.99.

        Returns:
            None. This method operates in place.

        Raises:
            ValueError: A setting TensorRT cannot take or that is unknown; no
                calibration; an already quantized model; an ``exclude`` name
                that is no node; an opset the converter cannot raise to 13.
        """
        from forge_tensorrt.onnx_quantize import quantize

        if self.is_quantized:
            raise ModelStateError("the model is already quantized; quantize the float model")
        model, info = quantize(self._model, self._calibration, activation_dtype=activation_dtype,
                               kernel_dtype=kernel_dtype, bias_dtype=bias_dtype, per_channel=per_channel,
                               calib_method=calib_method, quant_type=quant_type, exclude=exclude,
                               percentile=percentile)
        self._model, self._quantization = model, info

    # ------------------------------------------------------------------
    # Export and TensorRT
    # ------------------------------------------------------------------

    def export(self, path: str | os.PathLike[str], uuid: str | None = None, is_tensorrt: bool = True,
               force_overwrite: bool = False, *, min_sqnr_db: float = 20.0) -> dict[str, Any]:
        """Checks the model and writes it as an ONNX file, with ``<stem>_metadata.json`` beside it.

        Before writing, ``onnx.checker.check_model(full_check=True)`` must pass
        and onnxruntime must match the original model (the one this module was
        built from, at the current batch size): within rtol = atol = 1e-5 for a
        float model on seeded random inputs; output SQNR >= ``min_sqnr_db`` on
        the first calibration samples after :meth:`quantize`. A failed check
        raises and writes nothing; the files are staged and moved in with
        ``os.replace``.

        The metadata holds ``uuid``, ``forge_version``, ``opset``, ``inputs``
        and ``outputs`` (as ``TensorSpec.to_json``), ``precision``
        ("float32", "int8" after :meth:`quantize`, "quantized" for a model
        that arrived quantized), ``is_tensorrt``, ``quantization`` (settings
        and every scale, else null), ``check`` (what was measured) and
        ``model`` (file name and sha256).

        Args:
            path: The ONNX file to write, e.g. "model.onnx".
            uuid: Validated; a random uuid4 when None.
            is_tensorrt: If True (default), the file is made for TensorRT's
                parser: opset raised to 13 or more, and refused (naming the
                node) if it holds custom-domain operators, integer operators
                other than Q/DQ, or non-zero zero points. Recorded in the
                metadata.
            force_overwrite: If False, an existing ONNX or metadata file
                raises ``ValueError`` naming it.
            min_sqnr_db: The quantized model's accuracy bar, in dB.

        Returns:
            The metadata written.

        Raises:
            ValueError: A bad option, or a file that exists without
                ``force_overwrite``.
            ONNXExportError: A check failed (a ``forge.CompilationError``).
        """
        from forge_tensorrt.onnx_export import export

        precision = "int8" if self._quantization is not None else "quantized" if self._arrived_quantized else "float32"
        return export(self._model, self._original, path, uuid=uuid, is_tensorrt=is_tensorrt,
                      force_overwrite=force_overwrite, precision=precision,
                      quantization=self._quantization.to_json() if self._quantization is not None else None,
                      check_samples=self._check_samples, min_sqnr_db=min_sqnr_db)

    @staticmethod
    def build_engine(onnx_path: str | os.PathLike[str], engine_path: str | os.PathLike[str] | None = None, *,
                     workspace_bytes: int = 1 << 30, force_overwrite: bool = False) -> str:
        """Builds a TensorRT engine from an exported ONNX file; returns the engine's path.

        Needs the ``tensorrt`` package and a CUDA GPU. TensorRT's ONNX parser
        reads the file; the int8 flag is set when it holds QDQ (explicit
        quantization: the scales are used as they are).

        Args:
            onnx_path: A file written by :meth:`export`.
            engine_path: Where to write the serialized engine; default the
                ONNX path with suffix ``.engine``.
            workspace_bytes: TensorRT's workspace memory pool limit.
            force_overwrite: If False, an existing engine file raises ``ValueError``.

        Raises:
            TensorRTUnavailableError: No ``tensorrt`` package or no CUDA GPU.
            forge.CompilationError: TensorRT's parser or builder failed.
        """
        from forge_tensorrt.onnx_export import build_engine

        return build_engine(onnx_path, engine_path, workspace_bytes=workspace_bytes, force_overwrite=force_overwrite)

    # ------------------------------------------------------------------
    # Display
    # ------------------------------------------------------------------

    def summary(self) -> str:
        """A text summary: inputs, outputs, opset, flags and operator counts."""
        ops = self.operators
        lines = [
            f"ONNXModule: {self.input_count} input(s), {self.output_count} output(s), {sum(ops.values())} nodes "
            f"of {len(ops)} kinds, opset {self.opset}",
            "Inputs:", *[f"  {spec.describe()}" for spec in self.input_specs],
            "Outputs:", *[f"  {spec.describe()}" for spec in self.output_specs],
            f"Flags: is_calibrated={self.is_calibrated}, is_quantized={self.is_quantized}",
            "Operators:",
        ]
        width = max((len(name) for name in ops), default=0)
        lines += [f"  {name:<{width}}  {count:>6}" for name, count in ops.items()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self.input_specs)
        outs = ", ".join(s.describe() for s in self.output_specs)
        ops = self.operators
        top = ", ".join(f"{k}={v}" for k, v in list(ops.items())[:6])
        return (f"<forge.ONNXModule inputs=[{ins}] outputs=[{outs}] ops={{{top}{', ...' if len(ops) > 6 else ''}}} "
                f"opset={self.opset} quantized={self.is_quantized}>")

    def __str__(self) -> str:
        return self.summary()
