"""The fast candidate builder.

MetaSchedule's default builder imports ``tvm.s_tir.tensor_intrin`` in every
worker (about 30 s here, mostly CUDA intrinsics) before building anything.
Forge's build function skips that: CPU candidates need none of those
intrinsics.
"""

from __future__ import annotations

from typing import Any

import tvm


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: dict[str, Any] | None) -> Any:
    """Build one candidate as it runs after deployment: weight-repacking stages removed."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.driver.build(mod, target=target)
