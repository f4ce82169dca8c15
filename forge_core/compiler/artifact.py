"""What a compilation produced, handed to the exporters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm

from forge_core.compiler.options import CompileOptions
from forge_core.compiler.toolchain import Toolchain


@dataclass
class Artifact:
    """A compiled model before it is written.

    Exporters (``register_exporters``) receive it and write files from it.
    """

    executable: Any
    """TVM's ``relax.VMExecutable``."""
    target: tvm.target.Target
    options: CompileOptions
    ir: tvm.IRModule
    """The final Relax module that was built (what ``export_relay`` writes)."""
    metadata: dict[str, Any]
    """The document embedded in the library (``forge_core.runtime.metadata``)."""
    toolchain: Toolchain
    """What links the library for the target's machine."""
    written: dict[str, list[str]] = field(default_factory=dict)
    """Files each exporter wrote, by format, relative to the output directory."""
