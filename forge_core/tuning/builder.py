"""The fast candidate builder.

MetaSchedule's default builder imports ``tvm.s_tir.tensor_intrin`` in every
worker (about 30 s here, mostly CUDA intrinsics) before building anything.
Forge's build function skips that: CPU candidates need none of those
intrinsics.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: dict[str, Any] | None) -> Any:
    """Build one candidate as it runs after deployment: weight-repacking stages removed, Forge's TIR lowering."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from forge_core.compiler.tir_pipeline import tir_pipeline

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target, pipeline=tir_pipeline())


def export_candidate(scratch: str, mod: Any) -> str:
    """MetaSchedule's default export (a tar of objects, linked by the runner here), under ``scratch``.

    The default makes a new temporary directory per candidate and never
    removes it: a session of 2000 trials would leave 2000 in the system's.
    """
    from tvm.support.tar import tar

    path = os.path.join(tempfile.mkdtemp(dir=scratch), "tvm_tmp_mod." + tar.output_format)
    mod.export_library(path, fcompile=tar)
    return path


def export_linked_candidate(scratch: str, target: str, mod: Any) -> str:
    """A candidate linked here into a shared library for ``target``'s machine: a board needs no compiler."""
    from forge_core.compiler.toolchain import toolchain_for

    path = os.path.join(tempfile.mkdtemp(dir=scratch), "candidate.so")
    mod.export_library(path, fcompile=toolchain_for(tvm.target.Target(target)).fcompile)
    return path


@derived_object
class _LocalBuilder(ms.builder.LocalBuilder._cls):  # noqa: SLF001 - TVM's way to derive a builder
    """MetaSchedule's ``LocalBuilder`` without its start-up check, which starts a worker process (importing
    TVM: about 5 s of a short session) only to look the two functions up there. The functions are Python
    ones, sent to every worker with each batch; one that failed there would fail each candidate's build,
    with the reason in the session's log."""

    def _sanity_check(self) -> None:
        return None


def make_builder(target: tvm.target.Target, scratch: str, remote: bool) -> Any:
    """The candidate builder: objects for the local runner, linked libraries for a board."""
    export = (functools.partial(export_linked_candidate, scratch, str(target)) if remote
              else functools.partial(export_candidate, scratch))
    return _LocalBuilder(f_build=build_candidate, f_export=export)
