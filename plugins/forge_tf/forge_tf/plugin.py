"""The entry point Forge loads: registers the ``tensorflow``, ``keras`` and ``tflite`` frontends.

TensorFlow, Keras and tflite are imported when a loader is first called, never
when Forge loads this plugin.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from forge_core.errors import MissingDependencyError
from forge_core.hookspecs import hookimpl

_FRAMEWORK_MODULES = ("tensorflow", "keras", "tflite")


def _lazy(module: str, function: str, public_name: str) -> Callable[..., Any]:
    def load(*args: Any, **kwargs: Any) -> Any:
        try:
            loader = getattr(importlib.import_module(module), function)
        except ModuleNotFoundError as exc:
            if exc.name not in _FRAMEWORK_MODULES:
                raise
            raise MissingDependencyError(
                f"forge.{public_name} needs {exc.name}, which is not installed. "
                "Install it with: pip install 'forge-core[tf]'",
                name=exc.name,
            ) from exc
        return loader(*args, **kwargs)

    load.__name__ = load.__qualname__ = public_name
    return load


@hookimpl
def register_frontends(register: Callable[..., None]) -> None:
    register("tensorflow", _lazy("forge_tf.graph_loader", "load_tensorflow", "from_tensorflow"),
             description="Frozen GraphDef, SavedModel or tf.function, via TFLite; tf2onnx fallback")
    register("keras", _lazy("forge_tf.keras_loader", "load_keras", "from_keras"),
             description="keras.Model via TFLite, NCHW or NHWC inputs; tf2onnx fallback")
    register("tflite", _lazy("forge_tf.tflite_loader", "load_tflite", "from_tflite"),
             description="TFLite flatbuffer, float or int8/uint8 quantized; tf2onnx fallback")
