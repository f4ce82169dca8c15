"""Deployment: a directory that runs an artifact on its board with Python 3 and numpy alone (``forge bundle``)."""

from forge_core.deploy.bundle import bundle

__all__ = ["bundle"]
