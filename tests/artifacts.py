"""Helpers of the compile tests: run an artifact in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

RUNNER = Path(__file__).with_name("run_artifact.py")


def run_in_fresh_process(artifact: Path, inputs: list[np.ndarray], workdir: Path, *, key: Path | None = None,
                         password: str | None = None, runtime_only: bool = False) -> tuple[list[np.ndarray], dict]:
    """Outputs of ``artifact`` on ``inputs``, computed by the runtime in a new Python process.

    ``runtime_only``: TVM loads its runtime library alone (``TVM_USE_RUNTIME_LIB=1``), as on a board.
    """
    inputs_path = workdir / "inputs.npz"
    outputs_path = workdir / "outputs.npz"
    np.savez(inputs_path, *inputs)
    secrets = [str(key), password or ""] if key is not None else []
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1") if runtime_only else None
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(artifact), str(inputs_path), str(outputs_path), *secrets],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(outputs_path) as data:
        outputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    return outputs, report
