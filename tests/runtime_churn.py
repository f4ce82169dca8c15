"""Worker of the runtime load test: ``python runtime_churn.py PLAN.json``.

The plan lists artifacts (library, optional key and password, an input and
the expected output) and a number of rounds. Each round loads every artifact
in turn with :class:`forge_core.runtime.Runtime`, runs it once, checks the
output bit for bit, and drops the runtime. After each round the worker
samples what a leak would grow: open file descriptors, OS threads, resident
memory (``VmRSS``), and the files left in ``$TMPDIR``. It prints one JSON
report::

    {"rounds": [{"fds": 9, "threads": 3, "rss_kib": 301234, "tmp_files": []}, ...],
     "mismatches": ["artifact 7, round 2: ..."], "loads": 150}
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from forge_core.runtime import Runtime


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def sample() -> dict:
    gc.collect()
    temporary = Path(tempfile.gettempdir())
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "rss_kib": rss_kib(),
        "library_mappings": sum(1 for line in Path("/proc/self/maps").read_text().splitlines()
                                if "model_library.so" in line or "forge-model" in line),
        "tmp_files": sorted(str(p.relative_to(temporary)) for p in temporary.rglob("*")),
    }


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    artifacts = plan["artifacts"]
    inputs = [np.load(a["input"]) for a in artifacts]
    expected = [np.load(a["expected"]) for a in artifacts]
    report: dict = {"before": sample(), "rounds": [], "mismatches": [], "loads": 0}
    for round_index in range(plan["rounds"]):
        for index, artifact in enumerate(artifacts):
            runtime = Runtime(artifact["library"], artifact.get("key"), artifact.get("password"))
            (got,) = runtime.infer(inputs[index])
            if not np.array_equal(got, expected[index]):
                report["mismatches"].append(f"artifact {index}, round {round_index}: max difference "
                                            f"{float(np.max(np.abs(got - expected[index])))}")
            del runtime
            report["loads"] += 1
        report["rounds"].append(sample())
    print(json.dumps(report))


if __name__ == "__main__":
    main()
