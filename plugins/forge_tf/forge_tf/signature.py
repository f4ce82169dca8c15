"""A model's inputs as Forge converts them: names, shapes with dynamic dimensions, dtypes.

Users override shapes with a ``shape`` dict (``{"image": (None, 224, 224, 3)}``).
A dimension given as ``None`` or ``-1`` (or a string) is dynamic. A dimension
that the model leaves unknown and the user does not give is resolved by
:func:`resolve_unknown_dims`: the batch (axis 0) becomes 1, any other unknown
dimension is an error asking for ``shape``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from forge_core.errors import ModelImportError, OptionTypeError

logger = logging.getLogger("forge.tf")

Dim = int | None
"""A dimension: its size, or None where it is dynamic."""

DEFAULT_BATCH = 1


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape (None where dynamic) and numpy dtype name."""

    name: str
    shape: tuple[Dim, ...] | None
    """None when even the rank is unknown."""
    dtype: str

    @property
    def dynamic_axes(self) -> list[int]:
        """Axes whose size is left to run time."""
        return [axis for axis, size in enumerate(self.shape or ()) if size is None]


def dtype_name(value: Any) -> str:
    """A numpy dtype name (``"float32"``) from a numpy, TensorFlow or string dtype."""
    as_numpy = getattr(value, "as_numpy_dtype", None)
    if as_numpy is not None:
        value = as_numpy
    try:
        return np.dtype(value).name
    except TypeError as exc:
        raise ModelImportError(f"Unknown dtype {value!r}") from exc


def parse_shape(name: str, value: Any) -> tuple[Dim, ...]:
    """A shape given by the user: ``None``, ``-1`` or a string dimension is dynamic."""
    if isinstance(value, (str, bytes)) or (not isinstance(value, Sequence) and not hasattr(value, "__iter__")):
        raise ModelImportError(
            f"shape for input {name!r} is {value!r}; expected a tuple of dimensions such as (1, 224, 224, 3), "
            "with None or -1 for a dynamic one"
        )
    dims: list[Dim] = []
    for dim in value:
        if dim is None or isinstance(dim, str):
            dims.append(None)
            continue
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise ModelImportError(
                f"shape for input {name!r} has dimension {dim!r} of type {type(dim).__name__}; "
                "expected an int, or None or -1 for a dynamic one"
            )
        if int(dim) < -1 or int(dim) == 0:
            raise ModelImportError(f"shape for input {name!r} has dimension {int(dim)}; sizes must be positive")
        dims.append(None if int(dim) == -1 else int(dim))
    return tuple(dims)


def apply_shapes(specs: Sequence[InputSpec], shape: Mapping[str, Any] | None, loader: str) -> list[InputSpec]:
    """``specs`` with the user's ``shape`` overrides applied; unknown input names are an error."""
    if shape is None:
        return list(specs)
    if not isinstance(shape, Mapping):
        raise OptionTypeError(
            f"{loader}: shape must be a dict of input name to shape, e.g. {{'input_1': (1, 224, 224, 3)}}, "
            f"not {type(shape).__name__}"
        )
    by_name = {spec.name: spec for spec in specs}
    unknown = [name for name in shape if name not in by_name]
    if unknown:
        raise ModelImportError(
            f"{loader}: shape names input {unknown[0]!r}, which the model does not have. "
            f"Inputs: {', '.join(by_name) or 'none'}"
        )
    updated = []
    for spec in specs:
        if spec.name not in shape:
            updated.append(spec)
            continue
        dims = parse_shape(spec.name, shape[spec.name])
        if spec.shape is not None and len(dims) != len(spec.shape):
            raise ModelImportError(
                f"{loader}: shape for input {spec.name!r} has rank {len(dims)}: {_show(dims)}; the model's input has "
                f"rank {len(spec.shape)}: {_show(spec.shape)}"
            )
        updated.append(replace(spec, shape=dims))
    return updated


def resolve_unknown_dims(specs: Sequence[InputSpec], given: Mapping[str, Any] | None, loader: str) -> list[InputSpec]:
    """Unknown dimensions the user did not give: the batch becomes 1, others are an error."""
    given = given or {}
    resolved = []
    for spec in specs:
        if spec.name in given:
            resolved.append(spec)
            continue
        if spec.shape is None:
            raise ModelImportError(
                f"{loader}: the rank of input {spec.name!r} is unknown; give its shape, e.g. "
                f"shape={{{spec.name!r}: (1, 224, 224, 3)}}"
            )
        dims = list(spec.shape)
        for axis in spec.dynamic_axes:
            if axis != 0:
                raise ModelImportError(
                    f"{loader}: input {spec.name!r} has an unknown dimension at axis {axis} "
                    f"({_show(spec.shape)}); give its size in shape, or None/-1 there to keep it dynamic"
                )
            dims[0] = DEFAULT_BATCH
            logger.info("%s: input %r has an unknown batch; using %d (pass shape={%r: (None, ...)} to keep it "
                        "dynamic)", loader, spec.name, DEFAULT_BATCH, spec.name)
        resolved.append(replace(spec, shape=tuple(dims)))
    return resolved


def _show(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
