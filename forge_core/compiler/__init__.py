"""Compiling an IRModule into a deployable artifact directory."""

from forge_core.compiler.artifact import Artifact
from forge_core.compiler.options import CompileOptions

__all__ = ["Artifact", "CompileOptions"]
