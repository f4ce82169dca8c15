"""From a frozen function to a Relax module: the TFLite route first, tf2onnx as the logged fallback.

The direct route (:mod:`forge_tf.tflite_route`) converts with TensorFlow's
TFLite converter and TVM's TFLite importer. When it fails, or fixes a
dimension that was asked to stay dynamic, the fallback
(:mod:`forge_tf.onnx_fallback`) converts the same function with tf2onnx and
loads it with the ``onnx`` frontend, and one warning on the ``forge.tf``
logger says why. When both fail, the error shows both causes; if the direct
route found unsupported operators, it is an
:class:`~forge_core.errors.UnsupportedOperatorError` listing them.
"""

from __future__ import annotations

import logging

import tvm

from forge_core.errors import ForgeError, ModelImportError, UnsupportedOperatorError
from forge_tf import onnx_fallback, tflite_route
from forge_tf.console import one_line
from forge_tf.frozen_function import FrozenFunction

logger = logging.getLogger("forge.tf")


def import_function(
    frozen: FrozenFunction,
    loader: str,
    *,
    fallback_to_onnx: bool = True,
    onnx_opset: int = onnx_fallback.DEFAULT_ONNX_OPSET,
) -> tvm.IRModule:
    """A Relax module of ``frozen``; ``loader`` (``"from_keras"``...) names the caller in messages."""
    frontend = loader.removeprefix("from_")
    try:
        mod = tflite_route.import_through_tflite(frozen, frontend)
    except ForgeError as direct_error:
        if not fallback_to_onnx:
            raise
        try:
            onnx_model = onnx_fallback.onnx_from_function(frozen, onnx_opset)
            mod = onnx_fallback.import_through_onnx(onnx_model, frozen.inputs, loader)
        except Exception as onnx_error:  # noqa: BLE001 - report both routes whatever failed
            if isinstance(direct_error, UnsupportedOperatorError):
                raise UnsupportedOperatorError(
                    direct_error.frontend, direct_error.unsupported,
                    f"The ONNX fallback (tf2onnx) failed too: {one_line(onnx_error)}",
                ) from onnx_error
            raise ModelImportError(
                f"{loader}: both routes failed.\nTFLite route: {one_line(direct_error)}\n"
                f"ONNX route (tf2onnx): {one_line(onnx_error)}"
            ) from onnx_error
        logger.warning("%s: loaded through tf2onnx and ONNX, because the TFLite route failed: %s",
                       loader, one_line(direct_error))
        return mod
    logger.info("%s: loaded %s through TFLite", loader, frozen.source)
    return mod
