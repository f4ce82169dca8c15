"""onnxruntime's ``quantize_dynamic`` model of BERT-6, run by onnxruntime and compiled by Forge, beside fp32.

    .venv/bin/python benchmarks/dynamic_int8.py [--rounds 3]

The 6-layer BERT-style encoder of cpu_latency.py (hidden 384, 12 heads,
sequence 128, random weights), exported at opset 17, then
``quantize_dynamic(weight_type=QInt8)``: each quantized matmul reads a
``DynamicQuantizeLinear`` (a min and a max of the activation at run time) and
is a ``MatMulInteger`` with an int8 weight. Four engines, each timed in a
process of its own (benchmarks/timing_worker.py), in ``--rounds`` interleaved
rounds (medians reported): Forge fp32, Forge on the dynamic model,
onnxruntime fp32, onnxruntime on the dynamic model. Prints the largest
difference between the two engines' dynamic outputs and the ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

import forge

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from int8_speed import build_case  # noqa: E402
from timing_worker import run_in_process  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="forge-dynamic-int8-") as tmp:
        work = Path(tmp)
        case = build_case("bert6", argparse.Namespace(samples=1, eval_samples=1), work)
        dynamic = work / "bert6_dynamic.onnx"
        quantize_dynamic(str(case.onnx_path), str(dynamic), weight_type=QuantType.QInt8)
        x = case.evaluation[0]
        engines = {"forge fp32": ("forge", work / "forge_fp32"), "forge dynamic": ("forge", work / "forge_dynamic"),
                   "onnxruntime fp32": ("onnxruntime", case.onnx_path),
                   "onnxruntime dynamic": ("onnxruntime", dynamic)}
        forge.from_onnx(str(case.onnx_path)).compile(output_path=engines["forge fp32"][1])
        forge.from_onnx(str(dynamic)).compile(output_path=engines["forge dynamic"][1])
        expected = ort.InferenceSession(str(dynamic), providers=["CPUExecutionProvider"]).run(
            None, {case.input_name: x})[0]
        got = forge.Runtime(engines["forge dynamic"][1]).infer(x)[0]
        print(f"dynamic outputs: largest difference {np.abs(got - expected).max():.3g} "
              f"(largest value {np.abs(expected).max():.3g})")
        inputs = work / "inputs.npz"
        np.savez(inputs, x)
        times: dict[str, list[float]] = {name: [] for name in engines}
        for index in range(args.rounds):
            for name, (engine, path) in engines.items():
                times[name].append(run_in_process(engine, path, inputs)["median_ms"])
            print(f"round {index + 1}/{args.rounds}: "
                  + ", ".join(f"{name} {t[-1]:.2f} ms" for name, t in times.items()), flush=True)
    median = {name: float(np.median(t)) for name, t in times.items()}
    print(", ".join(f"{name} {ms:.2f} ms" for name, ms in median.items()))
    print(f"Forge dynamic / onnxruntime dynamic {median['forge dynamic'] / median['onnxruntime dynamic']:.2f}; "
          f"Forge dynamic / Forge fp32 {median['forge dynamic'] / median['forge fp32']:.2f}")
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    raise SystemExit(main())
