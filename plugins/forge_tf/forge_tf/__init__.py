"""Forge's TensorFlow frontend plugin: ``forge.from_tensorflow``, ``forge.from_keras``, ``forge.from_tflite``.

Importing this package imports neither TensorFlow, Keras nor tflite; the
loaders do, when first used.
"""

from typing import Any

__all__ = ["load_tensorflow", "load_keras", "load_tflite"]

_LOADERS = {
    "load_tensorflow": "forge_tf.graph_loader",
    "load_keras": "forge_tf.keras_loader",
    "load_tflite": "forge_tf.tflite_loader",
}


def __getattr__(name: str) -> Any:
    if name in _LOADERS:
        import importlib

        return getattr(importlib.import_module(_LOADERS[name]), name)
    raise AttributeError(f"module 'forge_tf' has no attribute {name!r}")
