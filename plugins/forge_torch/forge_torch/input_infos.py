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
    parsed = []
    for index, entry in enumerate(input_infos):
        try:
            name, spec = entry
        except (TypeError, ValueError):
            raise ModelImportError(
                f"input_infos[{index}] is {entry!r}; expected (name, shape) or (name, (shape, dtype))"
            ) from None
        if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], int) and spec[1] is not None \
                and isinstance(spec[0], (tuple, list, torch.Size)):
            shape, dtype = spec
        else:
            shape, dtype = spec, default_type
        dims = tuple(None if (d is None or int(d) < 0) else int(d) for d in shape)
        parsed.append(InputInfo(str(name), dims, to_torch_dtype(dtype)))
    return parsed


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
