"""Latency of each ONNX recurrent operator alone (LSTM, GRU, RNN) in Forge against onnxruntime, in one run.

    .venv/bin/python benchmarks/recurrent_ops.py [--cases lstm_s8_h128_i576,...] [--rounds 3] [--opt-level 3]

Each case is a one-node ONNX model, batch 1 unless named, with random weights
drawn as PyTorch initializes them (uniform in +-1/sqrt(hidden)) and a standard
normal input. Forge compiles it for this machine; both engines are then timed
in ``--rounds`` interleaved rounds, each engine in a fresh process
(benchmarks/timing_worker.py: Forge's artifact through the light runtime,
onnxruntime with as many threads as cores). Figures are medians over rounds;
the ratio range shows the spread on a shared machine. The ``floor`` case is a
one-Relu model: the fixed cost of one call in each engine.

Prints a table and writes benchmarks/results/recurrent_ops.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import forge

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing_worker import run_in_process as _worker  # noqa: E402
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
IR_VERSION = 10  # onnxruntime rejects onnx.helper's default


@dataclass(frozen=True)
class Case:
    """One recurrent node: operator, sequence length, hidden and input sizes, and options."""

    name: str
    op: str
    seq: int
    hidden: int
    inputs: int
    batch: int = 1
    direction: str = "forward"
    linear_before_reset: int = 0


CASES = [
    Case("lstm_s8_h128_i576", "LSTM", 8, 128, 576),
    Case("lstm_s8_h64_i576", "LSTM", 8, 64, 576),
    Case("lstm_s100_h256_i64", "LSTM", 100, 256, 64),
    Case("lstm_s50_h64_i64", "LSTM", 50, 64, 64),
    Case("lstm_bi_s50_h128_i128", "LSTM", 50, 128, 128, direction="bidirectional"),
    Case("gru_s8_h128_i576", "GRU", 8, 128, 576),
    Case("gru_s100_h256_i64", "GRU", 100, 256, 64),
    Case("gru_lbr_s100_h256_i64", "GRU", 100, 256, 64, linear_before_reset=1),
    Case("gru_s50_h64_i64", "GRU", 50, 64, 64),
    Case("rnn_s100_h128_i128", "RNN", 100, 128, 128),
    Case("rnn_s8_h64_i576", "RNN", 8, 64, 576),
]


@dataclass
class Entry:
    case: str
    onnxruntime_us: float
    forge_us: float
    ratio: float
    ratio_range: tuple[float, float]
    max_abs_error: float | None
    compile_s: float


def build_model(case: Case, seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    """The case's one-node model and an input for it."""
    rng = np.random.default_rng(seed)
    gates, dirs = GATES[case.op], 2 if case.direction == "bidirectional" else 1
    bound = 1.0 / np.sqrt(case.hidden)
    tensors = {
        "W": rng.uniform(-bound, bound, (dirs, gates * case.hidden, case.inputs)),
        "R": rng.uniform(-bound, bound, (dirs, gates * case.hidden, case.hidden)),
        "B": rng.uniform(-bound, bound, (dirs, 2 * gates * case.hidden)),
    }
    outputs = ["Y", "Y_h"] + (["Y_c"] if case.op == "LSTM" else [])
    attrs = {"hidden_size": case.hidden, "direction": case.direction}
    if case.op == "GRU":
        attrs["linear_before_reset"] = case.linear_before_reset
    node = helper.make_node(case.op, ["X", "W", "R", "B"], outputs, **attrs)
    state = [dirs, case.batch, case.hidden]
    graph = helper.make_graph(
        [node], case.name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [case.seq, case.batch, case.inputs])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [case.seq, dirs, case.batch, case.hidden])]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, state) for n in outputs[1:]],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tensors.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=IR_VERSION)
    x = rng.standard_normal((case.seq, case.batch, case.inputs)).astype(np.float32)
    return model, x


def floor_model() -> tuple[onnx.ModelProto, np.ndarray]:
    """One Relu on 64 floats: what a call costs in each engine."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "floor",
                              [info("x", TensorProto.FLOAT, [1, 64])], [info("y", TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=IR_VERSION)
    return model, np.ones((1, 64), np.float32)


def _prepare(name: str, model: onnx.ModelProto, x: np.ndarray, work: Path, opt_level: int) -> tuple[Path, Path, Path,
                                                                                                      float]:
    import time

    onnx_path, artifact, inputs_path = work / f"{name}.onnx", work / name, work / f"{name}_inputs.npz"
    onnx.save(model, str(onnx_path))
    np.savez(inputs_path, x)
    started = time.perf_counter()
    forge.from_onnx(model).compile(output_path=artifact, force_overwrite=True, opt_level=opt_level)
    return onnx_path, artifact, inputs_path, time.perf_counter() - started


def run(cases: list[tuple[str, onnx.ModelProto, np.ndarray]], rounds: int, opt_level: int, work: Path) -> list[Entry]:
    """Compile every case, then time onnxruntime and Forge on each, one case after the other, in ``rounds`` rounds."""
    prepared = {name: _prepare(name, model, x, work, opt_level) for name, model, x in cases}
    times: dict[str, dict[str, list[float]]] = {name: {"onnxruntime": [], "forge": []} for name in prepared}
    errors: dict[str, float | None] = {}
    for round_index in range(rounds):
        for name, (onnx_path, artifact, inputs_path, _) in prepared.items():
            times[name]["onnxruntime"].append(_worker("onnxruntime", onnx_path, inputs_path)["median_ms"] * 1000)
            times[name]["forge"].append(_worker("forge", artifact, inputs_path)["median_ms"] * 1000)
            if name not in errors:
                got, want = np.load(f"{inputs_path}.forge.npy"), np.load(f"{inputs_path}.onnxruntime.npy")
                errors[name] = float(np.max(np.abs(got - want))) if got.shape == want.shape else None
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    entries = []
    for name, engines in times.items():
        ratios = [f / o for f, o in zip(engines["forge"], engines["onnxruntime"])]
        entries.append(Entry(name, float(np.median(engines["onnxruntime"])), float(np.median(engines["forge"])),
                             float(np.median(ratios)), (min(ratios), max(ratios)), errors.get(name),
                             prepared[name][3]))
    return entries


def print_table(entries: list[Entry]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("case", "onnxruntime us", "forge us", "x onnxruntime", "ratio range", "max |err| Y", "compile s")
    for e in entries:
        table.add_row(e.case, f"{e.onnxruntime_us:.1f}", f"{e.forge_us:.1f}", f"{e.ratio:.2f}",
                      f"{e.ratio_range[0]:.2f}-{e.ratio_range[1]:.2f}",
                      "-" if e.max_abs_error is None else f"{e.max_abs_error:.1e}", f"{e.compile_s:.1f}")
    Console(width=140).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(c.name for c in CASES),
                        help=f"comma-separated, from: {', '.join(c.name for c in CASES)}")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    parser.add_argument("--opt-level", type=int, default=3)
    parser.add_argument("--no-floor", action="store_true", help="skip the one-Relu model")
    parser.add_argument("--json", default=str(HERE / "results" / "recurrent_ops.json"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, given {args.rounds}")
    known = {c.name: c for c in CASES}
    unknown = [n for n in args.cases.split(",") if n not in known]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {sorted(known)}")
    cases = [(n, *build_model(known[n])) for n in args.cases.split(",")]
    if not args.no_floor:
        cases.append(("floor", *floor_model()))
    with tempfile.TemporaryDirectory(prefix="forge-recurrent-") as tmp:
        entries = run(cases, args.rounds, args.opt_level, Path(tmp))
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
