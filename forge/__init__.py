"""Forge: load a trained model, inspect and transform it, compile it for a device.

This package is the public API; it is a thin facade over :mod:`forge_core`.
Importing it imports TVM, never torch or tensorflow. The compiler side
(``IRModule``, the loaders, ``Graph``, the tag lists...) is imported on first
use, so that ``forge.Runtime`` also works where TVM's runtime library alone is
loaded (``TVM_USE_RUNTIME_LIB=1``, or a board without the compiler library).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from forge_core.plugin_manager import PluginInfo, get_plugin_manager
from forge_core.runtime.engine import Runtime
from forge_core.runtime.signature import DYNAMIC_DIM, TensorSpec

if TYPE_CHECKING:
    from forge_core.graph import Graph, Node
    from forge_core.ir.module import IRModule, RelayModule
    from forge_core.loaders import from_keras, from_onnx, from_tensorflow, from_tflite, from_torch, load
    from forge_core.passes import PassInfo, list_passes
    from forge_core.remote.devices import RemoteDevices
    from forge_core.targets.listing import (
        list_android_tags,
        list_arm_tags,
        list_cuda_tags,
        list_target_tags,
        list_x86_tags,
    )

# The compiler side: each name, and the module it comes from when first used.
_COMPILER_SIDE = {
    **dict.fromkeys(("Graph", "Node"), "forge_core.graph"),
    **dict.fromkeys(("IRModule", "RelayModule"), "forge_core.ir.module"),
    **dict.fromkeys(("from_keras", "from_onnx", "from_tensorflow", "from_tflite", "from_torch", "load"),
                    "forge_core.loaders"),
    **dict.fromkeys(("PassInfo", "list_passes"), "forge_core.passes"),
    "RemoteDevices": "forge_core.remote.devices",
    **dict.fromkeys(("list_android_tags", "list_arm_tags", "list_cuda_tags", "list_target_tags", "list_x86_tags"),
                    "forge_core.targets.listing"),
}


def _compiler_side(name: str) -> Any:
    import importlib

    import tvm

    if getattr(tvm.base, "_RUNTIME_ONLY", False):
        raise ForgeError(
            f"forge.{name} needs TVM's compiler library, and this process loaded TVM's runtime library alone "
            "(TVM_USE_RUNTIME_LIB=1, or the compiler library is not installed): forge.Runtime runs artifacts "
            "here; compile them where forge-core is installed whole, without TVM_USE_RUNTIME_LIB"
        )
    value = getattr(importlib.import_module(_COMPILER_SIDE[name]), name)
    globals()[name] = value
    return value

def __getattr__(name: str) -> Any:
    """The compiler side, imported on first use; ``forge.ONNXModule`` from the registered ``tensorrt`` plugin."""
    if name in _COMPILER_SIDE:
        return _compiler_side(name)
    if name == "ONNXModule":
        plugin = get_plugin_manager().plugin("tensorrt", kind="module", extra="tensorrt")
        try:
            return plugin.ONNXModule
        except ImportError as exc:  # the cause names the missing module (onnx, onnxruntime)
            raise PluginNotInstalledError("module", "ONNXModule", extra="tensorrt") from exc
    raise AttributeError(f"module 'forge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
