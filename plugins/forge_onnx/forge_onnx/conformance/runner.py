"""Running many cases in worker processes, surviving crashes and hangs."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CASE_TIMEOUT = 300.0


def describe_exit(code: int) -> str:
    """A process's return code in words: ``exit code 1``, ``killed by SIGSEGV``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class CaseResult:
    case: str
    status: str  # pass, fail, error, skip, crash, timeout
    error: str = ""
    seconds: float = 0.0


class _Worker:
    def __init__(self, backend: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "forge_onnx.conformance.worker", backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.lines.get(timeout=600)
        if ready is None:
            from forge_core.errors import ProcessFailedError  # here: the runner itself imports no TVM

            raise ProcessFailedError(f"the {backend} conformance worker failed to start")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, case: str) -> CaseResult:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(case + "\n")
            self.process.stdin.flush()
            line = self.lines.get(timeout=CASE_TIMEOUT)
        except queue.Empty:
            self.close()
            return CaseResult(case, "timeout", f"no result within {CASE_TIMEOUT:.0f} s")
        except BrokenPipeError:
            line = None
        if line is None:
            return CaseResult(case, "crash", f"the worker process died ({self._exit()})")
        data = json.loads(line)
        return CaseResult(data["case"], data["status"], data["error"], data["seconds"])

    def _exit(self) -> str:
        """How the worker ended: its output closes a moment before the process can be waited for."""
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return "its output closed and it did not exit"
        return describe_exit(code)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def run_cases(backend: str, cases: Iterable[str], jobs: int = 1,
              on_result: Callable[[CaseResult], None] | None = None) -> dict[str, CaseResult]:
    """Run ``cases`` with ``backend`` (forge or onnxruntime) in ``jobs`` worker processes."""
    todo: queue.Queue[str] = queue.Queue()
    for case in cases:
        todo.put(case)
    results: dict[str, CaseResult] = {}
    lock = threading.Lock()

    def work() -> None:
        worker = _Worker(backend)
        try:
            while True:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                result = worker.run(case)
                with lock:
                    results[case] = result
                    if on_result is not None:
                        on_result(result)
                if not worker.alive:
                    worker.close()
                    worker = _Worker(backend)
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
