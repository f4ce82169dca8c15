"""What the compiler, quantization, tuning and the graph API read of a Forge IRModule.

Those modules take a module as this protocol rather than importing
:class:`forge_core.ir.module.IRModule`, which imports them (lazily) in turn:
the module is the one place that knows them all, and none of them knows the
module's class. :class:`~forge_core.ir.module.IRModule` satisfies it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import os

    import numpy as np
    import tvm

    from forge_core.runtime.signature import TensorSpec


class ModuleParts(Protocol):
    """A model in TVM's IR with its weights, as :class:`forge.IRModule` presents it."""

    @property
    def mod(self) -> tvm.IRModule: ...

    @property
    def params(self) -> Mapping[str, Any]: ...

    @property
    def input_specs(self) -> list[TensorSpec]: ...

    @property
    def output_specs(self) -> list[TensorSpec]: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def is_quantized(self) -> bool: ...

    @property
    def quantization_info(self) -> Any: ...

    tuning_database: os.PathLike[str] | str | None

    def from_parts(self, mod: tvm.IRModule, params: Mapping[str, Any] | None = None, *,
                   state: Any = None) -> ModuleParts:
        """A module of the same class from these parts (``IRModule.from_parts``, a classmethod)."""
        ...

    def get_inference_function(self, target: str = "llvm") -> Callable[..., np.ndarray | list[np.ndarray]]: ...

    def copy(self) -> ModuleParts: ...


class EditableModule(ModuleParts, Protocol):
    """A module the graph API edits: every change goes through ``_commit`` (see ``IRModule._commit``)."""

    _state: Any

    def _commit(self, **parts: Any) -> None: ...
