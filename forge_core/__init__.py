"""forge_core: the core of Forge. Users import :mod:`forge`, its public face."""

from importlib.metadata import PackageNotFoundError, version

from forge_core.tvm_import import import_tvm

import_tvm()

try:
    __version__ = version("forge-core")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"
