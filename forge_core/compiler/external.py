"""Partitions for external code generators (TensorRT...) at compile time.

A partitioner (``ir.partition_for_tensorrt()``) marks functions with
``Codegen: "<name>"``. TVM builds them only through the code generator
``relax.ext.<name>``, which a TVM build has or lacks (this project's wheel
has no ``relax.ext.tensorrt``: measured). Where it exists, TVM's
``RunCodegen`` hands each partition to it before Forge's own passes; where
it does not, compiling fails before any work, naming the ways out.
"""

from __future__ import annotations

import tvm
from tvm import relax

from forge_core.errors import CompilationError

_WAYS_OUT = {
    "tensorrt": (
        "compile it with a TVM built with the TensorRT codegen (USE_TENSORRT_CODEGEN=ON and "
        "USE_TENSORRT_RUNTIME=ON), or export the model with forge.ONNXModule(...).export(...) and build the "
        "TensorRT engine from that ONNX file (the route the docs recommend); ir.inline_partitions() undoes the "
        "partitioning and compiles with TVM alone"
    ),
}


def external_codegens(mod: tvm.IRModule) -> dict[str, list[str]]:
    """The code generators ``mod``'s partitions need: ``{codegen: [function names]}``."""
    found: dict[str, list[str]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs is not None and "Codegen" in func.attrs:
            found.setdefault(str(func.attrs["Codegen"]), []).append(gv.name_hint)
    return found


def run_external_codegens(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its partitions built by their code generators; ``CompilationError`` when one is missing."""
    needed = external_codegens(mod)
    if not needed:
        return mod
    missing = {name: functions for name, functions in needed.items()
               if tvm.get_global_func(f"relax.ext.{name}", allow_missing=True) is None}
    for name, functions in sorted(missing.items()):
        ways = _WAYS_OUT.get(name, f"compile it with a TVM built with the {name} codegen")
        raise CompilationError(
            f"The module is partitioned for {name} ({len(functions)} subgraph{'s' if len(functions) != 1 else ''}: "
            f"{', '.join(sorted(functions)[:4])}{', ...' if len(functions) > 4 else ''}), and this TVM build has no "
            f"{name} code generator (relax.ext.{name} is not registered). To run it, {ways}."
        )
    return relax.transform.RunCodegen()(mod)
