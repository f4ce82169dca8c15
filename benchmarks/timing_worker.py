"""Times one engine in its own process (spinning worker threads of two engines disturb each other).

    python timing_worker.py forge ARTIFACT INPUTS.npz
    python timing_worker.py onnxruntime MODEL.onnx INPUTS.npz
    python timing_worker.py torch MODEL.pt INPUTS.npz
    python timing_worker.py forge-pair ARTIFACT_A ARTIFACT_B INPUTS.npz

``forge-pair`` loads two Forge artifacts in one process (one TVM thread pool)
and times them in interleaved rounds: their ratio holds where a machine's
speed changes from process to process (its JSON line: each one's median over
the rounds, and the median of the per-round ratios B / A).

Prints one JSON line: median and p90 in ms, the run count, the thread count,
and writes the first output beside the inputs (``INPUTS.npz.<engine>.npy``).
For Forge it also profiles the artifact after timing it: ``fallback_share`` is
the share of the model's time spent in kernels that fell back to the generic
schedule or to none (from the artifact's ``schedules`` metadata), and
``fallbacks`` names the slowest of them.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

MIN_RUNS, MIN_SECONDS, WARMUP = 20, 3.0, 5


def run_in_process(engine: str, *paths) -> dict:
    """Time ``engine`` on its paths (``model, inputs``; ``forge-pair``: ``artifact_a, artifact_b, inputs``) in a
    fresh process running this script; its JSON line as a dict."""
    import subprocess
    from pathlib import Path

    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), engine, *map(str, paths)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} timing failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(run, inputs):
    for _ in range(WARMUP):
        first = run(inputs)
    times = []
    started = time.perf_counter()
    while len(times) < MIN_RUNS or time.perf_counter() - started < MIN_SECONDS:
        t0 = time.perf_counter()
        run(inputs)
        times.append((time.perf_counter() - t0) * 1000)
        if len(times) >= 1000:
            break
    return first, np.array(times)


PAIR_ROUNDS, PAIR_RUNS = 7, 10


def _pair(path_a: str, path_b: str, inputs_path: str) -> None:
    from forge_core.runtime import Runtime

    with np.load(inputs_path) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    runtimes = [Runtime(path_a), Runtime(path_b)]
    for runtime in runtimes:
        runtime.warm_up(WARMUP, inputs)
    rounds: list[list[float]] = [[], []]
    for _ in range(PAIR_ROUNDS):
        for runtime, times in zip(runtimes, rounds):
            started = time.perf_counter()
            for _ in range(PAIR_RUNS):
                runtime.infer(*inputs)
            times.append((time.perf_counter() - started) * 1000 / PAIR_RUNS)
    a, b = np.array(rounds[0]), np.array(rounds[1])
    print(json.dumps({"a_ms": float(np.median(a)), "b_ms": float(np.median(b)),
                      "ratio": float(np.median(b / a)), "rounds": PAIR_ROUNDS}))


def main() -> None:
    if sys.argv[1] == "forge-pair":
        _pair(*sys.argv[2:5])
        return
    engine, model_path, inputs_path = sys.argv[1:4]
    threads = int(os.environ.get("FORGE_NUM_THREADS") or len(os.sched_getaffinity(0)))
    extra: dict = {}
    with np.load(inputs_path) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    if engine == "forge":
        from forge_core.runtime import Runtime

        runtime = Runtime(model_path)
        threads = runtime.num_threads
        first, times = measure(lambda xs: runtime.infer(*xs)[0], inputs)
        from forge_core.runtime.profiling import fallback_share

        rows = runtime.profile(*inputs, repeat=10)  # after the timing: the instrumented runs are slower
        extra = {"fallback_share": fallback_share(rows),
                 "fallbacks": [f"{row.name} {100 * row.share:.1f}%" for row in rows if row.fallback][:5]}
    elif engine == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        first, times = measure(lambda xs: session.run(None, dict(zip(names, xs)))[0], inputs)
    elif engine == "torch":
        import torch

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        torch.set_num_threads(threads)
        model = torch.load(model_path, weights_only=False).eval()
        tensors = [torch.from_numpy(x) for x in inputs]

        def run(_):
            with torch.inference_mode():
                return model(*tensors).numpy()

        first, times = measure(run, inputs)
    else:
        raise SystemExit(f"unknown engine {engine!r}")
    np.save(f"{inputs_path}.{engine}.npy", first)
    print(json.dumps({"median_ms": float(np.median(times)), "p90_ms": float(np.percentile(times, 90)),
                      "runs": len(times), "threads": threads, **extra}))


if __name__ == "__main__":
    main()
