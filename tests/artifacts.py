"""Helpers of the compile tests: run an artifact in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

RUNNER = Path(__file__).with_name("run_artifact.py")


def run_in_fresh_process(artifact: Path, inputs: list[np.ndarray], workdir: Path) -> tuple[list[np.ndarray], dict]:
    """Outputs of ``artifact`` on ``inputs``, computed by the runtime in a new Python process."""
    inputs_path = workdir / "inputs.npz"
    outputs_path = workdir / "outputs.npz"
    np.savez(inputs_path, *inputs)
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(artifact), str(inputs_path), str(outputs_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(outputs_path) as data:
        outputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    return outputs, report
