"""Forge's light runtime: load a compiled ``model_library.so`` and run it.

Imports TVM's runtime and numpy only; no frontend, onnx, torch or tensorflow, and nothing of
TVM's compiler library: with ``TVM_USE_RUNTIME_LIB=1`` (or on a machine without
``libtvm_compiler.so``) TVM loads its 3 MB runtime library alone::

    from forge_core.runtime import Runtime

    rt = Runtime("compile_output/model_library.so")
    outputs = rt.infer(x)          # a list of numpy arrays
"""

from forge_core.runtime.engine import Runtime

__all__ = ["Runtime"]
