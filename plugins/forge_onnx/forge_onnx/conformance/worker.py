"""A worker process: runs the backend-suite cases named on stdin, one JSON line per result on stdout.

    python -m forge_onnx.conformance.worker forge|forge-public|onnxruntime < case_names
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import unittest
import warnings
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

os.environ.setdefault("FORGE_NUM_THREADS", "1")  # workers run side by side

CATEGORIES = ("Node", "Real", "Simple", "PyTorchConverted", "PyTorchOperator")


def load_backend(name: str) -> Any:
    if name == "forge":
        from forge_onnx.backend import ForgeBackend

        return ForgeBackend
    if name == "forge-public":
        from forge_onnx.conformance.public_path import PublicPathBackend

        return PublicPathBackend
    if name == "onnxruntime":
        import onnxruntime.backend

        return onnxruntime.backend.backend
    raise SystemExit(f"unknown backend {name!r}")


def test_case_class(backend: Any) -> type[unittest.TestCase]:
    import onnx.backend.test

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx.backend.test.BackendTest(backend, __name__).tests


def _summary(error: BaseException) -> str:
    unsupported = getattr(error, "unsupported", None)
    if isinstance(unsupported, dict):
        return f"{type(error).__name__}: unsupported {', '.join(sorted(unsupported))}"
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


class _Result(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.status = "pass"
        self.error = ""

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's name
        self.status, self.error = "error", _summary(err[1])

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self.status, self.error = "fail", _summary(err[1])

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self.status, self.error = "skip", reason[:300]


def run_case(tests: type[unittest.TestCase], name: str) -> dict[str, Any]:
    result = _Result()
    started = time.perf_counter()
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        tests(name).run(result)
    return {"case": name, "status": result.status, "error": result.error,
            "seconds": round(time.perf_counter() - started, 3)}


def main() -> None:
    backend = load_backend(sys.argv[1])
    tests = test_case_class(backend)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name:
            print(json.dumps(run_case(tests, name)), flush=True)


if __name__ == "__main__":
    main()
