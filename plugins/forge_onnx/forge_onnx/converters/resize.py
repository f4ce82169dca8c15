"""Resize's opset-18 attributes ``axes`` and ``keep_aspect_ratio_policy``, which TVM's converter lacks.

Forge rewrites the node's scales, sizes and roi to cover every axis (as the
specification defines), then lets TVM's converter do the resizing. A
``keep_aspect_ratio_policy`` whose common scale does not give whole sizes is
refused: TVM maps coordinates with each axis' own ratio.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import static_shape


def _values(expr: Any) -> np.ndarray | None:
    if expr is None or not hasattr(expr, "value"):
        return None
    array = np.asarray(expr.value.numpy())
    return array if array.size else None


def resize(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Resize with ``axes`` and ``keep_aspect_ratio_policy`` expanded to full-rank sizes."""
    policy = attrs.get("keep_aspect_ratio_policy", b"stretch")
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    axes = attrs.get("axes")
    if axes is None and policy == "stretch":
        return context.tvm_convert("Resize", inputs)
    x = inputs[0]
    dims = static_shape(x)
    if dims is None:
        raise ValueError("Resize with axes or keep_aspect_ratio_policy needs a static input shape")
    rank = len(dims)
    axes = [int(a) % rank for a in (axes if axes is not None else range(rank))]
    padded = list(inputs) + [None] * (4 - len(inputs))
    roi, scales, sizes = _values(padded[1]), _values(padded[2]), _values(padded[3])
    new_inputs = [x, padded[1], None, None]
    if roi is not None and len(roi) == 2 * len(axes):
        full = [0.0] * rank + [1.0] * rank
        for i, axis in enumerate(axes):
            full[axis], full[rank + axis] = float(roi[i]), float(roi[len(axes) + i])
        new_inputs[1] = relax.const(np.array(full, dtype=roi.dtype), str(roi.dtype))
    if sizes is not None:
        full_sizes = list(dims)
        for i, axis in enumerate(axes):
            full_sizes[axis] = int(sizes[i])
        if policy in ("not_larger", "not_smaller"):
            ratios = [full_sizes[a] / dims[a] for a in axes]
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            for axis in axes:
                full_sizes[axis] = int(scale * dims[axis] + 0.5)
                if abs(full_sizes[axis] / dims[axis] - scale) > 1e-6:
                    # TVM maps coordinates with each axis' own out/in ratio; ONNX with the common scale.
                    raise ValueError(
                        f"Resize with keep_aspect_ratio_policy={policy}: size {full_sizes[axis]} of axis {axis} is "
                        f"not exactly {scale:g} x {dims[axis]}, which TVM's resize cannot express"
                    )
        new_inputs[3] = relax.const(np.array(full_sizes, dtype=np.int64), "int64")
    elif scales is not None:
        full_scales = [1.0] * rank
        for i, axis in enumerate(axes):
            full_scales[axis] = float(scales[i])
        new_inputs[2] = relax.const(np.array(full_scales, dtype=np.float32), "float32")
    plain = {k: v for k, v in attrs.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    return context.tvm_convert("Resize", new_inputs, plain)


CONVERTERS = {"Resize": resize}
