"""Built-in plugin: graph rewrites that hold only in inference.

* ``remove_dropout``: ``nn.dropout(x)[0]`` is ``x`` at inference (ONNX
  Dropout without ``training_mode``, Keras and Caffe exports keep the node).
  Left in place it is fused into the preceding matmul or convolution, whose
  function then matches no schedule rule: AlexNet's and VGG's classifier
  layers ran 10 to 20 times slower. A dropout whose mask is used is kept.

``compile()`` runs it from ``opt_level`` 3 on, with the other inference
simplifications.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax import dpl

from forge_core.hookspecs import hookimpl
from forge_core.passes import PassContext, rewrite_functions


def remove_dropout(mod: tvm.IRModule, context: PassContext) -> tvm.IRModule:
    data = dpl.wildcard()
    pattern = dpl.is_tuple_get_item(dpl.is_op("relax.nn.dropout")(data), 0)
    updated = rewrite_functions(mod, pattern, lambda expr, matches: matches[data])
    return relax.transform.DeadCodeElimination()(updated)


@hookimpl
def register_passes(register: Callable[..., None]) -> None:
    register("remove_dropout", remove_dropout, stage="optimize",
             description="Dropout is the identity at inference: drop it (its mask unused)")
