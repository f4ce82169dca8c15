"""``input_infos`` as the docs give it, turned into example tensors and dynamic shapes."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from forge_core.errors import ModelImportError

_DTYPES = {
    "float": torch.float32, "float32": torch.float32, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
    "int": torch.int64, "int64": torch.int64, "long": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}

# torch.export specializes sizes 0 and 1; an example of a dynamic dimension must be larger.
EXAMPLE_DYNAMIC_SIZE = 2


@dataclass(frozen=True)
class InputInfo:
    name: str
    shape: tuple[int | None, ...]
    """None where the dimension is dynamic."""
    dtype: torch.dtype

    @property
    def dynamic_axes(self) -> list[int]:
        return [axis for axis, size in enumerate(self.shape) if size is None]

    def example(self, generator: torch.Generator) -> torch.Tensor:
        shape = tuple(EXAMPLE_DYNAMIC_SIZE if s is None else s for s in self.shape)
        if self.dtype.is_floating_point:
            return torch.randn(shape, generator=generator).to(self.dtype)
        return torch.zeros(shape, dtype=self.dtype)


def to_torch_dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    key = str(value).removeprefix("torch.")
    if key not in _DTYPES:
        raise ModelImportError(f"Unknown dtype {value!r} in input_infos; use one of {', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


def parse_input_infos(input_infos: Sequence[Any], default_type: str) -> list[InputInfo]:
    """``[(name, shape)]`` or ``[(name, (shape, dtype))]``; -1 or None marks a dynamic dimension."""
    if isinstance(input_infos, (str, bytes)) or not isinstance(input_infos, Sequence):
        raise ModelImportError(
            f"input_infos is {input_infos!r}; expected a list of (name, shape) or (name, (shape, dtype))"
        )
    parsed = []
    for index, entry in enumerate(input_infos):
        expected = "expected (name, shape) or (name, (shape, dtype)), e.g. ('input0', (1, 3, 224, 224))"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise ModelImportError(f"input_infos[{index}] is {entry!r}; {expected}")
        name, spec = entry
        if not isinstance(name, str):
            raise ModelImportError(f"input_infos[{index}] names its input {name!r}, not a string; {expected}")
        if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], int) and spec[1] is not None \
                and isinstance(spec[0], (tuple, list, torch.Size)):
            shape, dtype = spec
        else:
            shape, dtype = spec, default_type
        parsed.append(InputInfo(name, _dims(index, name, shape), to_torch_dtype(dtype)))
    return parsed


def _dims(index: int, name: str, shape: Any) -> tuple[int | None, ...]:
    """A shape of ``input_infos``: ints, with -1 or None where dynamic."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, torch.Size)):
        raise ModelImportError(
            f"input_infos[{index}] ({name!r}) has the shape {shape!r}; expected a tuple of dimensions such as "
            "(1, 3, 224, 224), with -1 or None for a dynamic one"
        )
    dims: list[int | None] = []
    for dim in shape:
        if dim is None:
            dims.append(None)
        elif isinstance(dim, bool) or not isinstance(dim, (int, torch.SymInt)) and not hasattr(dim, "__index__"):
            raise ModelImportError(
                f"input_infos[{index}] ({name!r}) has the dimension {dim!r} of type {type(dim).__name__} in its "
                "shape; expected an int, or -1 or None for a dynamic one"
            )
        else:
            dims.append(None if int(dim) < 0 else int(dim))
    return tuple(dims)


def infos_from_examples(model: Any, examples: Sequence[torch.Tensor]) -> list[InputInfo]:
    """Names from ``forward``'s signature, shapes and dtypes from the example tensors."""
    try:
        names = [p for p in inspect.signature(model.forward).parameters if p not in ("self",)]
    except (TypeError, ValueError, AttributeError):
        names = []
    infos = []
    for index, tensor in enumerate(examples):
        name = names[index] if index < len(names) else f"input{index}"
        infos.append(InputInfo(name, tuple(tensor.shape), tensor.dtype))
    return infos


def dynamic_shapes_for(infos: Sequence[InputInfo]) -> tuple[dict[int, Any] | None, ...] | None:
    """``torch.export`` dynamic shapes: ``Dim.AUTO`` on every dynamic axis."""
    if not any(info.dynamic_axes for info in infos):
        return None
    return tuple({axis: torch.export.Dim.AUTO for axis in info.dynamic_axes} or None for info in infos)
