"""Names that every code generator accepts: the bindings of a module as C identifiers, before lowering.

The ONNX loader names each binding after its ONNX node (``/conv/Conv``) and each
input after the graph's (``gpu_0/data_0``), which the graph API shows. TVM's
lowering carries those names into the PrimFuncs' parameters and buffers, and
its CUDA code generator writes them into the kernels' source as they are:
``float* __restrict__ /conv/Conv_ptr`` is not C, and the library then fails to
load on a GPU. :func:`plain_names` renames every Relax variable whose name is
not a C identifier, at the start of the build only (the module the user holds
keeps its names): characters outside ``[A-Za-z0-9_]`` become ``_``, a name
that starts with a digit or a reserved ``__`` gets a prefix, a C or CUDA
keyword gets a ``_`` suffix, and a name taken by another variable of the same
function gets ``_1``, ``_2``... in the function's order, so the names are
unique and the same on every run.
"""

from __future__ import annotations

import re

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from forge_core.passes import replace_functions

_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if inline int long
    register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
    bool true false class delete new namespace operator private protected public template this throw try catch
    typename using virtual friend mutable explicit export half dim3 threadIdx blockIdx blockDim gridDim warpSize
""".split())


def c_identifier(name: str) -> str:
    """``name`` as a C identifier (not yet made unique)."""
    plain = _NOT_IDENTIFIER.sub("_", name) or "v"
    if plain[0].isdigit() or plain.startswith("__"):
        plain = "v" + plain
    return plain + "_" if plain in _KEYWORDS else plain


def is_c_identifier(name: str) -> bool:
    return c_identifier(name) == name


@mutator
class _Renamer(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, taken: set[str]) -> None:
        super().__init__(mod)
        self.taken = taken

    def _fresh(self, var: relax.Var) -> relax.Var:
        name = str(var.name)
        if is_c_identifier(name):
            return var
        base = c_identifier(name)
        plain, index = base, 0
        while plain in self.taken:
            index += 1
            plain = f"{base}_{index}"
        self.taken.add(plain)
        kind = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
        return kind(plain, var.ty)

    def visit_var_def_(self, var: relax.Var) -> relax.Var:  # noqa: N802 (TVM's name)
        return self._fresh(var)

    def visit_dataflow_var_def_(self, var: relax.DataflowVar) -> relax.Var:  # noqa: N802 (TVM's name)
        return self._fresh(var)


def _defined_names(func: relax.Function) -> set[str]:
    names = {str(param.name) for param in func.params}
    for block in getattr(func.body, "blocks", []):
        names.update(str(binding.var.name) for binding in block.bindings)
    return names


@tvm.transform.module_pass(opt_level=0, name="forge_plain_names")
def plain_names(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """``mod`` whose Relax variables all have C identifiers as names (see the module's docstring)."""
    updated = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        taken = _defined_names(func)
        if all(is_c_identifier(name) for name in taken):
            continue
        renamed = _Renamer(mod, {name for name in taken if is_c_identifier(name)}).visit_expr(func)
        updated[gv] = renamed
    return replace_functions(mod, updated)
