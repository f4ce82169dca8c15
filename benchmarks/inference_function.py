"""The inference function on a big model: ``get_inference_function()`` against onnxruntime, and against
TVM's plain loops it was built with before (issue 34: a 1024x1024 U-Net did not finish in 15 minutes).

    .venv/bin/python benchmarks/inference_function.py [--size 1024] [--width 16] [--plain-size 512] [--json PATH]

A U-Net (benchmarks/models.py) with random weights, exported by torch, at ``--size`` and at
``--plain-size`` (the plain build takes minutes at 1024x1024). All in one process: the build time, then the
fastest of 3 runs of each engine, interleaved. Prints the CPU, the times and the ratios, and whether the
scheduled function's output equals the plain one's bit for bit (it must: reference_order.py).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import forge
from forge_core.ir import weights
from forge_core.ir.inference import build_inference_function
from forge_core.runtime.cpu_features import describe_host

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import UNet, randomized  # noqa: E402


def _export(size: int, width: int) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(randomized(UNet(width)), (torch.randn(1, 3, size, size),), buffer, input_names=["image"],
                          output_names=["mask"], opset_version=17, dynamo=False)
    return buffer.getvalue()


def _fastest(call, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(size: int, width: int, plain: bool) -> dict:
    model = _export(size, width)
    image = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    expected = session.run(None, {"image": image})[0]
    ir = forge.from_onnx(model)
    started = time.perf_counter()
    function = ir.get_inference_function()
    row = {"size": size, "width": width, "build_s": time.perf_counter() - started}
    got = function(image)
    row["max_abs_error_vs_onnxruntime"] = float(np.abs(got - expected).max())
    row["onnxruntime_s"] = _fastest(lambda: session.run(None, {"image": image}))
    row["forge_s"] = _fastest(lambda: function(image))
    row["forge_per_onnxruntime"] = row["forge_s"] / row["onnxruntime_s"]
    if plain:
        unscheduled = build_inference_function(weights.bind_params(ir.mod, ir.params), _function_target(),
                                               ir.input_specs, ir.output_specs, reference_order=False)
        row["plain_s"] = _fastest(lambda: unscheduled(image), rounds=1)
        row["plain_per_forge"] = row["plain_s"] / row["forge_s"]
        row["bit_identical_to_plain"] = bool(np.array_equal(unscheduled(image), got))
    return row


def _function_target():
    from forge_core.targets import resolve_target

    return resolve_target("llvm", host_cpu=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--plain-size", type=int, default=512)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--json", default=str(HERE / "results" / "inference_function.json"))
    args = parser.parse_args()
    print(describe_host())
    rows = [measure(args.plain_size, args.width, plain=True), measure(args.size, args.width, plain=False)]
    for row in rows:
        line = (f"U-Net width {row['width']} at {row['size']}x{row['size']}: build {row['build_s']:.1f} s, "
                f"inference function {row['forge_s']:.3f} s, onnxruntime {row['onnxruntime_s']:.3f} s "
                f"({row['forge_per_onnxruntime']:.2f}x), max |error| {row['max_abs_error_vs_onnxruntime']:.2g}")
        if "plain_s" in row:
            line += (f"; TVM's plain loops {row['plain_s']:.2f} s ({row['plain_per_forge']:.1f}x slower), "
                     f"bit-identical: {row['bit_identical_to_plain']}")
        print(line)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"cpu": describe_host(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
