"""Accuracy of Forge's static int8 quantization against onnxruntime's, per calibration method.

    .venv/bin/python benchmarks/quantization_accuracy.py [--models resnet50,mobilenetv2] [--size 224]
    .venv/bin/python benchmarks/quantization_accuracy.py --models mobilenetv2 --size 160 --methods minmax,entropy

Models, batch 1, random weights but one trained here (no downloads), exported by torch's TorchScript
exporter at opset 17 (eval mode: batch norms folded into the convolutions):
* resnet50: transformers' ``ResNetForImageClassification(ResNetConfig())`` (ResNet-50);
* mobilenetv2: MobileNetV2 built in torch (benchmarks/models.py), batch-norm statistics randomized;
* mobilenetv2-digits: the same MobileNetV2 with 10 classes, trained from scratch
  on scikit-learn's digits (``train_mobilenetv2_on_digits``: ``--digits-size``
  112, ``--digits-epochs`` 6, about 2 minutes); ``--samples`` training digits
  calibrate, ``--digits-eval`` held-out digits evaluate, and each engine's
  top-1 on them is printed too. Random-weight MobileNetV2s amplify any early
  perturbation by some 30 dB, so their int8 SQNR (about 11 dB with every
  method, in both engines) says little about the quantizer; this one's does.

The other models' inputs are smooth random images (low-resolution Gaussian noise upsampled
bilinearly, plus a little pixel noise, standardized to mean 0 and std 1 per
image, like ImageNet-normalized photos): ``--samples`` for calibration and
``--eval-samples`` others for evaluation. The float reference is onnxruntime on
the exported model; each quantized model's output SQNR over all evaluation
samples is ``10 log10(sum(ref^2) / sum((q - ref)^2))`` dB.

* Forge: ``calibrate`` once per model, then for each method and per_channel
  setting ``copy().quantize(activation_dtype="int8", calib_method=...,
  quant_type="static", per_channel=...)``, compiled (``--forge-eval compiled``,
  the default: ``compile()`` and ``forge.Runtime``) or run through
  ``get_inference_function()`` (``--forge-eval function``).
* onnxruntime: ``quant_pre_process`` (skip with ``--no-preprocess``), then
  ``quantize_static`` in QDQ format, QInt8 activations and weights, the same
  calibration arrays and the same per_channel setting.

Methods (Forge name <-> onnxruntime): minmax <-> MinMax; average <-> MinMax
with CalibMovingAverage (the mean of the per-sample extrema when every sample
is collected at once, as here); entropy <-> Entropy; percentile <-> Percentile
with CalibPercentile 99 (Forge's default ``percentile=99``); percentile99.99
<-> the same at 99.99; mse (Forge's addition, the range of least squared
error) <-> MinMax, onnxruntime's default (it has no such calibrator). Prints a
table and writes
benchmarks/results/quantization_accuracy.json (``--json``).

What differs beyond the ranges:
* onnxruntime's Entropy, at the defaults ``quantize_static`` cannot change
  (128 histogram bins over [-max, max], 128 quantized bins), has a single
  candidate threshold, the whole range: it equals MinMax. Forge searches 2048
  bins of ``|x|`` (TensorRT's KL search), so the entropy rows compare a real
  threshold search with min-max.
* onnxruntime also puts Q/DQ on operator outputs, the logits included (Gemm ->
  QuantizeLinear -> DequantizeLinear); Forge quantizes the inputs of
  convolutions, dense layers and the adds between them, and leaves the final
  output float. Methods that clip (average, percentile) clip the logits too in
  onnxruntime.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quant_pre_process, quantize_static)

import forge

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import MobileNetV2, randomized  # noqa: E402

ORT_MAX_IR_VERSION = 13  # onnxruntime 1.31 refuses newer models


def build_resnet50() -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    return ResNetForImageClassification(ResNetConfig()).eval()  # the defaults are ResNet-50


def build_mobilenetv2() -> torch.nn.Module:
    torch.manual_seed(0)
    return randomized(MobileNetV2(), seed=0)


MODELS = {"resnet50": build_resnet50, "mobilenetv2": build_mobilenetv2}


@dataclass
class Digits:
    """A model trained on scikit-learn's digits, with held-out calibration and evaluation images."""

    model: torch.nn.Module
    size: int
    calib: list[np.ndarray]
    evaluation: list[np.ndarray]
    labels: np.ndarray  # the evaluation images' digits
    train_s: float
    test_top1: float  # torch fp32, every held-out image
    held_out: int  # how many images test_top1 is over


DIGITS_TRAIN = 1500  # of the 1797 images, after a seeded shuffle; the other 297 are held out


def digit_images(images: np.ndarray, size: int) -> torch.Tensor:
    """8x8 digits (values 0..16) upsampled bilinearly to ``size`` x ``size``, 3 equal channels, about mean 0, std 1."""
    x = torch.from_numpy(images.astype(np.float32) / 16.0)[:, None].repeat(1, 3, 1, 1)
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return (x - 0.3) / 0.4


def train_mobilenetv2_on_digits(size: int = 112, epochs: int = 6, calib: int = 32, evaluation: int = 64,
                                seed: int = 0) -> Digits:
    """MobileNetV2 (10 classes) trained from scratch on scikit-learn's digits at ``size`` x ``size``.

    A trained model for the accuracy checks, without downloading weights:
    random-weight MobileNetV2s amplify any perturbation of an early layer by
    some 30 dB (Gaussian noise 60 dB below the first convolution's output
    leaves an output SQNR of 24 dB), so no int8 scheme holds 25 dB on them;
    training removes most of that. AdamW (lr 2e-3, one cycle, weight decay
    1e-4), batches of 32, ``epochs`` passes over 1500 images (about 20 s an
    epoch at 112x112 on 2 cores; top-1 about 98% on the 297 held out).
    Calibration images are training images; evaluation images are held out.
    """
    from sklearn.datasets import load_digits

    started = time.perf_counter()
    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.target))
    train, test = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    torch.manual_seed(seed)
    model = MobileNetV2(classes=10)
    batch = 32
    steps = epochs * (len(train) // batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 2e-3, total_steps=steps)
    model.train()
    for _ in range(epochs):
        shuffled = rng.permutation(train)
        for b in range(len(train) // batch):
            chosen = shuffled[b * batch:(b + 1) * batch]
            loss = torch.nn.functional.cross_entropy(model(digit_images(digits.images[chosen], size)),
                                                     torch.from_numpy(digits.target[chosen]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        predicted = model(digit_images(digits.images[test], size)).argmax(1).numpy()
    accuracy = float((predicted == digits.target[test]).mean())

    def arrays(indices: np.ndarray) -> list[np.ndarray]:
        return [np.ascontiguousarray(image[None].numpy()) for image in digit_images(digits.images[indices], size)]

    return Digits(model, size, arrays(train[:calib]), arrays(test[:evaluation]), digits.target[test[:evaluation]],
                  time.perf_counter() - started, accuracy, len(test))


def noise_sensitivity(model: torch.nn.Module, images: list[np.ndarray], seed: int = 5) -> dict[str, float]:
    """How much the float model amplifies noise: output SQNR (dB) with Gaussian noise added to convolution outputs.

    Noise of a given power relative to each convolution output's own (-60 dB
    on the first convolution only; -40 dB on every one, about 8-bit rounding
    everywhere), through torch forward hooks; the SQNR is against the same
    model without noise. A model that turns -40 dB everywhere into much less
    than 25 dB at its output cannot hold 25 dB in int8, whatever the quantizer.
    """
    convolutions = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    batch = torch.from_numpy(np.concatenate(images))

    def logits() -> np.ndarray:
        with torch.no_grad():
            out = model(batch)
        return (out.logits if hasattr(out, "logits") else out).numpy()

    def noisy(modules: list[torch.nn.Module], db: float) -> float:
        generator = torch.Generator().manual_seed(seed)

        def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            noise = torch.randn(output.shape, generator=generator) * (output.std() * 10 ** (db / 20))
            return output + noise

        handles = [m.register_forward_hook(hook) for m in modules]
        try:
            return sqnr_db([reference], [logits()])
        finally:
            for handle in handles:
                handle.remove()

    reference = logits()
    return {"first conv -60 dB": noisy(convolutions[:1], -60.0), "every conv -40 dB": noisy(convolutions, -40.0)}


TRAINED = "mobilenetv2-digits"
SUBJECTS = (*MODELS, TRAINED)


def top1(outputs: list[np.ndarray], labels: np.ndarray) -> float:
    """The share of ``outputs`` whose largest logit is the label's."""
    return float(np.mean([int(np.argmax(o)) == int(label) for o, label in zip(outputs, labels)]))


def torch_logits(model: torch.nn.Module, images: list[np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        outputs = [model(torch.from_numpy(image)) for image in images]
    return [(o.logits if hasattr(o, "logits") else o).numpy() for o in outputs]


def reestimate_batch_norms(model: torch.nn.Module, images: list[np.ndarray]) -> torch.nn.Module:
    """Batch-norm running statistics recomputed over ``images`` (one batch, train mode), as training would leave them.

    Random convolution weights shrink (or grow) activations layer after layer;
    with the initial statistics (mean 0, variance 1) the batch norms do not
    correct it, and a deep model's logits can end up the same for every input.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average: this batch's statistics exactly
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(np.concatenate(images)))
    return model.eval()


@dataclass(frozen=True)
class Method:
    forge_method: str
    forge_percentile: float
    ort_method: str  # a CalibrationMethod member's name
    ort_extra: dict


METHODS = {
    "minmax": Method("minmax", 99.0, "MinMax", {}),
    "average": Method("average", 99.0, "MinMax", {"CalibMovingAverage": True}),
    "entropy": Method("entropy", 99.0, "Entropy", {}),
    "percentile": Method("percentile", 99.0, "Percentile", {"CalibPercentile": 99.0}),
    "percentile99.99": Method("percentile", 99.99, "Percentile", {"CalibPercentile": 99.99}),
    "mse": Method("mse", 99.0, "MinMax", {}),  # onnxruntime has no MSE calibrator: its default
}


@dataclass
class Row:
    model: str
    method: str
    per_channel: bool
    forge_sqnr_db: float | None
    ort_sqnr_db: float | None
    difference_db: float | None  # Forge - onnxruntime
    forge_s: float | None = None
    ort_s: float | None = None
    forge_error: str | None = None
    ort_error: str | None = None
    forge_top1: float | None = None  # the trained model: top-1 on its held-out evaluation digits
    ort_top1: float | None = None


def smooth_images(count: int, size: int, seed: int) -> list[np.ndarray]:
    """Images like normalized photos: upsampled low-resolution noise plus a little pixel noise, mean 0, std 1."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        low = torch.from_numpy(rng.normal(0.0, 1.0, (1, 3, 7, 7)).astype(np.float32))
        image = torch.nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False).numpy()
        image = image + rng.normal(0.0, 0.1, image.shape).astype(np.float32)
        image = (image - image.mean()) / image.std()
        images.append(np.ascontiguousarray(image, dtype=np.float32))
    return images


def sqnr_db(reference: list[np.ndarray], quantized: list[np.ndarray]) -> float:
    ref = np.concatenate([r.astype(np.float64).ravel() for r in reference])
    got = np.concatenate([q.astype(np.float64).ravel() for q in quantized])
    noise = float(np.sum((got - ref) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))


def export(model: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, input_names: list[str],
           output_names: list[str]) -> None:
    """``model`` run on the example ``args``, written to ``path`` as ONNX that onnxruntime loads.

    torch's TorchScript exporter at opset 17 (the shapes of ``args`` fixed),
    its warnings silenced; the IR version is lowered to ``ORT_MAX_IR_VERSION``
    when newer. Shared with int8_speed.py.
    """
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17, input_names=input_names,
                          output_names=output_names)
    proto = onnx.load(str(path))
    if proto.ir_version > ORT_MAX_IR_VERSION:
        proto.ir_version = ORT_MAX_IR_VERSION
        onnx.save(proto, str(path))


def ort_session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_run(path: Path, images: list[np.ndarray], threads: int) -> list[np.ndarray]:
    session = ort_session(path, threads)
    name = session.get_inputs()[0].name
    return [session.run(None, {name: image})[0] for image in images]


def logits_check(outputs: list[np.ndarray]) -> dict:
    """Whether the float model's logits carry information: spread across classes and across samples."""
    stacked = np.stack([o.reshape(-1) for o in outputs]).astype(np.float64)
    across_classes = float(stacked.std(axis=1).mean())
    across_samples = float(stacked.std(axis=0).mean())
    scale = float(np.abs(stacked).mean()) or 1.0
    argmax = len(set(stacked.argmax(axis=1).tolist()))
    problems = []
    if not np.isfinite(stacked).all():
        problems.append("non-finite logits")
    if scale < 1e-6:
        problems.append(f"logits about 0 (mean |logit| {scale:.2g})")
    if across_classes <= 1e-6 * scale:
        problems.append("all classes equal")
    if across_samples <= 1e-3 * max(across_classes, 1e-30):
        problems.append("the same logits for every input")
    return {"std_across_classes": across_classes, "std_across_samples": across_samples, "mean_abs": scale,
            "distinct_argmax": argmax, "samples": len(outputs), "degenerate": problems}


class Reader(CalibrationDataReader):
    """An onnxruntime calibration data reader over a list of arrays."""

    def __init__(self, name: str, images: list[np.ndarray]) -> None:
        self.name, self.images = name, images
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        image = next(self._iter, None)
        return None if image is None else {self.name: image}

    def rewind(self) -> None:
        self._iter = iter(self.images)


def ort_quantized(model_path: Path, out: Path, calib: list[np.ndarray], method: Method, per_channel: bool) -> None:
    reader = Reader("pixel_values", calib)
    with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print their settings
        quantize_static(str(model_path), str(out), reader, quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
                        calibrate_method=getattr(CalibrationMethod, method.ort_method),
                        extra_options=dict(method.ort_extra))


def forge_outputs(module: forge.IRModule, images: list[np.ndarray], how: str, work: Path) -> list[np.ndarray]:
    if how == "function":
        function = module.get_inference_function()
        return [np.asarray(function(image)) for image in images]
    module.compile(output_path=work, force_overwrite=True)
    runtime = forge.Runtime(work)
    return [np.asarray(runtime.infer(image)[0]) for image in images]


def _error() -> str:
    text = traceback.format_exc()
    print(text, file=sys.stderr, flush=True)
    return text


def run_model(name: str, args: argparse.Namespace, work: Path) -> tuple[list[Row], dict]:
    started = time.perf_counter()
    labels = None
    if name == TRAINED:
        digits = train_mobilenetv2_on_digits(args.digits_size, args.digits_epochs, args.samples, args.digits_eval)
        model, calib, evaluation, labels, size = (digits.model, digits.calib, digits.evaluation, digits.labels,
                                                  digits.size)
        as_built = logits_check(torch_logits(model, evaluation))
        info: dict = {"model": name, "fp32_logits_as_built": as_built, "bn_statistics": "trained",
                      "train_s": digits.train_s, "torch_top1_held_out": digits.test_top1}
        print(f"{name}: trained at {size}x{size} in {digits.train_s:.0f} s, fp32 top-1 "
              f"{100 * digits.test_top1:.1f}% on the {digits.held_out} held-out digits", flush=True)
    else:
        size = args.size
        calib = smooth_images(args.samples, size, seed=1)
        evaluation = smooth_images(args.eval_samples, size, seed=2)
        model = MODELS[name]()
        as_built = logits_check(torch_logits(model, evaluation))
        info = {"model": name, "fp32_logits_as_built": as_built}
        _print_check(f"{name} as built (torch)", as_built)
        reestimate = args.bn_stats == "reestimate" or (args.bn_stats == "auto" and bool(as_built["degenerate"]))
        if reestimate:  # on images of their own, neither calibration nor evaluation ones
            reestimate_batch_norms(model, smooth_images(args.bn_images, size, seed=3))
        info["bn_statistics"] = "re-estimated" if reestimate else "as built"
    info["noise_sqnr_db"] = noise_sensitivity(model, evaluation)
    print(f"{name}: float output SQNR with Gaussian noise on convolution outputs: "
          + ", ".join(f"{k}: {v:.1f} dB" for k, v in info["noise_sqnr_db"].items()), flush=True)
    model_path = work / f"{name}.onnx"
    export(model, (torch.zeros(1, 3, size, size),), model_path, ["pixel_values"], ["logits"])
    ort_input = model_path
    if not args.no_preprocess:
        ort_input = work / f"{name}_pre.onnx"
        quant_pre_process(str(model_path), str(ort_input))
    reference = ort_run(model_path, evaluation, args.threads)
    check = logits_check(reference)
    info.update({"onnx_ir_version": onnx.load(str(model_path), load_external_data=False).ir_version,
                 "fp32_logits": check, "export_s": time.perf_counter() - started})
    _print_check(f"{name} evaluated (onnxruntime, batch-norm statistics {info['bn_statistics']})", check)
    if labels is not None:
        info["fp32_top1"] = top1(reference, labels)

    t = time.perf_counter()
    ir = forge.from_onnx(str(model_path))
    fp32 = forge_outputs(ir.copy(), evaluation, args.forge_eval, work / f"{name}_fp32")
    info["forge_fp32_sqnr_db"] = sqnr_db(reference, fp32)
    info["forge_fp32_s"] = time.perf_counter() - t
    print(f"{name}: Forge fp32 vs onnxruntime fp32: {info['forge_fp32_sqnr_db']:.1f} dB "
          f"({info['forge_fp32_s']:.0f} s)", flush=True)
    t = time.perf_counter()
    calibrated = True
    try:
        ir.calibrate(calib, use_cuda=False)
    except Exception:  # noqa: BLE001 - reported, the onnxruntime side still runs
        calibrated, info["forge_calibrate_error"] = False, _error()
    info["forge_calibrate_s"] = time.perf_counter() - t
    print(f"{name}: Forge calibration over {args.samples} samples: {info['forge_calibrate_s']:.0f} s", flush=True)

    rows = []
    for method_name in args.methods:
        method = METHODS[method_name]
        for per_channel in args.per_channel:
            row = Row(name, method_name, per_channel, None, None, None)
            t = time.perf_counter()
            if calibrated:
                try:
                    q = ir.copy()
                    q.quantize(activation_dtype="int8", per_channel=per_channel, calib_method=method.forge_method,
                               quant_type="static", percentile=method.forge_percentile)
                    out = forge_outputs(q, evaluation, args.forge_eval, work / f"{name}_q")
                    row.forge_sqnr_db = sqnr_db(reference, out)
                    if labels is not None:
                        row.forge_top1 = top1(out, labels)
                except Exception:  # noqa: BLE001
                    row.forge_error = _error()
            else:
                row.forge_error = "calibrate() failed"
            row.forge_s = time.perf_counter() - t
            t = time.perf_counter()
            try:
                quantized = work / f"{name}_ort_q.onnx"
                ort_quantized(ort_input, quantized, calib, method, per_channel)
                ort_out = ort_run(quantized, evaluation, args.threads)
                row.ort_sqnr_db = sqnr_db(reference, ort_out)
                if labels is not None:
                    row.ort_top1 = top1(ort_out, labels)
            except Exception:  # noqa: BLE001
                row.ort_error = _error()
            row.ort_s = time.perf_counter() - t
            if row.forge_sqnr_db is not None and row.ort_sqnr_db is not None:
                row.difference_db = row.forge_sqnr_db - row.ort_sqnr_db
            accuracy = "" if labels is None else (
                f"; top-1 fp32 {percent(info['fp32_top1'])}, Forge {percent(row.forge_top1)}, "
                f"onnxruntime {percent(row.ort_top1)}")
            print(f"{name} {method_name} per_channel={per_channel}: Forge {_fmt(row.forge_sqnr_db)} dB "
                  f"({row.forge_s:.0f} s), onnxruntime {_fmt(row.ort_sqnr_db)} dB ({row.ort_s:.0f} s){accuracy}",
                  flush=True)
            rows.append(row)
    info["total_s"] = time.perf_counter() - started
    return rows, info


def _print_check(label: str, check: dict) -> None:
    print(f"{label}: fp32 logits std across classes {check['std_across_classes']:.3g}, across samples "
          f"{check['std_across_samples']:.3g}, mean |logit| {check['mean_abs']:.3g}, {check['distinct_argmax']} "
          f"distinct argmax over {check['samples']} inputs"
          + (f"; DEGENERATE: {', '.join(check['degenerate'])}" if check["degenerate"] else ""), flush=True)


def percent(value: float | None) -> str:
    """A share as a percentage with one decimal; "error" when it was not measured."""
    return "error" if value is None else f"{100 * value:.1f}%"


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "error"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(SUBJECTS), help=f"a subset of {', '.join(SUBJECTS)}")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"a subset of {', '.join(METHODS)}")
    parser.add_argument("--per-channel", default="false,true", help="false, true or false,true")
    parser.add_argument("--size", type=int, default=224, help="image height and width")
    parser.add_argument("--samples", type=int, default=32, help="calibration samples")
    parser.add_argument("--eval-samples", type=int, default=16, help="evaluation samples (not calibration ones)")
    parser.add_argument("--forge-eval", choices=("compiled", "function"), default="compiled",
                        help="run Forge's quantized model compiled (Runtime) or via get_inference_function()")
    parser.add_argument("--bn-stats", choices=("auto", "keep", "reestimate"), default="auto",
                        help="batch-norm running statistics: as built (keep), recomputed on random images "
                             "(reestimate), or recomputed only when the built model's logits are degenerate (auto)")
    parser.add_argument("--bn-images", type=int, default=16, help="images for --bn-stats reestimate")
    parser.add_argument("--digits-size", type=int, default=112, help=f"image size of {TRAINED}")
    parser.add_argument("--digits-epochs", type=int, default=6, help=f"training epochs of {TRAINED}")
    parser.add_argument("--digits-eval", type=int, default=64, help=f"held-out evaluation digits of {TRAINED}")
    parser.add_argument("--no-preprocess", action="store_true", help="skip onnxruntime's quant_pre_process")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime threads for evaluation")
    parser.add_argument("--json", default=str(HERE / "results" / "quantization_accuracy.json"))
    args = parser.parse_args()
    args.models = args.models.split(",")
    args.methods = args.methods.split(",")
    unknown = [m for m in args.models if m not in SUBJECTS] + [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown models or methods {unknown}; models: {', '.join(SUBJECTS)}; "
                     f"methods: {', '.join(METHODS)}")
    try:
        args.per_channel = [{"false": False, "true": True}[v.strip().lower()] for v in args.per_channel.split(",")]
    except KeyError:
        parser.error("--per-channel takes false, true or false,true")

    rows: list[Row] = []
    infos = []
    with tempfile.TemporaryDirectory(prefix="forge-quant-accuracy-") as tmp:
        for name in args.models:
            model_rows, info = run_model(name, args, Path(tmp))
            rows += model_rows
            infos.append(info)

    from rich.console import Console
    from rich.table import Table

    table = Table("model", "method", "per_channel", "Forge SQNR dB", "onnxruntime SQNR dB", "difference dB",
                  "top-1 Forge / onnxruntime")
    for r in rows:
        table.add_row(r.model, r.method, str(r.per_channel), _fmt(r.forge_sqnr_db), _fmt(r.ort_sqnr_db),
                      _fmt(r.difference_db, signed=True),
                      "" if r.forge_top1 is None and r.ort_top1 is None
                      else f"{percent(r.forge_top1)} / {percent(r.ort_top1)}")
    Console(width=140).print(table)
    for info in infos:
        degenerate = info["fp32_logits"]["degenerate"]
        built = info["fp32_logits_as_built"]["degenerate"]
        print(f"{info['model']}: Forge fp32 vs onnxruntime fp32 {info['forge_fp32_sqnr_db']:.1f} dB; fp32 logits as "
              f"built: " + (f"DEGENERATE ({', '.join(built)})" if built else "not degenerate")
              + f"; batch-norm statistics {info['bn_statistics']}; evaluated fp32 logits "
              + (f"DEGENERATE ({', '.join(degenerate)})" if degenerate else "not degenerate")
              + "; noise on convolution outputs: "
              + ", ".join(f"{k} -> {v:.1f} dB" for k, v in info["noise_sqnr_db"].items())
              + f"; {info['total_s']:.0f} s in all")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    out.write_text(json.dumps({"settings": settings, "versions": {"onnxruntime": ort.__version__,
                                                                  "torch": torch.__version__},
                               "models": infos, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    sys.exit(main())
