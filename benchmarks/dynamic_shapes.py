"""A dynamic artifact against the static one and against onnxruntime, at three sizes, in one run.

    .venv/bin/python benchmarks/dynamic_shapes.py [--models mobilenetv2,resnet50,bert6,dbnet,vad] [--rounds 2]
        [--target "llvm -mcpu=x86-64-v3"]

Each model is exported once by torch with its dims dynamic (``dynamic_axes``), then:

* Forge dynamic: one artifact, ``forge.from_onnx(model)`` as it ships, timed at every size (the generic code);
* Forge bucketed: the same model compiled with ``shape_buckets`` at the three sizes, timed at every size;
* Forge static: ``from_onnx(model, shape=...)`` at the first (the "static") size;
* onnxruntime on the same dynamic ONNX file, at every size.

Every engine is timed in a process of its own (``timing_worker.py``), in ``--rounds`` interleaved rounds;
figures are medians. The generic artifact is also timed against the static one in one process, in interleaved
rounds (``timing_worker.py forge-pair``): that ratio holds on a machine whose speed changes from process to
process (seen on a shared Zen 4: the same artifact at 29 or 40 ms). The targets: bucketed / static at the static size <= 1.2, and the ratio to onnxruntime at
each size printed (and kept in the README). Writes benchmarks/results/dynamic_shapes.json.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

import forge
from forge_core.runtime.cpu_features import describe_host

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import BertEncoder, DBNet, MobileNetV2, ResNet50, VoiceActivity, randomized  # noqa: E402
from timing_worker import run_in_process  # noqa: E402

# name: (factory, dynamic axes per input, sizes: the first is the static one)
MODELS = {
    "mobilenetv2": (MobileNetV2, {"x": {0: "batch"}}, [(1, 3, 224, 224), (2, 3, 224, 224), (5, 3, 224, 224)]),
    "resnet50": (ResNet50, {"x": {0: "batch"}}, [(1, 3, 224, 224), (2, 3, 224, 224), (5, 3, 224, 224)]),
    "bert6": (BertEncoder, {"x": {0: "batch", 1: "sequence"}}, [(1, 128), (1, 64), (3, 7)]),
    "dbnet": (DBNet, {"x": {0: "batch", 2: "height", 3: "width"}},
              [(1, 3, 640, 640), (1, 3, 480, 640), (2, 3, 320, 320)]),
    "vad": (VoiceActivity, {"x": {1: "frames"}}, [(1, 8, 576), (1, 32, 576), (1, 1, 576)]),
}


def _inputs(model_name: str, size: tuple[int, ...], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if model_name == "bert6":
        return [rng.integers(0, 1000, size).astype("int64")]
    return [rng.standard_normal(size).astype("float32")]


def _export(model: torch.nn.Module, example: list[np.ndarray], axes: dict) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(a) for a in example), buffer, input_names=list(axes),
                          output_names=["y"], opset_version=17, dynamo=False, dynamic_axes=axes)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2,resnet50,bert6,dbnet,vad")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", default="llvm",
                        help='Forge\'s target (default: this CPU); "llvm -mcpu=x86-64-v3" for the AVX2 class')
    args = parser.parse_args()
    print(describe_host())
    print(f"Forge target: {args.target}", flush=True)
    target = args.target
    results = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for name in args.models.split(","):
            factory, axes, sizes = MODELS[name]
            model = randomized(factory())
            onnx_path = work / f"{name}.onnx"
            onnx_path.write_bytes(_export(model, _inputs(name, sizes[0], 0), axes))
            forge.from_onnx(onnx_path).compile(target, output_path=work / f"{name}-dynamic")
            buckets = [{next(iter(axes)): size} for size in sizes]
            forge.from_onnx(onnx_path).compile(target, output_path=work / f"{name}-bucketed", shape_buckets=buckets)
            static_shape = {next(iter(axes)): sizes[0]}
            forge.from_onnx(onnx_path, shape=static_shape).compile(target, output_path=work / f"{name}-static")
            feeds = []
            for index, size in enumerate(sizes):
                path = work / f"{name}-{index}.npz"
                np.savez(path, *_inputs(name, size, index))
                feeds.append(path)
            times: dict[tuple[str, int], list[float]] = {}
            for _ in range(args.rounds):
                for index, feed in enumerate(feeds):
                    runs = [("dynamic", work / f"{name}-dynamic", "forge"), ("bucketed", work / f"{name}-bucketed", "forge"),
                            ("onnxruntime", onnx_path, "onnxruntime")]
                    if index == 0:
                        runs.append(("static", work / f"{name}-static", "forge"))
                    for engine, model_path, kind in runs:
                        median = run_in_process(kind, model_path, feed)["median_ms"]
                        times.setdefault((engine, index), []).append(median)
            # The generic artifact against the static one in one process, interleaved: on a machine whose speed
            # changes from process to process, the per-process medians above do not compare.
            pair = run_in_process("forge-pair", work / f"{name}-static", work / f"{name}-dynamic", feeds[0])
            median = {key: float(np.median(value)) for key, value in times.items()}
            for index, size in enumerate(sizes):
                row = {"model": name, "size": list(size), "dynamic_ms": median[("dynamic", index)],
                       "bucketed_ms": median[("bucketed", index)], "onnxruntime_ms": median[("onnxruntime", index)]}
                row["dynamic_over_onnxruntime"] = row["dynamic_ms"] / row["onnxruntime_ms"]
                row["bucketed_over_onnxruntime"] = row["bucketed_ms"] / row["onnxruntime_ms"]
                if index == 0:
                    row["static_ms"] = median[("static", 0)]
                    row["dynamic_over_static"] = row["dynamic_ms"] / row["static_ms"]
                    row["bucketed_over_static"] = row["bucketed_ms"] / row["static_ms"]
                    row["one_process"] = {"static_ms": pair["a_ms"], "dynamic_ms": pair["b_ms"],
                                          "dynamic_over_static": pair["ratio"]}
                results.append(row)
                static = (f"  static {row['static_ms']:8.2f} ms  bucketed/static {row['bucketed_over_static']:.2f}"
                          f"  dynamic/static in one process {pair['ratio']:.2f} ({pair['b_ms']:.2f} / "
                          f"{pair['a_ms']:.2f} ms)" if index == 0 else "")
                print(f"{name:12s} {str(size):18s} dynamic {row['dynamic_ms']:8.2f} ms  bucketed "
                      f"{row['bucketed_ms']:8.2f} ms  onnxruntime {row['onnxruntime_ms']:8.2f} ms  ratios "
                      f"{row['dynamic_over_onnxruntime']:.2f} / {row['bucketed_over_onnxruntime']:.2f}{static}",
                      flush=True)
    out = HERE / "results" / "dynamic_shapes.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"host": describe_host(), "target": target, "rows": results}, indent=2))


if __name__ == "__main__":
    main()
