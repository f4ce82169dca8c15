"""Speed of Forge's static int8 against Forge fp32 and onnxruntime int8/fp32, with the int8 accuracy, in one run.

    .venv/bin/python benchmarks/int8_speed.py [--models resnet50,mobilenetv2,bert6] [--method mse]
    .venv/bin/python benchmarks/int8_speed.py --models mobilenetv2 --size 64 --samples 4 --eval-samples 2 --rounds 1

Models, batch 1, random weights (no downloads), exported by torch's TorchScript
exporter at opset 17:
* resnet50: transformers' ``ResNetForImageClassification(ResNetConfig())``, ``--size`` x ``--size`` (224);
* mobilenetv2: MobileNetV2 built in torch (benchmarks/models.py), ``--size`` x ``--size``;
* bert6: the 6-layer BERT-style encoder of cpu_latency.py: hidden 384, 12 heads, sequence 128.

The CNNs are built as in quantization_accuracy.py, batch norms folded into the
convolutions (eval mode), their statistics re-estimated on images of their own
when the model as built gives degenerate logits (``--bn-stats auto``, the
default there too: MobileNetV2 is re-estimated, ResNet-50 is not), and fed
smooth random images (``smooth_images``); bert6 is fed random token ids.
``--samples`` inputs calibrate, ``--eval-samples`` others evaluate; the first
evaluation input is the one timed.

Five engines:
* Forge fp32: ``forge.from_onnx(path).compile()`` with the default options;
* Forge int8: ``calibrate`` on the calibration inputs, then ``quantize(activation_dtype="int8",
  per_channel=True, calib_method=--method, quant_type="static")`` and the default ``compile()``;
* onnxruntime fp32 on the exported model;
* onnxruntime int8: ``quant_pre_process`` (skip with ``--no-preprocess``), then
  ``quantize_static`` in QDQ format, QInt8 activations and weights, per_channel,
  the same calibration inputs, the counterpart of ``--method`` from
  quantization_accuracy.py's table (minmax <-> MinMax, quantize_static's
  default; entropy <-> Entropy, which at quantize_static's defaults equals
  MinMax; ...);
* Forge on onnxruntime's int8 model: that QDQ model, ``forge.from_onnx(...).compile()``:
  the same int8 model in both engines (its outputs against onnxruntime int8's
  are printed: the share of equal elements and the SQNR).

Every engine is timed in a process of its own (benchmarks/timing_worker.py),
in ``--rounds`` interleaved rounds; figures are medians over rounds, a ratio is
the median of the per-round ratios (the range shows the spread). Accuracy is
each int8 model's output SQNR against onnxruntime fp32 over the evaluation
inputs, ``10 log10(sum(ref^2) / sum((q - ref)^2))`` dB (Forge through
``forge.Runtime``). The schedule line counts the Forge int8 kernels each
schedule rule took (the artifact's ``schedules`` metadata) and their share of
its time (a profile, ``--profile-repeat`` runs, after the timings);
"fallback %" is the share of Forge int8's time in kernels no rule took (the
generic schedule or none).

A trained model's accuracy, not timed (``--no-trained`` skips it): with
mobilenetv2, a MobileNetV2 trained from scratch on scikit-learn's digits
(quantization_accuracy.train_mobilenetv2_on_digits, ``--digits-size`` 112,
``--digits-epochs`` 6, about 2 minutes) is quantized by both engines the same
way (``--samples`` training digits calibrate, ``--method``) and evaluated on
``--digits-eval`` held-out digits: output SQNR against onnxruntime fp32 and
top-1. Random-weight MobileNetV2s amplify any early perturbation by some 30 dB
(see that function), so their int8 SQNR says little about Forge.

The default ``--method`` is mse (the range of least squared error, Forge's
addition; onnxruntime's counterpart is MinMax, its default): the one method
that holds both the trained MobileNetV2 and ResNet-50 (minmax loses ResNet-50
some 2 dB; Forge's entropy, TensorRT's KL search, clips the trained
MobileNetV2 to 5 dB and 73% top-1; see the README's accuracy table).

Targets (issue 14): Forge int8 / Forge fp32 <= 0.6 (issue 37, for x86 without VNNI, whose integer
kernels run on ``vpmaddwd``: <= 0.7 for resnet50 and bert6, <= 0.8 for mobilenetv2); Forge int8 / onnxruntime
int8 < 1; int8 SQNR >= 25 dB on the CNNs (MobileNetV2: the trained one).
Prints a table per model and writes benchmarks/results/int8_speed.json
(``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType, quant_pre_process,
                                      quantize_static)

import forge

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import BertEncoder, randomized  # noqa: E402
from timing_worker import run_in_process as _worker  # noqa: E402
from quantization_accuracy import (METHODS, MODELS, Method, Reader, export, logits_check, ort_run,  # noqa: E402
                                   percent, reestimate_batch_norms, smooth_images, sqnr_db, top1,
                                   torch_logits, train_mobilenetv2_on_digits)

ENGINES = ("forge fp32", "forge int8", "onnxruntime fp32", "onnxruntime int8", "forge on ORT int8")
TARGET_SPEEDUP = 0.6  # Forge int8 / Forge fp32 (issue 14: x86 with VNNI)
# Issue 37: x86 without VNNI (AVX2; AVX-512 without VNNI), whose integer kernels run on vpmaddwd
TARGET_SPEEDUP_WITHOUT_VNNI = {"resnet50": 0.7, "mobilenetv2": 0.8, "bert6": 0.7}
TARGET_VS_ORT = 1.0  # Forge int8 / onnxruntime int8
TARGET_SQNR_DB = 25.0  # the CNNs
CNNS = tuple(MODELS)  # resnet50, mobilenetv2
BERT_SEQUENCE, BERT_VOCAB = 128, 30522


@dataclass
class Case:
    name: str
    onnx_path: Path
    input_name: str
    calib: list[np.ndarray]
    evaluation: list[np.ndarray]
    bn_statistics: str | None = None  # the CNNs: "as built" or "re-estimated"


@dataclass
class Result:
    model: str
    median_ms: dict[str, float | None] = field(default_factory=dict)
    p90_ms: dict[str, float | None] = field(default_factory=dict)
    int8_over_fp32: float | None = None  # Forge int8 / Forge fp32
    speedup_target: float = TARGET_SPEEDUP  # its target for the compile target's class (speedup_target())
    int8_over_fp32_range: tuple[float, float] | None = None
    int8_over_ort_int8: float | None = None  # Forge int8 / onnxruntime int8
    int8_over_ort_int8_range: tuple[float, float] | None = None
    same_model_over_ort: float | None = None  # Forge on onnxruntime's int8 model / onnxruntime int8
    same_model_over_ort_range: tuple[float, float] | None = None
    same_model_agreement: dict[str, float] | None = None  # Forge on ORT's model vs ORT: equal share, SQNR dB
    forge_int8_sqnr_db: float | None = None
    ort_int8_sqnr_db: float | None = None
    forge_fp32_sqnr_db: float | None = None  # a check of the float path
    threads: int | None = None
    schedules: dict[str, dict[str, int]] = field(default_factory=dict)  # engine -> {rule: kernels}
    schedule_time_share: dict[str, dict[str, float]] = field(default_factory=dict)  # engine -> {rule: share}
    fallback_share: dict[str, float | None] = field(default_factory=dict)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # export, calibrate, quantize, compile...
    rounds: dict[str, list[dict]] = field(default_factory=dict)
    fp32_output_check: dict | None = None
    bn_statistics: str | None = None
    trained: dict | None = None  # mobilenetv2: int8 accuracy on the digits-trained MobileNetV2 (trained_accuracy)
    errors: dict[str, str] = field(default_factory=dict)


def _error() -> str:
    text = traceback.format_exc()
    print(text, file=sys.stderr, flush=True)
    return text


def _token_ids(count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, BERT_VOCAB, (1, BERT_SEQUENCE), dtype=np.int64) for _ in range(count)]


def build_case(name: str, args: argparse.Namespace, work: Path) -> Case:
    path = work / f"{name}.onnx"
    if name in CNNS:
        model = MODELS[name]()
        calib = smooth_images(args.samples, args.size, seed=1)
        evaluation = smooth_images(args.eval_samples, args.size, seed=2)
        reestimate = args.bn_stats == "reestimate" or (
            args.bn_stats == "auto" and bool(logits_check(torch_logits(model, evaluation))["degenerate"]))
        if reestimate:  # on images of their own, neither calibration nor evaluation ones
            reestimate_batch_norms(model, smooth_images(args.bn_images, args.size, seed=3))
        export(model, (torch.zeros(1, 3, args.size, args.size),), path, ["pixel_values"], ["logits"])
        return Case(name, path, "pixel_values", calib, evaluation, "re-estimated" if reestimate else "as built")
    if name == "bert6":
        export(randomized(BertEncoder(), seed=2), (torch.zeros(1, BERT_SEQUENCE, dtype=torch.int64),), path,
               ["input_ids"], ["hidden"])
        return Case(name, path, "input_ids", _token_ids(args.samples, seed=1), _token_ids(args.eval_samples, seed=2))
    raise SystemExit(f"unknown model {name!r}")


def ort_int8(model_path: Path, out: Path, input_name: str, calib: list[np.ndarray], method: Method) -> None:
    """quantization_accuracy.ort_quantized (per_channel) for an input of any name (it reads ``pixel_values``)."""
    reader = Reader(input_name, calib)
    with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print their settings
        quantize_static(str(model_path), str(out), reader, quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                        calibrate_method=getattr(CalibrationMethod, method.ort_method),
                        extra_options=dict(method.ort_extra))


def ort_int8_model(model_path: Path, work: Path, input_name: str, calib: list[np.ndarray], method: Method,
                   no_preprocess: bool) -> Path:
    """onnxruntime's int8 model of ``model_path``: ``quant_pre_process`` (unless ``no_preprocess``), ``ort_int8``."""
    ort_input = model_path
    if not no_preprocess:
        ort_input = work / f"{model_path.stem}_pre.onnx"
        quant_pre_process(str(model_path), str(ort_input))
    quantized = work / f"{model_path.stem}_ort_int8.onnx"
    ort_int8(ort_input, quantized, input_name, calib, method)
    return quantized


def forge_int8(ir: forge.IRModule, calib: list[np.ndarray], method: Method, artifact: Path,
               seconds: dict[str, float], step: list[str], target: str = "llvm") -> None:
    """``ir`` calibrated, quantized (static int8, per channel, ``method``) and compiled to ``artifact``.

    Each step's time goes into ``seconds``; ``step[0]`` names the step under way (for the error report).
    """
    for name, action in (("calibrate", lambda: ir.calibrate(calib, use_cuda=False)),
                         ("quantize", lambda: ir.quantize(activation_dtype="int8", per_channel=True,
                                                          calib_method=method.forge_method, quant_type="static",
                                                          percentile=method.forge_percentile)),
                         ("compile", lambda: ir.compile(target, output_path=artifact, force_overwrite=True))):
        step[0], t = name, time.perf_counter()
        action()
        seconds[f"forge_{name}" if name != "compile" else "forge_int8_compile"] = time.perf_counter() - t


def trained_accuracy(args: argparse.Namespace, work: Path) -> dict:
    """Int8 accuracy of both engines on a MobileNetV2 trained on scikit-learn's digits (not timed).

    quantization_accuracy.train_mobilenetv2_on_digits at ``--digits-size``,
    calibrated on ``--samples`` training digits with ``--method``, evaluated on
    ``--digits-eval`` held-out digits: each int8 model's output SQNR against
    onnxruntime fp32, and the top-1 of every engine.
    """
    method, threads = METHODS[args.method], len(os.sched_getaffinity(0))
    digits = train_mobilenetv2_on_digits(args.digits_size, args.digits_epochs, args.samples, args.digits_eval)
    path = work / "mobilenetv2_digits.onnx"
    export(digits.model, (torch.zeros(1, 3, digits.size, digits.size),), path, ["pixel_values"], ["logits"])
    reference = ort_run(path, digits.evaluation, threads)
    found: dict = {"model": "MobileNetV2 trained on scikit-learn's digits", "size": digits.size,
                   "train_s": digits.train_s, "torch_top1_held_out": digits.test_top1,
                   "evaluation_digits": len(digits.evaluation), "fp32_top1": top1(reference, digits.labels),
                   "seconds": {}, "errors": {}}
    step = ["calibrate"]
    try:
        artifact = work / "mobilenetv2_digits_forge_int8"
        forge_int8(forge.from_onnx(str(path)), digits.calib, method, artifact, found["seconds"], step)
        step = ["run"]
        outputs = _forge_outputs(artifact, digits.evaluation)
        found["forge_int8_sqnr_db"], found["forge_int8_top1"] = sqnr_db(reference, outputs), top1(outputs,
                                                                                                   digits.labels)
    except Exception:  # noqa: BLE001 - reported
        found["errors"]["forge int8"] = f"{step[0]}: {_error()}"
    try:
        outputs = ort_run(ort_int8_model(path, work, "pixel_values", digits.calib, method, args.no_preprocess),
                          digits.evaluation, threads)
        found["ort_int8_sqnr_db"], found["ort_int8_top1"] = sqnr_db(reference, outputs), top1(outputs, digits.labels)
    except Exception:  # noqa: BLE001
        found["errors"]["onnxruntime int8"] = _error()
    print(_trained_line(found), flush=True)
    return found


def _trained_line(found: dict) -> str:
    return (f"mobilenetv2 trained on digits ({found['size']}x{found['size']}, {found['train_s']:.0f} s to train): "
            f"int8 SQNR Forge {_fmt(found.get('forge_int8_sqnr_db'), '.1f')} dB, onnxruntime "
            f"{_fmt(found.get('ort_int8_sqnr_db'), '.1f')} dB; top-1 over {found['evaluation_digits']} held-out "
            f"digits: fp32 {percent(found['fp32_top1'])}, Forge int8 {percent(found.get('forge_int8_top1'))}, "
            f"onnxruntime int8 {percent(found.get('ort_int8_top1'))}"
            + "".join(f"; {engine} FAILED: {text.strip().splitlines()[-1]}"
                      for engine, text in found["errors"].items()))


def _forge_outputs(artifact: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    runtime = forge.Runtime(artifact)
    return [np.asarray(runtime.infer(x)[0]) for x in inputs]


def _rule_counts(artifact: Path) -> dict[str, int]:
    schedules = forge.Runtime(artifact).get_metadata().get("schedules") or {}
    return dict(Counter(schedules.get("rules", {}).values()).most_common())


def _rule_shares(artifact: Path, inputs: np.ndarray, repeat: int) -> dict[str, float]:
    """The share of the profiled time in the kernels of each schedule rule ("-": calls that are no kernel)."""
    shares: Counter[str] = Counter()
    for row in forge.Runtime(artifact).profile(inputs, repeat=repeat):
        shares[row.rule or "-"] += row.share
    return dict(shares.most_common())


def speedup_target(model: str, target: str) -> float:
    """The Forge int8 / fp32 target for ``model`` compiled for ``target``: issue 14's where the CPU class has a
    byte dot product (VNNI, Arm ``+dotprod``), issue 37's where its integer kernels run on ``vpmaddwd``."""
    from forge_core.schedules.int8 import dot_product
    from forge_core.targets.parsing import resolve_target

    found = dot_product(resolve_target(target))
    if found is not None and found.widened is not None:
        return TARGET_SPEEDUP_WITHOUT_VNNI.get(model, TARGET_SPEEDUP)
    return TARGET_SPEEDUP


def run_case(case: Case, args: argparse.Namespace, work: Path, result: Result) -> None:
    method = METHODS[args.method]
    result.speedup_target = speedup_target(case.name, args.target)
    threads = len(os.sched_getaffinity(0))
    reference = ort_run(case.onnx_path, case.evaluation, threads)
    result.fp32_output_check = logits_check(reference)
    if result.fp32_output_check["degenerate"]:
        print(f"{case.name}: fp32 outputs DEGENERATE ({', '.join(result.fp32_output_check['degenerate'])}): "
              "the SQNR figures mean little", flush=True)
    engines: dict[str, tuple[str, Path]] = {}

    t = time.perf_counter()
    ir = forge.from_onnx(str(case.onnx_path))
    fp32_artifact = work / f"{case.name}_forge_fp32"
    try:
        ir.copy().compile(args.target, output_path=fp32_artifact, force_overwrite=True)
        result.seconds["forge_fp32_compile"] = time.perf_counter() - t
        engines["forge fp32"] = ("forge", fp32_artifact)
        result.forge_fp32_sqnr_db = sqnr_db(reference, _forge_outputs(fp32_artifact, case.evaluation))
        result.schedules["forge fp32"] = _rule_counts(fp32_artifact)
    except Exception:  # noqa: BLE001 - reported, the other engines still run
        result.errors["forge fp32"] = _error()

    int8_artifact = work / f"{case.name}_forge_int8"
    step = ["calibrate"]
    try:
        forge_int8(ir, case.calib, method, int8_artifact, result.seconds, step, args.target)
        engines["forge int8"] = ("forge", int8_artifact)
        step = ["run"]
        result.forge_int8_sqnr_db = sqnr_db(reference, _forge_outputs(int8_artifact, case.evaluation))
        result.schedules["forge int8"] = _rule_counts(int8_artifact)
    except Exception:  # noqa: BLE001
        result.errors["forge int8"] = f"{step[0]}: {_error()}"
    print(f"{case.name}: Forge compiled ({', '.join(f'{k} {v:.0f} s' for k, v in result.seconds.items())})",
          flush=True)

    engines["onnxruntime fp32"] = ("onnxruntime", case.onnx_path)
    t = time.perf_counter()
    try:
        quantized = ort_int8_model(case.onnx_path, work, case.input_name, case.calib, method, args.no_preprocess)
        result.seconds["ort_quantize"] = time.perf_counter() - t
        engines["onnxruntime int8"] = ("onnxruntime", quantized)
        ort_outputs = ort_run(quantized, case.evaluation, threads)
        result.ort_int8_sqnr_db = sqnr_db(reference, ort_outputs)
    except Exception:  # noqa: BLE001
        result.errors["onnxruntime int8"] = _error()
    if "onnxruntime int8" in engines:
        try:
            same_model = work / f"{case.name}_forge_on_ort_int8"
            t = time.perf_counter()
            forge.from_onnx(str(engines["onnxruntime int8"][1])).compile(args.target, output_path=same_model,
                                                                         force_overwrite=True)
            result.seconds["forge_on_ort_int8_compile"] = time.perf_counter() - t
            engines["forge on ORT int8"] = ("forge", same_model)
            got = _forge_outputs(same_model, case.evaluation)
            result.same_model_agreement = {
                "equal": float(np.mean([np.mean(g == o) for g, o in zip(got, ort_outputs)])),
                "sqnr_db": sqnr_db(ort_outputs, got)}
            result.schedules["forge on ORT int8"] = _rule_counts(same_model)
        except Exception:  # noqa: BLE001
            result.errors["forge on ORT int8"] = _error()
    print(f"{case.name}: int8 SQNR vs onnxruntime fp32: Forge {_fmt(result.forge_int8_sqnr_db, '.1f')} dB, "
          f"onnxruntime {_fmt(result.ort_int8_sqnr_db, '.1f')} dB; Forge fp32 "
          f"{_fmt(result.forge_fp32_sqnr_db, '.1f')} dB", flush=True)

    inputs_path = work / f"{case.name}_inputs.npz"
    np.savez(inputs_path, case.evaluation[0])
    runs: dict[str, list[dict]] = {name: [] for name in ENGINES if name in engines}
    for index in range(args.rounds):
        for name in runs:
            engine, path = engines[name]
            try:
                runs[name].append(_worker(engine, path, inputs_path))
            except Exception:  # noqa: BLE001
                result.errors.setdefault(f"{name} timing", _error())
        print(f"{case.name}: round {index + 1}/{args.rounds}: "
              + ", ".join(f"{name} {r[-1]['median_ms']:.2f} ms" for name, r in runs.items() if r), flush=True)
    result.rounds = runs
    for name in ENGINES:
        done = runs.get(name) or []
        result.median_ms[name] = float(np.median([r["median_ms"] for r in done])) if done else None
        result.p90_ms[name] = float(np.median([r["p90_ms"] for r in done])) if done else None
        if done and "fallback_share" in done[0]:
            result.fallback_share[name] = done[0]["fallback_share"]
            result.fallbacks[name] = done[0]["fallbacks"]
        if done and result.threads is None:
            result.threads = done[0]["threads"]
    for name in ("forge fp32", "forge int8"):  # after the timings: the instrumented runs are slower
        if name in engines and args.profile_repeat > 0:
            try:
                result.schedule_time_share[name] = _rule_shares(engines[name][1], case.evaluation[0],
                                                                args.profile_repeat)
            except Exception:  # noqa: BLE001
                result.errors[f"{name} profile"] = _error()
    result.int8_over_fp32, result.int8_over_fp32_range = _ratio(runs, "forge int8", "forge fp32")
    result.int8_over_ort_int8, result.int8_over_ort_int8_range = _ratio(runs, "forge int8", "onnxruntime int8")
    result.same_model_over_ort, result.same_model_over_ort_range = _ratio(runs, "forge on ORT int8",
                                                                          "onnxruntime int8")


def _ratio(runs: dict[str, list[dict]], numerator: str, denominator: str
           ) -> tuple[float | None, tuple[float, float] | None]:
    """The median over rounds of the per-round ratio, and its range (rounds where both engines ran)."""
    pairs = list(zip(runs.get(numerator, []), runs.get(denominator, [])))
    if not pairs:
        return None, None
    ratios = [a["median_ms"] / b["median_ms"] for a, b in pairs]
    return float(np.median(ratios)), (min(ratios), max(ratios))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio_cell(value: float | None, spread: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" + ("" if spread is None or spread[0] == spread[1] else f" ({spread[0]:.2f}-{spread[1]:.2f})")


def print_table(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "Forge fp32 ms", "Forge int8 ms", "ORT fp32 ms", "ORT int8 ms", "Forge on ORT int8 ms",
                  "Forge int8/fp32 (<= target)", f"Forge int8/ORT int8 (< {TARGET_VS_ORT:g})",
                  "same model: Forge/ORT",
                  "Forge int8 SQNR dB", "ORT int8 SQNR dB", "int8 fallback %", "threads")
    for r in results:
        share = r.fallback_share.get("forge int8")
        table.add_row(r.model, *(_fmt(r.median_ms.get(name), ".2f") for name in ENGINES),
                      _ratio_cell(r.int8_over_fp32, r.int8_over_fp32_range),
                      _ratio_cell(r.int8_over_ort_int8, r.int8_over_ort_int8_range),
                      _ratio_cell(r.same_model_over_ort, r.same_model_over_ort_range),
                      _fmt(r.forge_int8_sqnr_db, ".1f"), _fmt(r.ort_int8_sqnr_db, ".1f"),
                      "-" if share is None else f"{100 * share:.1f}", _fmt(r.threads, "d"))
    Console(width=200).print(table)
    for r in results:
        for engine in ("forge int8", "forge fp32"):
            counts, shares = r.schedules.get(engine), r.schedule_time_share.get(engine, {})
            if counts:
                print(f"{r.model} ({engine}) schedules: {sum(counts.values())} kernels: "
                      + ", ".join(f"{rule} {n}" + (f" ({100 * shares[rule]:.1f}% of the time)" if rule in shares
                                                   else "") for rule, n in counts.items()))
        if r.fallbacks.get("forge int8"):
            print(f"{r.model} (forge int8): slowest fallback kernels: {', '.join(r.fallbacks['forge int8'])}")
        if r.bn_statistics:
            print(f"{r.model}: batch-norm statistics {r.bn_statistics}; Forge fp32 vs onnxruntime fp32 "
                  f"{_fmt(r.forge_fp32_sqnr_db, '.1f')} dB")
        if r.trained is not None:
            print(_trained_line(r.trained))
        if r.same_model_agreement is not None:
            print(f"{r.model}: Forge on onnxruntime's int8 model vs onnxruntime: "
                  f"{100 * r.same_model_agreement['equal']:.2f}% of the outputs equal, "
                  f"SQNR {r.same_model_agreement['sqnr_db']:.1f} dB")
        print(f"{r.model}: targets: " + "; ".join(_verdicts(r)))
        for engine, text in r.errors.items():
            print(f"{r.model}: {engine} FAILED: {text.strip().splitlines()[-1]}")


def _verdicts(r: Result) -> list[str]:
    def verdict(value: float | None, ok: bool) -> str:
        return "not measured" if value is None else ("met" if ok else "missed")

    lines = [f"Forge int8/fp32 {_fmt(r.int8_over_fp32, '.2f')} <= {r.speedup_target:g}: "
             + verdict(r.int8_over_fp32, r.int8_over_fp32 is not None and r.int8_over_fp32 <= r.speedup_target),
             f"Forge int8/ORT int8 {_fmt(r.int8_over_ort_int8, '.2f')} < {TARGET_VS_ORT:g}: "
             + verdict(r.int8_over_ort_int8, r.int8_over_ort_int8 is not None and r.int8_over_ort_int8 < TARGET_VS_ORT)]
    if r.model in CNNS:
        lines.append(f"Forge int8 SQNR {_fmt(r.forge_int8_sqnr_db, '.1f')} dB >= {TARGET_SQNR_DB:g}"
                     + (" (random weights)" if r.trained is not None else "") + ": "
                     + verdict(r.forge_int8_sqnr_db,
                               r.forge_int8_sqnr_db is not None and r.forge_int8_sqnr_db >= TARGET_SQNR_DB))
    if r.trained is not None:
        value = r.trained.get("forge_int8_sqnr_db")
        lines.append(f"Forge int8 SQNR {_fmt(value, '.1f')} dB >= {TARGET_SQNR_DB:g} (trained on digits): "
                     + verdict(value, value is not None and value >= TARGET_SQNR_DB))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,mobilenetv2,bert6",
                        help=f"a subset of {', '.join((*CNNS, 'bert6'))}")
    parser.add_argument("--method", choices=tuple(METHODS), default="mse",
                        help="Forge's calib_method (and onnxruntime's counterpart, see quantization_accuracy.py)")
    parser.add_argument("--size", type=int, default=224, help="image height and width of the CNNs")
    parser.add_argument("--samples", type=int, default=32, help="calibration inputs")
    parser.add_argument("--eval-samples", type=int, default=16, help="evaluation inputs (not calibration ones)")
    parser.add_argument("--bn-stats", choices=("auto", "keep", "reestimate"), default="auto",
                        help="the CNNs' batch-norm running statistics: as built (keep), recomputed on random images "
                             "(reestimate), or recomputed only when the built model's logits are degenerate (auto)")
    parser.add_argument("--bn-images", type=int, default=16, help="images for --bn-stats reestimate")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    parser.add_argument("--profile-repeat", type=int, default=10,
                        help="profiled runs of each Forge artifact for the time per schedule rule (0: skip)")
    parser.add_argument("--no-preprocess", action="store_true", help="skip onnxruntime's quant_pre_process")
    parser.add_argument("--no-trained", action="store_true",
                        help="skip the accuracy of a MobileNetV2 trained on scikit-learn's digits")
    parser.add_argument("--digits-size", type=int, default=112, help="image size of the digits-trained MobileNetV2")
    parser.add_argument("--digits-epochs", type=int, default=6, help="its training epochs")
    parser.add_argument("--digits-eval", type=int, default=64, help="its held-out evaluation digits")
    parser.add_argument("--target", default="llvm",
                        help='Forge\'s target (default: this CPU); "llvm -mcpu=x86-64-v3" for the AVX2 class, whose '
                             "int8 computes in float")
    parser.add_argument("--json", default=str(HERE / "results" / "int8_speed.json"))
    args = parser.parse_args()
    print(f"Forge target: {args.target}", flush=True)
    names = args.models.split(",")
    unknown = [n for n in names if n not in (*CNNS, "bert6")]
    if unknown:
        parser.error(f"unknown models {unknown}; models: {', '.join((*CNNS, 'bert6'))}")
    if args.rounds < 1 or args.samples < 1 or args.eval_samples < 1:
        parser.error("--rounds, --samples and --eval-samples must be at least 1")

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="forge-int8-speed-") as tmp:
        work = Path(tmp)
        for name in names:
            started = time.perf_counter()
            case = build_case(name, args, work)
            result = Result(name, bn_statistics=case.bn_statistics)
            result.seconds["export"] = time.perf_counter() - started
            run_case(case, args, work, result)
            if name == "mobilenetv2" and not args.no_trained:
                result.trained = trained_accuracy(args, work)
            result.seconds["total"] = time.perf_counter() - started
            results.append(result)
            print_table([result])
    if len(results) > 1:
        print_table(results)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    targets = {"forge_int8_over_fp32_max": {r.model: r.speedup_target for r in results},
               "forge_int8_over_ort_int8_below": TARGET_VS_ORT, "cnn_sqnr_db_min": TARGET_SQNR_DB}
    out.write_text(json.dumps({"settings": settings, "targets": targets,
                               "versions": {"onnxruntime": ort.__version__, "torch": torch.__version__,
                                            "forge": getattr(forge, "__version__", None)},
                               "results": [vars(r) for r in results]}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    sys.exit(main())
