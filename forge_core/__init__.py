"""forge_core: the core of Forge. Users import :mod:`forge`, its public face."""

from importlib.metadata import PackageNotFoundError, version

from forge_core.tvm_import import prepare_imports

prepare_imports()  # tvm_ffi without torch; tvm itself is imported where it is used

try:
    __version__ = version("forge-core")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"
