"""The entry point Forge loads: registers the ``onnx`` frontend (onnx is imported on use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge_core.hookspecs import hookimpl
from forge_onnx.kernel_attrs import RECURRENT_CELL_ATTR


def _load(*args: Any, **kwargs: Any) -> Any:
    from forge_onnx.loader import load_onnx

    return load_onnx(*args, **kwargs)


@hookimpl
def register_frontends(register: Callable[..., None]) -> None:
    register("onnx", _load, description="ONNX ModelProto or .onnx file, via TVM's Relax ONNX importer")


@hookimpl
def register_converters(register: Callable[..., None]) -> None:
    from forge_onnx.converters import catalog

    for (domain, op_type), convert in catalog.all_converters().items():
        register("onnx", op_type, convert, domain=domain,
                 description=convert.__doc__.splitlines()[0] if convert.__doc__ else "")


def _recurrent_kernels(*args: Any, **kwargs: Any) -> Any:
    from forge_onnx.recurrent_schedules import recurrent_kernels

    return recurrent_kernels(*args, **kwargs)


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    # Only modules holding a recurrent kernel (the PrimFuncs forge_onnx's RNN/GRU/LSTM converters mark), any target.
    register("recurrent_kernels", _recurrent_kernels, stage="schedule", function_attrs=(RECURRENT_CELL_ATTR,),
             description="RNN/GRU/LSTM kernels rebuilt for the target: registers, cores, GPU")
