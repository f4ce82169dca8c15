"""Forge's main job on the ResNet-50 that the onnx wheel ships.

Loads ``light_resnet50.onnx`` from the installed onnx package, prints its
summary, runs it and checks the output against the reference stored beside it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import forge

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RTOL, ATOL = 1e-3, 1e-5  # onnx's backend test runner uses these for model tests


def main() -> int:
    model_path = LIGHT / "light_resnet50.onnx"
    reference = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / "light_resnet50_output_0.pb")))

    started = time.perf_counter()
    ir = forge.from_onnx(model_path)
    print(f"Loaded {model_path.name} in {time.perf_counter() - started:.1f} s\n")
    print(ir.summary())

    # The input onnx's backend tests feed this model: arange(n) / n.
    shape = ir.input_shapes[0]
    x = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
    started = time.perf_counter()
    output = ir.get_inference_function()(x)
    print(f"\nRan the model (reference interpreter build) in {time.perf_counter() - started:.1f} s")

    error = float(np.max(np.abs(output - reference)))
    ok = np.allclose(output, reference, rtol=RTOL, atol=ATOL)
    print(f"Output {output.shape} vs reference: max abs error {error:.2e} (rtol={RTOL}, atol={ATOL}): "
          f"{'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
