"""Soak: a long ``forge run --repeat`` and its resident memory over time.

    .venv/bin/python benchmarks/runtime_soak.py [--minutes 10] [--model squeezenet] [--encrypted]

Compiles one of the ``onnx`` wheel's light models (random weights as shipped)
at opt_level 3, times a short ``forge run`` to learn its latency, then starts
``forge run ARTIFACT --repeat N`` with N chosen to last ``--minutes``, and
reads the process's ``VmRSS`` from ``/proc`` every ``--sample-seconds``.
Prints the resident size at the end of the first minute (after warm-up and
the first allocations) and at the end, the peak, and the least-squares slope
after the first minute, in KiB per minute. Memory is called stable when it
grows under 1 MiB from the first minute to the end. Writes
benchmarks/results/runtime_soak.json. Time is not measured here, so other
jobs only stretch the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).with_name("results")
FORGE = [sys.executable, "-m", "forge_core.cli"]
PASSWORD = "soak-password-2026"


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", default="squeezenet", help="a light model of the onnx wheel")
    parser.add_argument("--sample-seconds", type=float, default=2.0)
    parser.add_argument("--encrypted", action="store_true", help="soak an encrypted artifact")
    args = parser.parse_args()

    import onnx

    import forge

    light = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light" / f"light_{args.model}.onnx"
    env = os.environ | ({"FORGE_DECRYPT_PASSWORD": PASSWORD} if args.encrypted else {})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "artifact"
        forge.from_onnx(str(light)).compile(output_path=str(out), opt_level=3,
                                            **({"encrypt_password": PASSWORD} if args.encrypted else {}))
        key = ["--key", str(out / "modelKey.bin")] if args.encrypted else []
        probe = subprocess.run([*FORGE, "run", str(out), *key, "--repeat", "50", "--json"], env=env,
                               capture_output=True, text=True, check=True)
        latency_ms = json.loads(probe.stdout.strip().splitlines()[-1])["latency_ms"]["p50"]
        repeat = max(100, int(args.minutes * 60_000 / latency_ms))
        print(f"{args.model}{' (encrypted)' if args.encrypted else ''}: p50 {latency_ms:.2f} ms, "
              f"forge run --repeat {repeat} (about {args.minutes:g} min)", flush=True)
        process = subprocess.Popen([*FORGE, "run", str(out), *key, "--repeat", str(repeat), "--json"], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        samples: list[tuple[float, int]] = []
        next_report = 60.0
        while process.poll() is None:
            value = rss_kib(process.pid)
            elapsed = time.monotonic() - started
            if value is not None:
                samples.append((elapsed, value))
            if elapsed >= next_report:
                print(f"  {elapsed / 60:5.1f} min  RSS {value / 1024 if value else float('nan'):.1f} MiB",
                      flush=True)
                next_report += 60.0
            time.sleep(args.sample_seconds)
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"forge run failed ({process.returncode}): {stderr[-2000:]}")
        runs = json.loads(stdout.strip().splitlines()[-1])["latency_ms"]["runs"]
    settled = [(t, v) for t, v in samples if t >= 60.0] or samples
    times = np.array([t for t, _ in settled]) / 60.0
    values = np.array([v for _, v in settled], dtype=np.float64)
    slope = float(np.polyfit(times, values, 1)[0]) if len(settled) > 2 else 0.0
    growth = int(values[-1] - values[0])
    report = {
        "model": args.model, "encrypted": args.encrypted, "runs": runs, "minutes": samples[-1][0] / 60,
        "rss_first_minute_kib": int(values[0]), "rss_end_kib": int(values[-1]),
        "rss_peak_kib": max(v for _, v in samples), "growth_kib": growth, "slope_kib_per_min": slope,
        "stable": growth < 1024,
    }
    print(f"{runs} runs in {report['minutes']:.1f} min: RSS {values[0] / 1024:.1f} MiB after the first minute, "
          f"{values[-1] / 1024:.1f} MiB at the end (peak {report['rss_peak_kib'] / 1024:.1f} MiB), "
          f"growth {growth} KiB, slope {slope:.1f} KiB/min -> {'stable' if report['stable'] else 'GROWING'}")
    RESULTS.mkdir(exist_ok=True)
    name = "runtime_soak_encrypted.json" if args.encrypted else "runtime_soak.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    main()
