"""The ONNX route: ``torch.onnx.export`` then whichever plugin registered the ``onnx`` frontend.

TorchScript modules always take it (TVM has no TorchScript importer); other
models take it when the direct route fails. PyTorch's fused inference kernels
that a trace may hold (``nn.TransformerEncoderLayer``'s and
``nn.MultiheadAttention``'s fast paths) are decomposed while exporting
(:mod:`forge_torch.fast_path_symbolics`).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from forge_core.errors import ModelImportError
from forge_core.ir.module import IRModule
from forge_core.loaders import load
from forge_torch import fast_path_symbolics
from forge_torch.input_infos import InputInfo


def export_onnx(model: Any, examples: tuple[torch.Tensor, ...], infos: Sequence[InputInfo],
                output_names: Sequence[str], opset: int) -> bytes:
    # A dynamic leading axis is the batch, shared by every input; other dynamic axes are named per input.
    dynamic_axes = {
        info.name: {axis: "batch" if axis == 0 else f"{info.name}_dim{axis}" for axis in info.dynamic_axes}
        for info in infos if info.dynamic_axes
    }
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), fast_path_symbolics.registered(opset):
            # The TorchScript-based exporter is deprecated in favour of the dynamo one, which cannot take
            # TorchScript modules; it is still the one that handles both.
            warnings.simplefilter("ignore", DeprecationWarning)
            # A TorchScript module's methods have no Python signature; the exporter notes it for every export.
            warnings.filterwarnings("ignore", message="no signature found for", category=UserWarning)
            torch.onnx.export(
                model, examples, buffer, input_names=[i.name for i in infos], output_names=list(output_names),
                dynamic_axes=dynamic_axes or None, opset_version=opset, dynamo=False,
            )
    except Exception as exc:  # noqa: BLE001 - the exporter raises many error types
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        raise ModelImportError(f"torch.onnx.export failed: {type(exc).__name__}: {lines[0] if lines else ''}") from exc
    return buffer.getvalue()


def load_through_onnx(model: Any, examples: tuple[torch.Tensor, ...], infos: Sequence[InputInfo],
                      output_names: Sequence[str], opset: int, **ir_options: Any) -> IRModule:
    onnx_bytes = export_onnx(model, examples, infos, output_names, opset)
    return load("onnx", onnx_bytes, **ir_options)
