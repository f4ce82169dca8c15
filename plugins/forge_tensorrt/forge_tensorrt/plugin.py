"""The entry point Forge loads: registers the TensorRT partitioning passes (TVM is imported on use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge_core.hookspecs import hookimpl


def __getattr__(name: str) -> Any:
    """``ONNXModule``, imported on first use (``forge.ONNXModule`` reaches it through the plugin registry)."""
    if name == "ONNXModule":
        from forge_tensorrt.onnx_module import ONNXModule

        return ONNXModule
    raise AttributeError(f"module 'forge_tensorrt.plugin' has no attribute {name!r}")


def _pass(name: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        from forge_tensorrt import partition

        return getattr(partition, name)(*args, **kwargs)

    run.__name__ = name
    return run


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    register("partition_for_tensorrt", _pass("partition_for_tensorrt"), stage="transform",
             sets_flags={"is_tensorrt": True},
             description="Carve TensorRT-supported subgraphs out of main (TVM's TensorRT patterns and Forge's flags)")
    register("inline_tensorrt_partitions", _pass("inline_tensorrt_partitions"), stage="transform",
             sets_flags={"is_tensorrt": False},
             description="Inline every partition (and its composites) back into main: the same computation")
    register("tensorrt_remove_stacks", _pass("remove_stacks"), stage="transform",
             description="stack(xs, axis) -> concat of expand_dims: operators TensorRT's bridge takes")
    register("tensorrt_simplify_batch_matmul", _pass("simplify_batch_matmul"), stage="transform",
             description="A batch matmul by a constant with unit batch -> one 2-D matmul between reshapes")
    register("tensorrt_simplify_scalar_add", _pass("simplify_scalar_add"), stage="transform",
             description="A scalar added to a tensor -> a constant of the tensor's rank (broadcast)")
    register("tensorrt_remove_no_mac_subgraphs", _pass("remove_no_mac_subgraphs"), stage="transform",
             description="Inline the TensorRT partitions that hold no convolution or matmul")
