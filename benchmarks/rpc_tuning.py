"""Tuning throughput: candidates measured per minute, on this machine and on one or two RPC servers.

    .venv/bin/python benchmarks/rpc_tuning.py [--trials 64] [--channels 16] [--evaluator-ms 20]

Tunes the same model (``tests/model_factory.conv_bn_net``: three convolutions,
a matmul and a pooling, random weights) three times, each into a fresh
database with the same trial budget and seed:

1. ``local``: MetaSchedule's ``LocalRunner`` on this machine;
2. ``rpc x1``: ``RPCRunner`` through a loopback tracker with one
   ``forge rpc-server``;
3. ``rpc x2``: the same with two servers, two candidates measured at once.

It prints the candidates measured per minute of tuning and each phase's
seconds from MetaSchedule's profiler: ``SendToBuilder`` (building the
candidates here, on the builder's workers), ``JoinRunnerFutures`` (waiting
for their measurements) and the search itself. Which of building and
measuring dominates says whether a second device can help.
``--evaluator-ms`` sets how long each candidate is timed on the device
(``min_repeat_ms``; boards time longer than this machine's 20 ms default
would need, so a larger value models a slow board). Every configuration
runs in this one process, one after the other: nothing else may run on the
machine meanwhile. Writes benchmarks/results/rpc_tuning.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from model_factory import conv_bn_net  # noqa: E402
from rpc_farm import RPCFarm  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import forge  # noqa: E402
from forge_core.tuning import runners  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
KEY = "bench-board"
PHASES = ("SendToBuilder", "JoinRunnerFutures", "EvoSearch")


def tune_once(label: str, trials: int, channels: int, rpc: dict | None, work: Path) -> dict:
    ir = forge.from_onnx(conv_bn_net(seed=7, channels=channels))
    with ms.Profiler() as profiler:
        started = time.perf_counter()
        report = ir.tune(work_dir=work / label.replace(" ", "_"), trials=trials, progress=False, rpc=rpc)
        seconds = time.perf_counter() - started
    phases = profiler.get()
    row = {
        "config": label, "trials": report.trials, "failed": report.failed, "seconds": seconds,
        "per_minute": report.trials / seconds * 60,
        **{phase: sum(float(v) for k, v in phases.items() if k == phase or k.startswith(phase + "/")) for phase in PHASES},
    }
    print(f"{label:8s} {report.trials:4d} trials ({report.failed} failed) in {seconds:6.1f} s: "
          f"{row['per_minute']:6.1f} candidates/min; build {row['SendToBuilder']:.1f} s, "
          f"waiting for measurements {row['JoinRunnerFutures']:.1f} s, search {row['EvoSearch']:.1f} s", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--evaluator-ms", type=int, default=20, help="min_repeat_ms of each measurement")
    args = parser.parse_args()
    runners.EVALUATOR["min_repeat_ms"] = args.evaluator_ms
    work = Path(tempfile.mkdtemp(prefix="forge-rpc-bench-"))
    rows = []
    try:
        rows.append(tune_once("local", args.trials, args.channels, None, work))
        with RPCFarm() as farm:
            farm.add_server(KEY)
            rows.append(tune_once("rpc x1", args.trials, args.channels,
                                  {"tracker": farm.tracker, "key": KEY}, work))
            farm.add_server(KEY)
            rows.append(tune_once("rpc x2", args.trials, args.channels,
                                  {"tracker": farm.tracker, "key": KEY}, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    local, one, two = (row["per_minute"] for row in rows)
    print(f"\nrpc x1 / local: {one / local:.2f}   rpc x2 / rpc x1: {two / one:.2f}   rpc x2 / local: {two / local:.2f}")
    bottleneck = max(("building", rows[1]["SendToBuilder"]), ("measuring", rows[1]["JoinRunnerFutures"]),
                     key=lambda item: item[1])[0]
    print(f"With one server, {bottleneck} took the most time.")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rpc_tuning.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    sys.exit(main())
