"""Forge's light runtime: load a compiled ``model_library.so`` and run it.

Imports numpy and ``tvm_ffi``, which drives TVM's 3 MB runtime library
(:mod:`forge_core.runtime.vm`); no frontend, onnx, torch or tensorflow, not TVM's
Python package, and nothing of TVM's compiler library (``libtvm_compiler.so``)::

    from forge_core.runtime import Runtime

    rt = Runtime("compile_output/model_library.so")
    outputs = rt.infer(x)          # a list of numpy arrays
"""

from forge_core.runtime.engine import Runtime

__all__ = ["Runtime"]
