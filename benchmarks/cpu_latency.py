"""CPU latency of Forge against onnxruntime and torch eager, on three models, in one run.

    .venv/bin/python benchmarks/cpu_latency.py [--models resnet50,mobilenetv2,bert6] [--tune-minutes 30]
    .venv/bin/python benchmarks/cpu_latency.py --models dbnet,vad
    .venv/bin/python benchmarks/cpu_latency.py --target "llvm -mcpu=x86-64-v3"   # the AVX2 class, on any newer CPU

Models, batch 1, threads = cores:
* resnet50: the ONNX ResNet-50 shipped in the onnx wheel (light_resnet50.onnx);
* mobilenetv2: MobileNetV2 built in torch (benchmarks/models.py), 224x224;
* bert6: a 6-layer BERT-style encoder built in torch: hidden 384, 12 heads, sequence 128.

Not in the default set (``--models dbnet,vad``), built in torch:
* dbnet: a DBNet-style text detector (MobileNetV3 x0.5, FPN neck, ConvTranspose head), 640x640;
* vad: a Silero-style voice-activity detector (conv1d per frame, LSTM over frames), 8 frames of 576 samples.

Every engine is timed in a process of its own (benchmarks/timing_worker.py):
Forge's artifact through the light runtime, onnxruntime on the same ONNX
graph, torch eager on the torch model, in ``--rounds`` interleaved rounds
(figures: medians over rounds; the ratio range shows the spread). The
"fallback %" column is the share of Forge's time in kernels that no schedule
rule took (the generic schedule or none), from a profile of the artifact; the
target is under 5% on every model. Forge
untuned is the default compile(); Forge tuned adds ``IRModule.tune`` within
``--tune-minutes`` per model, its database kept in ``--db-dir`` and reused by
later runs. ``--target`` compiles (and tunes) for another target than this machine's (default ``llvm``, this
CPU): ``"llvm -mcpu=x86-64-v3"`` measures the AVX2 class on an AVX-512 machine (onnxruntime and torch still
run their own kernels for this CPU). Prints a table and writes benchmarks/results/cpu_latency.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

import forge

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import BertEncoder, DBNet, MobileNetV2, VoiceActivity, randomized  # noqa: E402
from timing_worker import run_in_process as _worker  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@dataclass
class Entry:
    model: str
    engine: str
    median_ms: float
    p90_ms: float
    ratio_to_onnxruntime: float | None = None
    compile_s: float | None = None
    tuning_s: float | None = None
    max_abs_error_vs_onnxruntime: float | None = None
    threads: int | None = None
    ratio_range: tuple[float, float] | None = None
    fallback_share: float | None = None
    fallbacks: list[str] | None = None


@dataclass
class Case:
    name: str
    onnx_path: Path
    inputs: list[np.ndarray]
    torch_path: Path | None
    load: object  # () -> forge.IRModule


def _torch_case(name: str, model: torch.nn.Module, example: torch.Tensor, input_name: str, work: Path) -> Case:
    onnx_path, torch_path = work / f"{name}.onnx", work / f"{name}.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(onnx_path), input_names=[input_name], opset_version=17,
                          dynamo=False)
    torch.save(model, torch_path)
    spec = [(input_name, (tuple(example.shape), str(example.dtype).removeprefix("torch.")))]
    return Case(name, onnx_path, [example.numpy()], torch_path, lambda: forge.from_torch(model, spec))


def build_cases(names: list[str], work: Path) -> list[Case]:
    cases = []
    for name in names:
        if name == "resnet50":
            path = LIGHT / "light_resnet50.onnx"
            shape = (1, 3, 224, 224)
            x = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
            cases.append(Case(name, path, [x], None, lambda path=path: forge.from_onnx(path)))
        elif name == "mobilenetv2":
            model = randomized(MobileNetV2(), seed=1)
            cases.append(_torch_case(name, model, torch.randn(1, 3, 224, 224), "image", work))
        elif name == "bert6":
            model = randomized(BertEncoder(), seed=2)
            ids = torch.randint(0, 30522, (1, 128), generator=torch.Generator().manual_seed(0))
            cases.append(_torch_case(name, model, ids, "input_ids", work))
        elif name == "dbnet":
            model = randomized(DBNet(), seed=3)
            cases.append(_torch_case(name, model, torch.rand(1, 3, 640, 640), "image", work))
        elif name == "vad":
            model = randomized(VoiceActivity(), seed=4)
            cases.append(_torch_case(name, model, torch.randn(1, 8, 576) * 0.1, "audio", work))
        else:
            raise SystemExit(f"unknown model {name!r}")
    return cases


def _tuned_database(case: Case, db_dir: Path, minutes: float, target: str = "llvm") -> tuple[Path, float]:
    """The case's tuning database for ``target`` in ``db_dir``: reused when a previous run left one, else tuned
    now."""
    stem = case.name if target == "llvm" else f"{case.name}_{re.sub(r'[^A-Za-z0-9]+', '-', target).strip('-')}"
    database = db_dir / f"{stem}_db"
    record = db_dir / f"{stem}_tuning.json"
    if record.exists() and database.exists():
        tuning_s = json.loads(record.read_text())["tuning_s"]
        print(f"{case.name}: reusing the tuning database {database} ({tuning_s:.0f} s of tuning)")
        return database, tuning_s
    # Tune in a process of its own: MetaSchedule's worker processes must not outlive it into the timings.
    done = subprocess.run([sys.executable, str(Path(__file__)), "--tune-worker", case.name, str(database),
                           str(minutes), target], check=True, capture_output=True, text=True)
    print(done.stdout)
    tuning_s = json.loads(done.stdout.strip().splitlines()[-1])["tuning_s"]
    record.write_text(json.dumps({"tuning_s": tuning_s, "minutes": minutes}) + "\n")
    return database, tuning_s


def run_case(case: Case, work: Path, tune_minutes: float, rounds: int, db_dir: Path,
             target: str = "llvm") -> list[Entry]:
    """Compile (and tune), then time every engine in ``rounds`` interleaved rounds.

    Each round times onnxruntime, Forge untuned, Forge tuned and torch one after
    the other, each in a fresh process. A figure is the median over rounds, and a
    ratio the median of the per-round ratios to onnxruntime: on a shared machine
    the load changes between minutes, and interleaving spreads it over engines.
    """
    inputs_path = work / f"{case.name}_inputs.npz"
    np.savez(inputs_path, *case.inputs)
    ir = case.load()
    artifact = work / f"{case.name}_untuned"
    started = time.perf_counter()
    ir.compile(target, output_path=artifact, force_overwrite=True)
    compile_s = time.perf_counter() - started

    engines: dict[str, tuple[str, Path]] = {"onnxruntime": ("onnxruntime", case.onnx_path),
                                            "forge untuned": ("forge", artifact)}
    extra: dict[str, dict] = {"forge untuned": {"compile_s": compile_s}}
    if tune_minutes > 0:
        database, tuning_s = _tuned_database(case, db_dir, tune_minutes, target)
        ir.tuning_database = database
        artifact = work / f"{case.name}_tuned"
        ir.compile(target, output_path=artifact, force_overwrite=True)
        engines["forge tuned"] = ("forge", artifact)
        extra["forge tuned"] = {"compile_s": compile_s, "tuning_s": tuning_s}
    if case.torch_path is not None:
        engines["torch eager"] = ("torch", case.torch_path)

    results: dict[str, list[dict]] = {name: [] for name in engines}
    errors: dict[str, float] = {}
    for _ in range(rounds):
        for name, (engine, path) in engines.items():
            results[name].append(_worker(engine, path, inputs_path))
            if engine == "forge" and name not in errors:
                out = np.load(f"{inputs_path}.forge.npy")
                errors[name] = float(np.max(np.abs(out - np.load(f"{inputs_path}.onnxruntime.npy"))))
    reference = results["onnxruntime"]
    entries = []
    for name, runs in results.items():
        ratios = [r["median_ms"] / ref["median_ms"] for r, ref in zip(runs, reference)]
        entries.append(Entry(case.name, name, float(np.median([r["median_ms"] for r in runs])),
                             float(np.median([r["p90_ms"] for r in runs])), float(np.median(ratios)),
                             max_abs_error_vs_onnxruntime=errors.get(name), threads=runs[0]["threads"],
                             ratio_range=(min(ratios), max(ratios)),
                             fallback_share=runs[0].get("fallback_share"), fallbacks=runs[0].get("fallbacks"),
                             **extra.get(name, {})))
    return entries


def print_table(entries: list[Entry]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "engine", "median ms", "p90 ms", "x onnxruntime", "ratio range", "compile s",
                  "tuning s", "max |err| vs ort", "threads", "fallback %")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for e in entries:
        table.add_row(e.model, e.engine, fmt(e.median_ms, ".2f"), fmt(e.p90_ms, ".2f"),
                      fmt(e.ratio_to_onnxruntime, ".2f"),
                      "-" if e.ratio_range is None else f"{e.ratio_range[0]:.2f}-{e.ratio_range[1]:.2f}",
                      fmt(e.compile_s, ".1f"), fmt(e.tuning_s, ".0f"),
                      fmt(e.max_abs_error_vs_onnxruntime, ".1e"), fmt(e.threads, "d"),
                      "-" if e.fallback_share is None else f"{100 * e.fallback_share:.1f}")
    Console(width=180).print(table)
    for e in entries:
        if e.fallbacks:
            print(f"{e.model} ({e.engine}): slowest fallback kernels: {', '.join(e.fallbacks)}")


def tune_worker(name: str, database: str, minutes: float, target: str = "llvm") -> int:
    with tempfile.TemporaryDirectory(prefix="forge-bench-tune-") as tmp:
        (case,) = build_cases([name], Path(tmp))
        ir = case.load()
        started = time.perf_counter()
        report = ir.tune(target, work_dir=database, trials=100_000, time_budget=minutes * 60, progress=False)
        print(report.summary())
        print(json.dumps({"tuning_s": time.perf_counter() - started}))
    return 0


def main() -> int:
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--tune-worker":
        return tune_worker(*sys.argv[2:4], float(sys.argv[4]), *sys.argv[5:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,mobilenetv2,bert6")
    parser.add_argument("--tune-minutes", type=float, default=0.0, help="tuning budget per model (0: skip)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    parser.add_argument("--db-dir", default=str(HERE / "results" / "tuning"),
                        help="where tuning databases are kept; an existing one is reused instead of tuning again")
    parser.add_argument("--target", default="llvm",
                        help='Forge\'s target (default: this CPU); "llvm -mcpu=x86-64-v3" for the AVX2 class')
    parser.add_argument("--json", default=str(HERE / "results" / "cpu_latency.json"))
    args = parser.parse_args()
    print(f"Forge target: {args.target}", flush=True)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, given {args.rounds}")
    db_dir = Path(args.db_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    entries: list[Entry] = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-") as tmp:
        work = Path(tmp)
        for case in build_cases(args.models.split(","), work):
            entries += run_case(case, work, args.tune_minutes, args.rounds, db_dir, args.target)
            print_table([e for e in entries if e.model == case.name])
    print_table(entries)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(e) for e in entries], indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    sys.exit(main())
