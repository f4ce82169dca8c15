"""The ``forge`` command line."""

from forge_core.cli.app import main

__all__ = ["main"]
