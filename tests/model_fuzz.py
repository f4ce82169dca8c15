"""The malformed-model fuzz corpus (issue 17): bad input never crashes and never runs wrong.

A *family module* generates seeded cases of one kind of input and runs one
case through Forge's public API; this harness runs them in subprocess
workers, so that a segfault, an abort or a hang is seen as one::

    .venv/bin/python tests/model_fuzz.py --family onnx --cases 3000 --seed 1 --jobs 2 --timeout 60

prints the counts per family, kind and outcome and every defect; it exits with
1 if there is a defect. A worker's address space is limited to
``MODEL_FUZZ_MEMORY_GIB`` (default 8; 0 for none). The test suite runs a few hundred cases
(tests/test_malformed_models.py) through :func:`run_corpus`.

A family module (:data:`FAMILY_MODULES`) has two functions:

``make_cases(family, seed, count, workdir) -> list[dict]``
    ``count`` JSON-able cases, each with at least ``"id"`` (unique), ``"family"``
    and ``"kind"``, and optionally ``"names"``: the node, operator, field or
    input names that an error about the case should mention. Files it needs go
    under ``workdir``, referenced by path. Case ``i`` of a seed is the same
    whatever ``count`` is. (A case may name another ``"module"`` to run it:
    the harness's own test does.)
``run_case(case) -> str | None``
    Runs in the worker: loads the case through Forge and, when it loads,
    checks that it loaded correctly, returning ``None``, or a short
    description of the wrong result. Exceptions propagate.

Outcomes, one per case::

    forge-error   a forge.ForgeError subclass (its class and message): acceptable when
                  the message names something (see names_something); else "vague": True
    loaded        loaded, and run_case found it correct
    wrong         run_case returned a description of a wrong result          (defect)
    internal      any other exception: its type, message and last frame       (defect)
    crash         the worker died: return code or signal, stderr's tail       (defect)
    hang          the case ran past the timeout; the worker was killed         (defect)

Worker protocol (``model_fuzz.py --worker PLAN.json START``): from case START on,
the worker prints ``{"i": index, "event": "start"}`` before a case and the
case's result line after it, each flushed at once, on a descriptor of its own
(its stdout is sent to stderr, so that nothing a library prints mixes in).
After a crash or a hang the parent records the outcome against the case that
started and did not end, and starts a new worker after it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from forge_onnx.conformance.runner import describe_exit
from typing import Any, TextIO

TESTS = Path(__file__).resolve().parent

FAMILY_MODULES = {"onnx": "fuzz_onnx", "tflite": "fuzz_frameworks", "torch": "fuzz_frameworks",
                  "keras": "fuzz_frameworks"}
"""Family name -> the module (in tests/) that generates and runs its cases."""

DEFECT_OUTCOMES = ("wrong", "internal", "crash", "hang")
OUTCOMES = ("forge-error", "loaded", *DEFECT_OUTCOMES)
DEFAULT_TIMEOUT = 60.0
STARTUP_TIMEOUT = 180.0  # a worker's imports, before its first case
MEMORY_LIMIT_GIB = float(os.environ.get("MODEL_FUZZ_MEMORY_GIB", "8"))
"""Address space of a worker (0: no limit), so that a model claiming terabytes fails, not the machine."""

Result = dict[str, Any]


# ----------------------------------------------------------------------------------------------------
# Families
# ----------------------------------------------------------------------------------------------------


def family_module(family: str) -> ModuleType | None:
    """The module generating ``family``'s cases, imported on first use; None when it is not available."""
    if family not in FAMILY_MODULES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILY_MODULES)}")
    name = FAMILY_MODULES[family]
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def available_families() -> list[str]:
    """The families whose module is present."""
    return [family for family in FAMILY_MODULES if family_module(family) is not None]


def names_something(message: str, names: Sequence[str]) -> bool:
    """Whether an error message says what is wrong: not empty, not a bare repr, and naming one of ``names``.

    ``names`` are what the generator recorded about the case (node, operator,
    input, attribute or field names, the file), each matched as a whole word,
    case and all (quoted, when it is one or two digits); with none recorded, any message of a few words passes.
    """
    text = message.strip()
    if len(text.split()) < 3 or (text.startswith("<") and text.endswith(">")):
        return False
    return not names or any(_mentions(text, form) for name in names if str(name)
                            for form in {str(name), repr(str(name))[1:-1]})  # as it is, or escaped as repr() does


def _mentions(text: str, name: str) -> bool:
    """Whether ``text`` holds ``name`` as a word of its own, case and all (quoted, if one or two digits)."""
    if len(name) <= 2 and name.isdigit():
        return f"'{name}'" in text or f'"{name}"' in text
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text) is not None


def is_defect(result: Result) -> bool:
    """Whether a result is a defect: a wrong result, an internal error, a crash, a hang, or a vague error."""
    return result["outcome"] in DEFECT_OUTCOMES or bool(result.get("vague"))


# ----------------------------------------------------------------------------------------------------
# Worker
# ----------------------------------------------------------------------------------------------------


_protocol: TextIO | None = None
_current: int | None = None


def note_phase(phase: str) -> None:
    """Tell the parent which phase the running case is in (e.g. "reference" around onnxruntime).

    A crash is reported with the last phase noted, so that one in a reference
    implementation is told from one in Forge. Outside a worker it does nothing.
    """
    if _protocol is not None:
        _send({"i": _current, "event": "phase", "phase": phase})


def _send(line: Result) -> None:
    assert _protocol is not None
    _protocol.write(json.dumps(line) + "\n")
    _protocol.flush()


def _last_frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def run_one(case: Result) -> Result:
    """Run one case in this process: its outcome, with the error's class, message and last frame."""
    from forge_core.errors import ForgeError

    module = importlib.import_module(case["module"]) if "module" in case else family_module(case["family"])
    if module is None:
        raise RuntimeError(f"family {case['family']!r} has no module")
    started = time.perf_counter()
    report: Result = {}
    try:
        wrong = module.run_case(case)
    except ForgeError as exc:
        message = str(exc)
        report = {"outcome": "forge-error", "error": type(exc).__name__, "message": message[:2000]}
        if not names_something(message, case.get("names", ())):
            report["vague"] = True
    except Exception as exc:  # noqa: BLE001 - the point: anything else is a defect, reported
        report = {"outcome": "internal", "error": type(exc).__name__, "message": str(exc)[:2000],
                  "frame": _last_frame(exc)}
    else:
        report = {"outcome": "loaded"} if wrong is None else {"outcome": "wrong", "message": str(wrong)[:2000]}
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


def worker_main(plan_path: Path, start: int) -> None:
    """Run the plan's cases from ``start`` on, one result line each, on the protocol descriptor."""
    global _protocol, _current
    sys.modules.setdefault("model_fuzz", sys.modules[__name__])  # run as __main__: family modules import this one
    _protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what Forge, TVM or a reference prints goes to stderr
    sys.stdout = sys.stderr
    if MEMORY_LIMIT_GIB > 0:
        limit = int(MEMORY_LIMIT_GIB * (1 << 30))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import warnings

    warnings.simplefilter("ignore")
    cases = json.loads(plan_path.read_text())
    for index in range(start, len(cases)):
        _current = index
        _send({"i": index, "event": "start"})
        _send({"i": index, **run_one(cases[index])})


# ----------------------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------------------


class _Lines:
    """The lines of a worker's protocol pipe, read with a deadline."""

    def __init__(self, stream: Any) -> None:
        self._fd = stream.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buffer = b""
        self._eof = False

    def read(self, deadline: float) -> Result | None:
        """The next JSON line; None at the end of the stream; TimeoutError at ``deadline``."""
        while b"\n" not in self._buffer:
            if self._eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                raise TimeoutError
            chunk = os.read(self._fd, 65536)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self._selector.close()


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: Path, offset: int, size: int = 3000) -> str:
    with path.open("rb") as f:
        f.seek(max(offset, f.seek(0, os.SEEK_END) - size))
        return f.read().decode(errors="replace")


def run_share(cases: Sequence[Result], plan_path: Path, stderr_path: Path, timeout: float,
              progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Run ``cases`` in workers, one after another, restarting after a crash or a hang; one result a case."""
    plan_path.write_text(json.dumps(list(cases)))
    results: list[Result] = []
    start = 0
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

    def record(index: int, report: Result) -> None:
        case = cases[index]
        result = {"id": case["id"], "family": case["family"], "kind": case["kind"], **report}
        result.pop("i", None)
        results.append(result)
        if progress is not None:
            progress(result)

    while start < len(cases):
        offset = stderr_path.stat().st_size if stderr_path.exists() else 0
        with stderr_path.open("ab") as stderr:
            process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(plan_path),
                                        str(start)], stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=env, cwd=plan_path.parent)
        assert process.stdout is not None
        lines = _Lines(process.stdout)
        running: int | None = None
        phase = ""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        try:
            while True:
                try:
                    line = lines.read(deadline)
                except TimeoutError:
                    _kill(process)
                    index = start if running is None else running
                    record(index, {"outcome": "hang", "message": f"no result after {timeout:g} s"
                                   + (f" (phase {phase})" if phase else "")
                                   + ("" if running is not None else ", before the case started"),
                                   "phase": phase, "stderr": _tail(stderr_path, offset)})
                    start = index + 1
                    break
                if line is None:  # the worker ended
                    code = process.wait()
                    if running is None and start >= len(cases):
                        break
                    index = start if running is None else running
                    record(index, {"outcome": "crash", "message": describe_exit(code)
                                   + (f" (phase {phase})" if phase else "")
                                   + ("" if running is not None else ", before the case started"),
                                   "returncode": code, "phase": phase, "stderr": _tail(stderr_path, offset)})
                    start = index + 1
                    break
                if line.get("event") == "start":
                    running, phase = line["i"], ""
                    deadline = time.monotonic() + timeout
                elif line.get("event") == "phase":
                    phase = line["phase"]
                else:
                    record(line["i"], line)
                    running = None
                    start = line["i"] + 1
                    deadline = time.monotonic() + timeout  # the next case's start line is due at once
        finally:
            lines.close()
            process.stdout.close()
            if process.poll() is None:
                _kill(process)
    return results


def make_corpus(families: Iterable[str], count: int, seed: int, workdir: Path) -> tuple[list[Result], list[str]]:
    """The cases of every available family (``count`` each), and the families that are not available."""
    cases: list[Result] = []
    unavailable: list[str] = []
    for family in families:
        module = family_module(family)
        if module is None:
            unavailable.append(family)
            continue
        folder = workdir / family
        folder.mkdir(parents=True, exist_ok=True)
        made = module.make_cases(family, seed, count, folder)
        for case in made:
            missing = {"id", "family", "kind"} - set(case)
            if missing:
                raise ValueError(f"a case of family {family!r} lacks {sorted(missing)}: {case}")
        cases += made
    ids = Counter(case["id"] for case in cases)
    duplicated = [case_id for case_id, n in ids.items() if n > 1]
    if duplicated:
        raise ValueError(f"duplicate case ids: {duplicated[:5]}")
    return cases, unavailable


def run_corpus(families: Iterable[str], count: int, seed: int, jobs: int = 2, timeout: float = DEFAULT_TIMEOUT,
               workdir: Path | None = None, progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Generate ``count`` cases of each available family and run them in ``jobs`` workers: one result a case.

    Families without a module are skipped (see :func:`available_families`).
    The results are in the cases' order.
    """
    with tempfile.TemporaryDirectory(prefix="model-fuzz-") as scratch:
        root = Path(workdir) if workdir is not None else Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        cases, _ = make_corpus(families, count, seed, root)
        jobs = max(1, min(jobs, len(cases)))
        shares = [cases[j::jobs] for j in range(jobs)]
        with ThreadPoolExecutor(jobs) as pool:
            parts = list(pool.map(lambda j: run_share(shares[j], root / f"plan-{j}.json",
                                                      root / f"worker-{j}.stderr", timeout, progress), range(jobs)))
    order = {case["id"]: n for n, case in enumerate(cases)}
    return sorted((r for part in parts for r in part), key=lambda r: order[r["id"]])


def summarize(results: Sequence[Result]) -> str:
    """Counts per family and outcome, per family, kind and outcome, and every defect."""
    lines = []
    for family in sorted({r["family"] for r in results}):
        mine = [r for r in results if r["family"] == family]
        counts = Counter(r["outcome"] for r in mine)
        vague = sum(1 for r in mine if r.get("vague"))
        lines.append(f"{family}: {len(mine)} cases: " + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES)
                     + f"; vague errors {vague}")
        width = max(len(r["kind"]) for r in mine)
        for kind in sorted({r["kind"] for r in mine}):
            by_kind = Counter(r["outcome"] for r in mine if r["kind"] == kind)
            lines.append(f"  {kind:<{width}}  " + ", ".join(f"{o} {n}" for o, n in sorted(by_kind.items())))
        errors = Counter(r["error"] for r in mine if r["outcome"] == "forge-error")
        if errors:
            lines.append("  errors: " + ", ".join(f"{e} {n}" for e, n in errors.most_common()))
    defects = [r for r in results if is_defect(r)]
    lines.append(f"defects: {len(defects)}")
    for r in defects:
        label = "vague forge-error" if r["outcome"] == "forge-error" else r["outcome"]
        detail = " ".join(str(r.get(k, "")) for k in ("error", "message", "frame") if r.get(k))
        lines.append(f"  {r['id']} [{r['kind']}] {label}: {detail[:600]}")
        if r["outcome"] in ("crash", "hang") and r.get("stderr"):
            lines.append("    stderr: " + r["stderr"][-600:].replace("\n", "\n    "))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: run a corpus, print the summary; 1 if there is a defect."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append",
                        help="a family (repeat, or comma-separated); default: every available one")
    parser.add_argument("--cases", type=int, default=300, help="cases per family")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds a case may take")
    parser.add_argument("--workdir", type=Path, help="keep the cases' files and workers' stderr here")
    parser.add_argument("--json", type=Path, help="write every result to this file")
    parser.add_argument("--worker", nargs=2, metavar=("PLAN", "START"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(Path(args.worker[0]), int(args.worker[1]))
        return 0
    families = [f for item in args.family for f in item.split(",") if f] if args.family else list(FAMILY_MODULES)
    families = list(dict.fromkeys(families))
    unavailable = [f for f in families if family_module(f) is None]
    for family in unavailable:
        print(f"{family}: unavailable (no module {FAMILY_MODULES[family]})")
    done = Counter[str]()
    started = time.monotonic()

    def progress(result: Result) -> None:
        done[result["outcome"]] += 1
        total = sum(done.values())
        if total % 100 == 0:
            print(f"  {total} cases, {time.monotonic() - started:.0f} s: {dict(done)}", file=sys.stderr, flush=True)

    results = run_corpus([f for f in families if f not in unavailable], args.cases, args.seed, args.jobs,
                         args.timeout, args.workdir, progress)
    print(summarize(results))
    print(f"{len(results)} cases in {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(is_defect(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
