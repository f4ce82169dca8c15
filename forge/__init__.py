"""Forge: load a trained model, inspect and transform it, compile it for a device.

This package is the public API; it is a thin facade over :mod:`forge_core`.
Importing it imports TVM, never torch or tensorflow.
"""

from __future__ import annotations

from typing import Any

from forge_core import __version__
from forge_core.errors import (
    ArtifactCorruptedError,
    CompilationError,
    CorruptKeyError,
    CorruptLibraryError,
    DecryptionError,
    FileAccessError,
    ForgeError,
    InputError,
    InvalidModelError,
    KeyIgnoredWarning,
    ModelQuirkWarning,
    KeyMismatchError,
    MissingKeyError,
    MissingPasswordError,
    ModelImportError,
    ModelStateError,
    OperatorConversionError,
    OptionError,
    OptionTypeError,
    PluginConflictError,
    PluginError,
    PluginNotInstalledError,
    PluginResultError,
    RemoteDeviceError,
    TargetError,
    TrackerUnreachableError,
    UnsupportedOperatorError,
    WeakPasswordWarning,
    WrongPasswordError,
)
from forge_core.deploy import bundle
from forge_core.graph import Graph, Node
from forge_core.ir.module import IRModule, RelayModule
from forge_core.loaders import from_keras, from_onnx, from_tensorflow, from_tflite, from_torch, load
from forge_core.passes import PassInfo, list_passes
from forge_core.plugin_manager import PluginInfo, get_plugin_manager
from forge_core.runtime.engine import Runtime
from forge_core.runtime.signature import DYNAMIC_DIM, TensorSpec
from forge_core.remote.devices import RemoteDevices
from forge_core.targets.listing import (
    list_android_tags,
    list_arm_tags,
    list_cuda_tags,
    list_target_tags,
    list_x86_tags,
)


def __getattr__(name: str) -> Any:
    """``forge.ONNXModule`` comes from the registered ``tensorrt`` plugin, imported on first use."""
    if name == "ONNXModule":
        plugin = get_plugin_manager().plugin("tensorrt", kind="module", extra="tensorrt")
        try:
            return plugin.ONNXModule
        except ImportError as exc:  # the cause names the missing module (onnx, onnxruntime)
            raise PluginNotInstalledError("module", "ONNXModule", extra="tensorrt") from exc
    raise AttributeError(f"module 'forge' has no attribute {name!r}")


def list_plugins() -> list[PluginInfo]:
    """List every loaded Forge plugin: its name, version, distribution and the hooks it implements."""
    return get_plugin_manager().list_plugins()


__all__ = [
    "__version__",
    "IRModule",
    "RelayModule",
    "ONNXModule",
    "Graph",
    "Node",
    "list_passes",
    "PassInfo",
    "TensorSpec",
    "DYNAMIC_DIM",
    "from_onnx",
    "from_torch",
    "from_tensorflow",
    "from_keras",
    "from_tflite",
    "load",
    "list_plugins",
    "list_target_tags",
    "list_cuda_tags",
    "list_x86_tags",
    "list_arm_tags",
    "list_android_tags",
    "Runtime",
    "bundle",
    "PluginInfo",
    "ForgeError",
    "PluginError",
    "PluginResultError",
    "OptionError",
    "OptionTypeError",
    "ModelStateError",
    "PluginNotInstalledError",
    "PluginConflictError",
    "ModelImportError",
    "InvalidModelError",
    "UnsupportedOperatorError",
    "OperatorConversionError",
    "InputError",
    "TargetError",
    "CompilationError",
    "ArtifactCorruptedError",
    "FileAccessError",
    "RemoteDevices",
    "RemoteDeviceError",
    "TrackerUnreachableError",
    "DecryptionError",
    "MissingKeyError",
    "MissingPasswordError",
    "WrongPasswordError",
    "CorruptKeyError",
    "CorruptLibraryError",
    "KeyMismatchError",
    "WeakPasswordWarning",
    "KeyIgnoredWarning",
    "ModelQuirkWarning",
]
