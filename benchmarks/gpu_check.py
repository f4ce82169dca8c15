"""Forge's CUDA artifacts on a real GPU, against onnxruntime's numbers and beside torch, in one run.

Here (with Forge, nvcc and no GPU)::

    .venv/bin/python benchmarks/gpu_check.py build --out build/gpu_bundle [--arch sm_90]

compiles the models below for ``cuda -arch=ARCH`` (each library carries its
kernels as a fatbin that nvcc built during ``compile()``), computes
onnxruntime-CPU references on random inputs, and writes a bundle under 64 MiB:
the artifacts, inputs and references, Forge's runtime (``forge_core``), TVM's
Python package without its compiler library (the runtime library, 3 MB, and
the CUDA sidecar), and wheels of ``apache-tvm-ffi`` and ``cryptography`` for
Python 3.12.

On the GPU machine (Python 3.12, torch with CUDA, no TVM, no network)::

    python build/gpu_bundle/gpu_check.py run build/gpu_bundle

installs the wheels into the bundle, runs every artifact with Forge's runtime
on TVM's runtime library alone (``TVM_USE_RUNTIME_LIB=1``), compares with the
references, and times Forge, torch eager and torch.compile, numpy in and out,
batch 1. Loading needs the driver alone: ``run`` registers TVM's compile
callback (``tvm_callback_cuda_compile``, through which TVM compiled CUDA
source at load) as a function that fails, so a library that still held
source would fail to load. ``load s`` is the time to open the artifact and run
it once. Prints a table and writes ``gpu_check.json`` into the bundle.

A model's name may end in ``@N`` for batch N (``--models mobilenetv2@8,bert2@8``); ``_fp16`` compiles with
``set_float16``; ``_base`` with TVM's dlight GPU rules alone (without Forge's ``SizedMatmul`` and
``ShortReduction``), for comparison. :data:`TARGETS` is the issue's target table: ResNet-50, MobileNetV2, a
BERT-6 encoder (MiniLM's size) and the DBNet-style detector, at batch 1 and 8, fp32 and fp16; their weights are
random with one bit of randomness each (:func:`_compact`) and their images on 32 levels, so that the bundle,
packed into one ``payload.tar.xz``, stays within the device tool's 64 MiB.

``run --profile N`` adds each model's N slowest kernels; ``--budget S`` starts no torch.compile run after S
seconds (Forge and torch eager are timed first, for every model).

Models (``benchmarks/models.py``, random weights): MobileNetV2 (224x224) in
fp32 and with ``set_float16``, a 2-layer BERT-style encoder (hidden 256,
vocabulary 1024, sequence 128), a DBNet-style detector (320x320), and the
conv1d+LSTM voice-activity model, encrypted, and the same model compiled for
``cuda`` naming no arch (``vad_anyarch``: machine code for sm_75 and its PTX,
which the driver compiles for a newer GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSWORD = "gpu-check-password-2026"
MODELS = ["mobilenetv2", "mobilenetv2_fp16", "bert2", "dbnet", "vad_encrypted", "vad_anyarch"]
# The target table: each model at batch 1 and 8, in fp32 and with set_float16
TARGETS = [f"{model}{precision}{batch}" for model in ("mobilenetv2", "resnet50", "bert6", "dbnet")
           for precision in ("", "_fp16") for batch in ("", "@8")]


def _compact(model):
    """Each weight tensor as its spread with a random sign: random weights with their mean and spread, whose bytes
    compress to a bit a weight (the bundle holds ResNet-50 and BERT-6 in fp32 and fp16 within 64 MiB)."""
    import torch

    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                signs = torch.randint(0, 2, parameter.shape, generator=generator).float() * 2 - 1
                parameter.copy_(signs * parameter.std())
    return model


# --- build: here --------------------------------------------------------------------------------------------------

def _image(batch: int, size: int):
    """A normalized random image on 32 levels: in [-2, 2), its bytes compress (the bundle's 64 MiB)."""
    import torch

    generator = torch.Generator().manual_seed(batch * 1000 + size)
    return torch.randint(0, 32, (batch, 3, size, size), generator=generator).float() / 8 - 2


def _torch_model(name: str):
    sys.path.insert(0, str(HERE))
    from models import BertEncoder, DBNet, MobileNetV2, ResNet50, VoiceActivity, randomized

    import torch

    base, _, batch_text = name.partition("@")  # "mobilenetv2_fp16@8": batch 8
    base, batch = base.split("_")[0], int(batch_text or 1)
    if base == "mobilenetv2":
        return _compact(randomized(MobileNetV2(), seed=1)), _image(batch, 224), "image"
    if base == "resnet50":
        return _compact(randomized(ResNet50(), seed=1)), _image(batch, 224), "image"
    if base == "bert6":  # MiniLM's size (6 layers, hidden 384, 12 heads), a vocabulary of 1024
        model = _compact(randomized(BertEncoder(vocab=1024), seed=2))
        return model, torch.randint(0, 1024, (batch, 128), generator=torch.Generator().manual_seed(0)), "input_ids"
    if base == "bert2":
        model = randomized(BertEncoder(layers=2, hidden=256, heads=4, vocab=1024), seed=2)
        return model, torch.randint(0, 1024, (batch, 128), generator=torch.Generator().manual_seed(0)), "input_ids"
    if base == "dbnet":
        return _compact(randomized(DBNet(), seed=3)), _image(batch, 320) / 4 + 0.5, "image"
    if base == "vad":
        return randomized(VoiceActivity(), seed=4), torch.randn(1, 8, 576) * 0.1, "audio"
    if base == "vadencoder":  # the voice-activity model's convolutions alone
        vad = randomized(VoiceActivity(), seed=4)

        class Encoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.stft, self.encoder = vad.stft, vad.encoder

            def forward(self, audio):
                spectrum = self.stft(audio.reshape(8, 1, 576))
                real, imag = spectrum[:, :129], spectrum[:, 129:]
                return self.encoder(torch.sqrt(real * real + imag * imag)).mean(dim=2)

        return Encoder().eval(), torch.randn(1, 8, 576) * 0.1, "audio"
    if base == "lstm":  # its LSTM alone
        torch.manual_seed(5)
        return torch.nn.LSTM(128, 128, batch_first=True).eval(), torch.randn(1, 8, 128), "features"
    raise SystemExit(f"unknown model {name!r}")


def _runtime_packages(out: Path) -> None:
    import tvm

    tvm_dir = Path(tvm.__file__).parent
    skip_dirs = {"3rdparty", "src", "include", "__pycache__"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if any(part in skip_dirs for part in parts) or info.name.endswith("libtvm_compiler.so"):
            return None
        return info

    with tarfile.open(out / "tvm_runtime.tar.gz", "w:gz") as tar:
        tar.add(tvm_dir, arcname="tvm", filter=keep)
    forge_core = HERE.parent / "forge_core"
    with tarfile.open(out / "forge_core.tar.gz", "w:gz") as tar:
        tar.add(forge_core, arcname="forge_core", filter=lambda i: None if "__pycache__" in i.name else i)
    wheels = out / "wheels"
    wheels.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                    "apache-tvm-ffi==0.1.14.post1", "cryptography", "cffi", "typing_extensions", "-d", str(wheels)], check=True,
                   capture_output=True)


@contextlib.contextmanager
def _tvm_rules_only(active: bool):
    """Forge's GPU rules without its own (TVM's dlight rules alone) while active."""
    from forge_core.schedules import gpu

    rules = gpu.gpu_rules
    if active:
        from tvm.s_tir import dlight

        gpu.gpu_rules = lambda: [gpu.Declining(dlight.gpu.Matmul()) if isinstance(rule.rule, gpu.SizedMatmul) else rule
                                 for rule in rules() if not isinstance(rule.rule, gpu.ShortReduction)]
    try:
        yield
    finally:
        gpu.gpu_rules = rules


def _pack(out: Path) -> None:
    """Everything but this script into one ``payload.tar.xz``, artifacts of one model side by side so that
    LZMA's window (512 MiB) finds a batch-8 library's weights in its batch-1 twin's."""
    members = sorted(p for p in out.iterdir() if p.name != "gpu_check.py")
    subprocess.run(["tar", "-C", str(out), "-cf", str(out / "payload.tar"), *[p.name for p in members]], check=True)
    subprocess.run(["xz", "-T1", "-6", "--lzma2=preset=6,dict=512MiB", str(out / "payload.tar")], check=True)
    for member in members:
        shutil.rmtree(member) if member.is_dir() else member.unlink()


def _build_one(name: str, out: Path, work: Path, arch: str) -> dict:
    """One model compiled into ``out / name``, its input and onnxruntime's outputs beside it; its manifest entry."""
    import warnings

    import numpy as np
    import onnxruntime as ort
    import torch

    import forge
    from forge_core.compiler.cuda_code import cuda_modules, library_blob

    model, example, input_name = _torch_model(name)
    onnx_path = work / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(onnx_path), input_names=[input_name], opset_version=17,
                          dynamo=False)
    x = example.numpy()
    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {input_name: x})
    ir = forge.from_onnx(onnx_path)
    started = time.perf_counter()
    kwargs = {"set_float16": True} if "fp16" in name else {}
    plain = out / name
    target = "cuda" if "anyarch" in name else f"cuda -arch={arch}"
    with _tvm_rules_only("_base" in name):  # "_base": TVM's dlight rules alone, for comparison
        ir.compile(target=target, output_path=plain, **kwargs)
    modules = cuda_modules(library_blob((plain / "model_library.so").read_bytes()))
    if not modules or any(fmt != "fatbin" for fmt, _ in modules):
        raise RuntimeError(f"{name}: the library holds {[fmt for fmt, _ in modules]}, not fatbins")
    if "encrypted" in name:  # the run opens the encrypted one
        shutil.rmtree(plain)
        ir.compile(target=target, output_path=plain, encrypt_password=PASSWORD)
    compile_s = time.perf_counter() - started
    np.savez(out / f"{name}_data.npz", *want, x=x)
    print(f"built {name} in {compile_s:.1f} s", flush=True)
    return {"name": name, "input": input_name, "outputs": len(want), "encrypted": "encrypted" in name,
            "compile_s": round(compile_s, 1), "fp16": "fp16" in name}


def build(out: Path, arch: str, models: list[str]) -> None:
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), "(the machine that builds the bundle)", flush=True)
    if out.exists():
        shutil.rmtree(out)
    work = out / "work"
    work.mkdir(parents=True)
    manifest = {"arch": arch, "models": []}
    for name in models:
        try:
            manifest["models"].append(_build_one(name, out, work, arch))
        except Exception as error:  # noqa: BLE001 - one model's failure is reported, the others still build
            manifest.setdefault("failed", {})[name] = f"{type(error).__name__}: {str(error)[-400:]}"
            print(f"FAILED {name}: {type(error).__name__}: {str(error)[-400:]}", flush=True)
    shutil.rmtree(work)
    _runtime_packages(out)
    shutil.copy(Path(__file__), out / "gpu_check.py")
    shutil.copy(HERE / "models.py", out / "models.py")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    _pack(out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"bundle {out}: {size / 2**20:.1f} MiB")


# --- run: on the GPU machine --------------------------------------------------------------------------------------

def _install(bundle: Path) -> Path:
    payload = bundle / "payload.tar.xz"
    if payload.exists() and not (bundle / "manifest.json").exists():
        subprocess.run(["tar", "-C", str(bundle), "-xJf", str(payload)], check=True)
    site = bundle / "site"
    if not site.exists():
        site.mkdir()
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(site),
                        *map(str, sorted((bundle / "wheels").glob("*.whl")))], check=True, capture_output=True)
        for name in ("tvm_runtime.tar.gz", "forge_core.tar.gz"):
            with tarfile.open(bundle / name) as tar:
                tar.extractall(site)
    return site


def _preload_cudart() -> str:
    """libcudart.so.13 from torch's NVIDIA wheels, loaded globally so that TVM's CUDA sidecar finds it."""
    import ctypes

    try:
        import torch  # noqa: F401 - its CUDA libraries
    except ImportError:
        return "torch is not installed"
    for entry in sys.path:
        for found in sorted(Path(entry).glob("nvidia/**/libcudart.so.13")) if Path(entry).is_dir() else []:
            ctypes.CDLL(str(found), mode=ctypes.RTLD_GLOBAL)
            return str(found)
    return "not found (relying on the system's)"


def _time(fn, repeat: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1e3


def _emit(rows: list[dict], bundle: Path) -> None:
    """The rows so far, into the bundle and into ``$OUT`` when set (the device tool brings that back, even from a
    run cut short)."""
    text = json.dumps(rows, indent=1)
    (bundle / "gpu_check.json").write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)


def _torch_runner(name: str, x, half: bool, torch):
    model, _, _ = _torch_model(name)
    model = model.cuda().eval()
    if half:
        model = model.half()

    def eager(m=model):
        t = torch.from_numpy(x).cuda()
        t = t.half() if half and t.is_floating_point() else t
        with torch.no_grad():
            out = m(t)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.float().cpu().numpy()

    return model, eager


def run(bundle: Path, torch_compile: bool, isolate: bool = False, only: str | None = None,
        profile: int = 0, budget_s: float | None = None) -> int:
    """Every artifact checked and timed (and profiled: its ``profile`` slowest kernels), torch eager beside it;
    then torch.compile, model by model, while ``budget_s`` seconds from the start allow."""
    began = time.perf_counter()
    site = _install(bundle)
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    sys.path.insert(0, str(site))
    sys.path.insert(0, str(bundle))
    cudart = _preload_cudart()
    import numpy as np
    import tvm_ffi

    import tvm  # registers TVM's own compile callback (NVRTC through its compiler library), replaced below

    from forge_core.runtime import Runtime
    from forge_core.runtime.cpu_features import describe_host

    asked: list[int] = []

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code):  # TVM calls it for a library that holds CUDA source: none should
        asked.append(len(code))
        raise RuntimeError("the library holds CUDA source, not machine code: TVM asked to compile it at load")

    manifest = json.loads((bundle / "manifest.json").read_text())
    rows, failures = [], 0
    try:
        import torch
        gpu = (f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; TF32 in torch's fp32 convolutions "
               f"(cuDNN): {torch.backends.cudnn.allow_tf32}, matmuls: {torch.backends.cuda.matmul.allow_tf32}")
    except Exception as error:  # a dry run without torch or a GPU
        torch, gpu = None, f"no torch GPU ({type(error).__name__})"
    print(describe_host(), "(the GPU machine's host)", flush=True)
    print(f"GPU: {gpu}; TVM runtime only: "
          f"{getattr(tvm.base, '_RUNTIME_ONLY', '?')}; cudart: {cudart}", flush=True)
    inputs = {}
    for entry in manifest["models"]:
        name = entry["name"]
        if only is not None and name != only:
            continue
        if isolate:  # each model in a process of its own: a GPU fault aborts the process
            child = subprocess.run([sys.executable, __file__, "run", str(bundle), "--only", name,
                                    "--profile", str(profile), *([] if torch_compile else ["--no-torch-compile"])],
                                   capture_output=True, text=True)
            lines = [line for line in child.stdout.splitlines() if line.startswith('{"model"')]
            row = json.loads(lines[-1]) if lines else {
                "model": name, "error": f"exit {child.returncode}: {(child.stderr or child.stdout)[-600:]}"}
            failures += "error" in row or not row.get("ok")
            rows.append(row)
            print(json.dumps(row), flush=True)
            _emit(rows, bundle)
            continue
        row = {"model": name}
        try:
            data = np.load(bundle / f"{name}_data.npz")
            x = data["x"]
            inputs[name] = x
            want = [data[f"arr_{i}"] for i in range(entry["outputs"])]
            directory = bundle / name
            started = time.perf_counter()
            key = directory / "modelKey.bin" if entry["encrypted"] else None
            runtime = Runtime(directory, key, PASSWORD if key else None)
            got = runtime.infer(x)
            row["load_s"] = round(time.perf_counter() - started, 3)
            errors = [float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-12)) for g, w in zip(got, want)]
            row["rel_err"] = max(errors)
            limit = 2e-2 if entry["fp16"] else 1e-4
            row["ok"] = bool(np.isfinite(row["rel_err"]) and row["rel_err"] <= limit)
            failures += not row["ok"]
            row["forge_ms"] = round(_time(lambda: runtime.infer(x)), 3)
            if profile:
                calls = runtime.profile(x, repeat=10)
                row["profile"] = [[c.name, c.calls, round(c.total_ms, 4)] for c in calls[:profile]]
                row["profile_total_ms"] = round(sum(c.total_ms for c in calls), 3)
            del runtime
            if torch is not None:
                _, eager = _torch_runner(name, x, entry["fp16"], torch)
                row["torch_eager_ms"] = round(_time(eager), 3)
        except Exception as error:  # one model's failure is reported, the others still run
            row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
            failures += 1
        rows.append(row)
        print(json.dumps(row), flush=True)
        _emit(rows, bundle)
    if torch is not None and torch_compile and not isolate:
        for row in rows:
            name = row["model"]
            if name not in inputs or "_base" in name:
                continue
            if budget_s is not None and time.perf_counter() - began > budget_s:
                row["torch_compile_error"] = "not timed: the run's time budget was spent"
                continue
            entry = next(e for e in manifest["models"] if e["name"] == name)
            try:
                model, run_model = _torch_runner(name, inputs[name], entry["fp16"], torch)
                compiled = torch.compile(model)
                row["torch_compile_ms"] = round(_time(lambda: run_model(compiled)), 3)
            except Exception as error:  # torch.compile's own failure is not Forge's
                row["torch_compile_error"] = f"{type(error).__name__}: {str(error)[:200]}"
            print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
            _emit(rows, bundle)
    print(f"\n| model | load s | rel err | Forge ms | torch eager ms | torch.compile ms | Forge/eager | Forge/compile |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        f, e, c = r.get("forge_ms"), r.get("torch_eager_ms"), r.get("torch_compile_ms")
        print(f"| {r['model']} | {r.get('load_s', '-')} | {r.get('rel_err', r.get('error', '-'))} | {f or '-'} | "
              f"{e or '-'} | {c or '-'} | {round(f / e, 2) if f and e else '-'} | "
              f"{round(f / c, 2) if f and c else '-'} |")
    for r in rows:
        if r.get("profile"):
            print(f"\n{r['model']}: kernels, ms per run (total {r['profile_total_ms']} ms)")
            for kernel, calls, ms in r["profile"]:
                print(f"  {ms:8.4f}  x{calls}  {kernel}")
    print(f"compiles asked at load: {len(asked)}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=Path("build/gpu_bundle"))
    b.add_argument("--arch", default="sm_90")
    b.add_argument("--models", default=",".join(MODELS))
    r = sub.add_parser("run")
    r.add_argument("bundle", type=Path)
    r.add_argument("--no-torch-compile", action="store_true")
    r.add_argument("--isolate", action="store_true", help="each model in a process of its own")
    r.add_argument("--only", help="one model of the bundle")
    r.add_argument("--profile", type=int, default=0, metavar="N", help="each model's N slowest kernels")
    r.add_argument("--budget", type=float, help="seconds for the whole run: torch.compile stops when spent")
    args = parser.parse_args()
    if args.command == "build":
        build(args.out.resolve(), args.arch, args.models.split(","))
        return 0
    return run(args.bundle.resolve(), not args.no_torch_compile, args.isolate, args.only, args.profile, args.budget)


if __name__ == "__main__":
    sys.exit(main())
