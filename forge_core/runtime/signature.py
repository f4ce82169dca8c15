"""Tensor signatures and the checks of inputs against them.

This module belongs to the runtime side: it imports numpy only, so that the
light runtime and the compiler side share one definition of what a model
expects.

A dynamic dimension is written ``-1`` in every shape Forge reports
(:attr:`forge.IRModule.input_shapes`, the runtime's ``input_shapes``, the
metadata JSON). An input may take any non-negative size in that dimension.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forge_core.errors import InputError, UnsupportedFeatureError

DYNAMIC_DIM = -1
"""How a dynamic (unknown until run time) dimension appears in shapes."""

RUN_TIME_CHECK = "Forge run-time check: "
"""How the message of a check that a converter compiles into a dynamic model starts (``R.assert_op``): a size
the model cannot compute right at, found when it runs. The runtime raises :class:`InputError` with the message."""


class SignatureSurface:
    """The input and output properties shared by ``IRModule``, ``Runtime`` and ``ONNXModule``.

    A class provides ``input_specs`` and ``output_specs`` (lists of
    :class:`TensorSpec`); this mixin derives the eight properties of the docs
    from them.
    """

    @property
    def input_specs(self) -> list[TensorSpec]:
        raise UnsupportedFeatureError(f"{type(self).__name__} does not define input_specs(), which its base class leaves to it")

    @property
    def output_specs(self) -> list[TensorSpec]:
        raise UnsupportedFeatureError(f"{type(self).__name__} does not define output_specs(), which its base class leaves to it")

    @property
    def input_count(self) -> int:
        """The number of inputs the model expects."""
        return len(self.input_specs)

    @property
    def input_names(self) -> list[str]:
        """The names of the model's inputs."""
        return [s.name for s in self.input_specs]

    @property
    def input_shapes(self) -> list[tuple[int, ...] | None]:
        """The shape of each input; ``-1`` marks a dynamic dimension."""
        return [s.shape for s in self.input_specs]

    @property
    def input_dtypes(self) -> list[str]:
        """The data type of each input."""
        return [s.dtype for s in self.input_specs]

    @property
    def output_count(self) -> int:
        """The number of outputs the model produces."""
        return len(self.output_specs)

    @property
    def output_names(self) -> list[str]:
        """The names of the model's outputs (``output_<i>`` when the source had none)."""
        return [s.name for s in self.output_specs]

    @property
    def output_shapes(self) -> list[tuple[int, ...] | None]:
        """The shape of each output; ``-1`` marks a dynamic dimension."""
        return [s.shape for s in self.output_specs]

    @property
    def output_dtypes(self) -> list[str]:
        """The data type of each output."""
        return [s.dtype for s in self.output_specs]


@dataclass(frozen=True)
class TensorSpec:
    """The name, shape and dtype of one model input or output."""

    name: str
    shape: tuple[int, ...] | None
    """Dimensions, ``-1`` where dynamic; ``None`` when even the rank is unknown."""
    dtype: str
    dims: tuple[int | str, ...] | None = field(default=None, compare=False)
    """The model's own dims where it names them: an ``int`` where static, the symbolic dim's name (``"batch"``,
    ``"h"``) or expression where dynamic. Inputs that share a name must share its size. ``None`` when unknown."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "shape": None if self.shape is None else list(self.shape),
                                "dtype": self.dtype}
        if self.dims is not None and any(isinstance(d, str) for d in self.dims):
            data["dims"] = list(self.dims)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        shape, dims = data.get("shape"), data.get("dims")
        return cls(str(data["name"]), None if shape is None else tuple(int(d) for d in shape), str(data["dtype"]),
                   None if dims is None else tuple(d if isinstance(d, str) else int(d) for d in dims))

    def describe(self) -> str:
        """``"name: (1, 3, ?, ?) float32"``, with ``?`` for a dynamic dimension."""
        return f"{self.name}: {format_shape(self.shape)} {self.dtype}"


def shape_matches(expected: tuple[int, ...] | None, given: Sequence[int]) -> bool:
    """Whether ``given`` fits ``expected``, where ``-1`` matches any size."""
    if expected is None:
        return True
    if len(expected) != len(given):
        return False
    return all(e == DYNAMIC_DIM or e == g for e, g in zip(expected, given))


def format_shape(shape: Sequence[int] | None, dims: Sequence[int | str] | None = None) -> str:
    """A shape as Python writes a tuple, ``?`` for a dynamic dimension (or its name from ``dims``), ``(any)`` for
    unknown rank."""
    if shape is None:
        return "(any)"
    names = list(dims) if dims is not None and len(dims) == len(shape) else [None] * len(shape)
    text = [str(n) if d == DYNAMIC_DIM and isinstance(n, str) else "?" if d == DYNAMIC_DIM else str(d)
            for d, n in zip(shape, names)]
    return "(" + ", ".join(text) + ("," if len(shape) == 1 else "") + ")"


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_shared_dims(specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray]) -> None:
    """Inputs that name the same dynamic dim give it the same size (``input_ids`` and ``attention_mask``)."""
    seen: dict[str, tuple[str, int]] = {}
    for index, (spec, value) in enumerate(zip(specs, arrays)):
        if spec.dims is None or spec.shape is None or len(spec.dims) != value.ndim:
            continue
        for axis, (dim, size) in enumerate(zip(spec.dims, value.shape)):
            if not isinstance(dim, str) or not _IDENTIFIER.fullmatch(dim):
                continue
            if dim not in seen:
                seen[dim] = (spec.name, int(size))
            elif seen[dim][1] != size:
                other, other_size = seen[dim]
                raise InputError(
                    f"Input {spec.name!r} (#{index}): dim {axis} is the model's dynamic dim {dim!r}, which input "
                    f"{other!r} gives as {other_size}; given {size}. Inputs {format_shape(spec.shape, spec.dims)} "
                    f"share it: give them the same size."
                )


@contextmanager
def explained_run_errors(specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray]) -> Iterator[None]:
    """Runs the model inside: a failure that :func:`run_error` explains becomes its :class:`InputError`."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
        error = run_error(specs, arrays, exc)
        if error is None:
            raise
        raise error from exc


def run_error(specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray], error: BaseException) -> InputError | None:
    """An :class:`InputError` for a run that failed because the model's own dims disagree at the given sizes.

    A dynamic model may require relations between its dims that its inputs' shapes do not show (a detector's
    height a multiple of 32, so that its upsampled features add up). The compiled code checks them when it runs
    (TVM's ``match_cast``); this turns that failure into an error naming the inputs' shapes. None for any other
    failure.
    """
    text = str(error)
    given = ", ".join(f"{spec.name}: {format_shape(value.shape)}" for spec, value in zip(specs, arrays))
    if RUN_TIME_CHECK in text:
        check = text[text.index(RUN_TIME_CHECK) + len(RUN_TIME_CHECK):].strip().splitlines()[0]
        return InputError(f"The model cannot run on these inputs ({given}): {check}")
    # A kernel's own argument check ("Mismatched x.shape[0] on argument #1 when calling: ..., expected to match
    # a.shape[0]") where the check before it was folded away: the same disagreement, caught one call later.
    kernel_check = text.lstrip().startswith("Mismatched ") and "expected to match" in text
    if "match_cast" not in text and "ErrorContext" not in text and not kernel_check:
        return None
    lines = [line.strip() for line in text.strip().splitlines()]
    detail = f"{lines[0]} {lines[-1]}" if kernel_check else \
        next((line for line in lines if "Check failed" in line), lines[-1])
    allowed = ", ".join(f"{spec.name}: {format_shape(spec.shape, spec.dims)}" for spec in specs)
    return InputError(
        f"The model cannot run at these input sizes ({given}); it takes {allowed}, and at these sizes two of its "
        f"dims that must be equal differ (the framework it came from refuses them too; a detector's height and "
        f"width often must be multiples of its largest stride, e.g. 32). TVM: {detail}"
    )


def check_inputs(specs: Sequence[TensorSpec], arrays: Sequence[Any]) -> list[np.ndarray]:
    """Check positional inputs against ``specs`` and return them as numpy arrays.

    Raises :class:`forge_core.errors.InputError` naming the input and the
    expected and given count, dtype or shape. Inputs are never cast silently.
    """
    if len(arrays) != len(specs):
        names = ", ".join(repr(s.name) for s in specs)
        raise InputError(
            f"The model takes {len(specs)} input{'s' if len(specs) != 1 else ''} ({names}); "
            f"{len(arrays)} {'were' if len(arrays) != 1 else 'was'} given."
        )
    checked = []
    for index, (spec, value) in enumerate(zip(specs, arrays)):
        if not isinstance(value, np.ndarray):
            if hasattr(value, "numpy") and callable(value.numpy):
                value = value.numpy()
            else:
                value = np.asarray(value)
        given_dtype = str(value.dtype)
        if given_dtype != spec.dtype:
            raise InputError(
                f"Input {spec.name!r} (#{index}): expected dtype {spec.dtype}, given {given_dtype}. "
                f"Convert it with array.astype({spec.dtype!r})."
            )
        if not shape_matches(spec.shape, value.shape):
            raise InputError(
                f"Input {spec.name!r} (#{index}): expected shape {format_shape(spec.shape)}, "
                f"given {format_shape(value.shape)}."
            )
        if not value.flags.c_contiguous:
            value = np.require(value, requirements="C")  # ascontiguousarray would make 0-d arrays 1-d
        checked.append(value)
    _check_shared_dims(specs, checked)
    return checked


def random_inputs(specs: Sequence[TensorSpec], seed: int = 0, dynamic_size: int = 1) -> list[np.ndarray]:
    """Random arrays matching ``specs`` (dynamic dimensions set to ``dynamic_size``): normal floats, integers 0
    or 1."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        shape = tuple(dynamic_size if d == DYNAMIC_DIM else d for d in (spec.shape or ()))
        if np.issubdtype(np.dtype(spec.dtype), np.floating):
            arrays.append(rng.standard_normal(shape).astype(spec.dtype))
        elif spec.dtype == "bool":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(spec.dtype))
    return arrays
