"""What verifying a library's checksum costs, against the whole load, for a library of about 100 MB.

    .venv/bin/python benchmarks/artifact_integrity.py [--megabytes 100] [--repeat 5]

The model: a dense layer whose float32 weight holds ``--megabytes`` MB
(``x[1, K] @ W[K, 2048]``, random weights), compiled by ``forge`` at opt_level
0 so that the weight stays in the library as it is. Timed, each the median of
``--repeat`` runs in this process:

* verify: ``forge_core.runtime.library_file.verify`` on the library's bytes
  (one SHA-256 pass over the content, continued over the trailer), what
  ``Runtime`` adds before it maps the file;
* load: ``Runtime(artifact)``, everything included (read, verify, private copy,
  ``dlopen``, the VM).

The issue's target: verification costs under 5% of load time for a 100 MB
library. Prints the figures and writes benchmarks/results/artifact_integrity.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RESULTS = Path(__file__).with_name("results")


def dense_model(megabytes: int) -> onnx.ModelProto:
    columns = 2048
    rows = max(1, megabytes * 1_000_000 // (4 * columns))
    weight = np.random.default_rng(0).standard_normal((rows, columns)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, columns])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def median_seconds(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import forge
    from forge_core.runtime import Runtime
    from forge_core.runtime.library_file import verify

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "artifact"
        forge.from_onnx(dense_model(args.megabytes)).compile(output_path=out, opt_level=0)
        library = out / "model_library.so"
        data = library.read_bytes()
        verify_s = median_seconds(lambda: verify(data, "library"), args.repeat)
        load_s = median_seconds(lambda: Runtime(out), args.repeat)
        size_mb = len(data) / 1e6
    share = verify_s / load_s
    report = {"library_mb": round(size_mb, 1), "verify_s": verify_s, "load_s": load_s, "share": share,
              "target_met": share < 0.05}
    print(f"library {size_mb:.1f} MB: verify {verify_s * 1000:.1f} ms, whole load {load_s * 1000:.1f} ms "
          f"-> verification is {share:.1%} of the load")
    print(f"target: verification under 5% of load time: {'met' if share < 0.05 else 'missed'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "artifact_integrity.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    main()
