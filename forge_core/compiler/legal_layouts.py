"""Operators in layouts that TVM's legalization cannot lower, moved to one it can before it runs.

TVM's ``LegalizeOps`` lowers ``relax.nn.conv2d_transpose`` only with data in
NCHW and the kernel in IOHW; in any other layout it leaves the call as it is
(with a log line), and the build then fails far from the cause with
"CodeGenVM cannot emit this Relax operator directly". TFLite's
``TRANSPOSE_CONV`` (Keras's ``Conv2DTranspose`` through the TFLite converter)
imports as NHWC data with an OHWI kernel, so every such model failed to build.

:func:`legal_layouts` converts those calls with TVM's ``ConvertLayout``, which
transposes the data in and the result back out (exact: the numbers are the
same, arranged differently); modules without such a call are returned as they
are. Both the compile pipeline and the inference function run it before
legalization.
"""

from __future__ import annotations

import tvm
from tvm import relax

# op name -> (data layout, kernel layout) that TOPI's legalization lowers
TOPI_LAYOUTS = {
    "relax.nn.conv2d_transpose": ("NCHW", "IOHW"),
}


def _needs_conversion(mod: tvm.IRModule) -> bool:
    found = False

    def visit(expr: relax.Expr) -> None:
        nonlocal found
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in TOPI_LAYOUTS:
            data, kernel = TOPI_LAYOUTS[expr.op.name]
            attrs = expr.attrs
            if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != (data, kernel, data):
                found = True

    for func in mod.functions.values():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func, visit)
    return found


def legal_layouts(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every call of :data:`TOPI_LAYOUTS` in the layout TVM's legalization lowers."""
    if not _needs_conversion(mod):
        return mod
    desired = {name: list(layouts) for name, layouts in TOPI_LAYOUTS.items()}
    return relax.transform.ConvertLayout(desired)(mod)


@tvm.transform.module_pass(opt_level=0, name="forge_legal_layouts")
def LegalLayouts(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 (TVM's style)
    """:func:`legal_layouts` as a TVM pass."""
    return legal_layouts(mod)
