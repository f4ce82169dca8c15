"""What this machine's CPU can run, for the tests of the integer kernels."""

from __future__ import annotations

import pytest
import tvm


def cpu_has_vnni() -> bool:
    try:
        return "avx512_vnni" in open("/proc/cpuinfo").read()
    except OSError:
        return False


# The kernels run here: this CPU when it has AVX-512 VNNI (another CPU's name may let LLVM use instructions this one
# lacks: for znver4, AMD's SSE4A insertq in byte shuffles, an illegal instruction on Intel), else Zen 4 to build for.
VNNI = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": str(
    tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")()) if cpu_has_vnni() else "znver4"})


needs_vnni = pytest.mark.skipif(not cpu_has_vnni(), reason="this CPU has no AVX-512 VNNI to run the kernels on")
