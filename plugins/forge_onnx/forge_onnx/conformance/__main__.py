"""Run ONNX's backend test suite through Forge, with onnxruntime as the reference.

    python -m forge_onnx.conformance [--backends forge,forge-public,onnxruntime] [--jobs 2] [--filter REGEX]
                                     [--json results.json] [--write-passing]

Prints pass counts per category for each backend, Forge's share of the cases
onnxruntime passes, the operators still missing with how many cases each
blocks, and how the passing list (passing_cases.txt) changed. ``forge`` is
:mod:`forge_onnx.backend` (inputs that only feed constant operands are bound
at run time); ``forge-public`` is the path a user's model takes,
``forge.from_onnx(model).get_inference_function()``: both rates are printed,
and the causes of the cases only the backend passes, most frequent first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from dataclasses import asdict

from forge_onnx.conformance import PASSING_LIST
from forge_onnx.conformance.cases import all_cases
from forge_onnx.conformance.runner import CaseResult, run_cases


def read_passing() -> set[str]:
    if not PASSING_LIST.is_file():
        return set()
    return {line.strip() for line in PASSING_LIST.read_text().splitlines() if line.strip() and not line.startswith("#")}


def write_passing(passing: set[str]) -> None:
    header = "# ONNX backend-suite cases that pass through Forge; the list only grows (tests/test_onnx_conformance.py).\n"
    PASSING_LIST.write_text(header + "".join(f"{case}\n" for case in sorted(passing)))


def missing_operators(results: dict[str, CaseResult]) -> Counter[str]:
    blocked: Counter[str] = Counter()
    for result in results.values():
        match = re.search(r"unsupported (.+)$", result.error)
        if result.status != "pass" and match:
            for op in match.group(1).split(", "):
                blocked[op] += 1
    return blocked


def failing_nodes(results: dict[str, CaseResult]) -> Counter[str]:
    failed: Counter[str] = Counter()
    for result in results.values():
        match = re.search(r"\(op ([\w.]+)\)", result.error)
        if result.status != "pass" and match:
            failed[match.group(1)] += 1
    return failed


def print_public_gap(runs: dict[str, dict[str, CaseResult]], passed: dict[str, set[str]], total: int) -> None:
    """Both Forge rates, and why the public path fails cases the backend passes (grouped by cause)."""
    backend, public = passed["forge"], passed["forge-public"]
    print(f"Pass rate: forge backend {len(backend)}/{total} ({100 * len(backend) / max(total, 1):.1f}%), "
          f"forge.from_onnx(...).get_inference_function() {len(public)}/{total} "
          f"({100 * len(public) / max(total, 1):.1f}%)")
    gap = sorted(backend - public)
    causes: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for case in gap:
        # The error with names and numbers taken out, so that one cause counts once.
        cause = re.sub(r"'[^']*'|\d+", "_", runs["forge-public"][case].error)[:160]
        causes[cause] += 1
        examples.setdefault(cause, case)
    print(f"{len(gap)} cases pass through the backend only; causes on the public path, by cases:")
    for cause, count in causes.most_common(25):
        print(f"  {count:4d}  {cause}  (e.g. {examples[cause]})")
    if public - backend:
        print(f"{len(public - backend)} cases pass through the public path only: {', '.join(sorted(public - backend)[:20])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="forge,forge-public,onnxruntime")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--filter", help="only cases whose name matches this regular expression")
    parser.add_argument("--json", help="write every result here")
    parser.add_argument("--write-passing", action="store_true", help="rewrite passing_cases.txt from this run")
    args = parser.parse_args()

    categories = all_cases()
    names = sorted(n for n in categories if not args.filter or re.search(args.filter, n))
    runs: dict[str, dict[str, CaseResult]] = {}
    for backend in args.backends.split(","):
        started = time.perf_counter()
        done = [0]

        def progress(result: CaseResult) -> None:
            done[0] += 1
            if done[0] % 100 == 0:
                print(f"  {backend}: {done[0]}/{len(names)}", file=sys.stderr, flush=True)

        runs[backend] = run_cases(backend, names, jobs=args.jobs, on_result=progress)
        print(f"{backend}: {len(names)} cases in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    passed = {b: {c for c, r in res.items() if r.status == "pass"} for b, res in runs.items()}
    print(f"{'category':<20}" + "".join(f"{b:>14}" for b in runs) + f"{'cases':>8}")
    for category in sorted(set(categories.values())):
        members = {n for n in names if categories[n] == category}
        print(f"{category:<20}" + "".join(f"{len(passed[b] & members):>14}" for b in runs) + f"{len(members):>8}")
    print(f"{'total':<20}" + "".join(f"{len(passed[b]):>14}" for b in runs) + f"{len(names):>8}")
    if "forge" in passed and "onnxruntime" in passed and passed["onnxruntime"]:
        share = len(passed["forge"] & passed["onnxruntime"]) / len(passed["onnxruntime"])
        print(f"Forge passes {len(passed['forge'] & passed['onnxruntime'])} of the {len(passed['onnxruntime'])} "
              f"cases onnxruntime passes: {100 * share:.1f}%")
    if "forge" in passed and "forge-public" in passed:
        print_public_gap(runs, passed, len(names))
    if "forge" in runs:
        print("Operators Forge lacks, by cases blocked:",
              ", ".join(f"{op} {n}" for op, n in missing_operators(runs["forge"]).most_common()))
        print("Ops of nodes that failed to convert, by cases:",
              ", ".join(f"{op} {n}" for op, n in failing_nodes(runs["forge"]).most_common(40)))
        listed = read_passing()
        regressed = sorted(c for c in listed if c in runs["forge"] and c not in passed["forge"])
        new = sorted(passed["forge"] - listed)
        print(f"Passing list: {len(listed)} cases; {len(new)} newly pass; {len(regressed)} listed cases fail now"
              + (f": {', '.join(regressed[:20])}" if regressed else ""))
        if args.write_passing:
            write_passing((listed - set(names)) | passed["forge"])
            print(f"wrote {PASSING_LIST}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({b: {c: asdict(r) | {"category": categories[c]} for c, r in res.items()}
                       for b, res in runs.items()}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
