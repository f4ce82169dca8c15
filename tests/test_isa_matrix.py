"""Every x86 and Arm class gets only the instructions it has, whatever CPU compiles (issue 32).

* For each class (AVX2, AVX-VNNI, AVX-512 VNNI), MobileNetV2, a BERT encoder, an int8 model quantized by
  Forge (static, per channel) and one quantized by onnxruntime (QDQ) are compiled (the int8 one also for a
  second CPU of the AVX2 and AVX-512 classes), and the library's disassembly (``objdump -d``)
  is checked against the class: no AVX-512 (zmm, opmasks, EVEX-only registers) and no ``vpdpbusd``
  for AVX2 classes (their int8 models: ``vpmaddwd`` on ymm, never the saturating ``vpmaddubsw``),
  ``vpdpbusd`` on ymm only for Alder Lake (AVX-VNNI), ``vpdpbusd`` on zmm for the
  AVX-512 VNNI classes; ``sdot`` for Raspberry Pi 5 and none for Raspberry Pi 4. These compile only,
  so every class is covered on every host; their numbers are checked where the host runs them, by
  the other suites.
* A model with a tuned record, for each class this CPU can measure candidates on.
* An artifact for a CPU with extensions this one lacks is refused by the runtime, in a fresh process,
  with an error naming them (exit code 1, never SIGILL); tuning for such a class is refused too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from cpu_features import FLAGS, MODEL, can_run
from model_factory import export_torch, onnxruntime_quantized
from torch import nn

import forge
from forge_core.runtime import metadata as schema
from forge_core.runtime.library_file import seal
from forge_core.targets.parsing import resolve_target

X86 = {  # CPU -> (vector registers allowed, vpdpbusd on)
    "x86-64-v3": ("ymm", None),  # the AVX2 class: Haswell, Zen 1-3 and later
    "alderlake": ("ymm", "ymm"),  # AVX2 + AVX-VNNI
    "znver4": ("zmm", "zmm"),  # AVX-512 with VNNI
    "znver3": ("ymm", None),  # a second CPU of each class: AMD's (SSE4A), Intel's
    "cascadelake": ("zmm", "zmm"),
}
CLASSES = ["x86-64-v3", "alderlake", "znver4"]  # one CPU per class takes every model, the second the int8 one
MODELS = ["mobilenetv2", "bert", "mobilenetv2-int8", "bert-qdq"]
MATRIX = [(cpu, model) for cpu in CLASSES for model in MODELS] + [
    (cpu, "mobilenetv2-int8") for cpu in X86 if cpu not in CLASSES]
ARM = {"raspberry-pi/4": False, "raspberry-pi/5": True}  # tag -> sdot

# Instructions only AVX-512 encodes (EVEX): its registers, opmasks, broadcasts and opcodes without a VEX form.
AVX512_ONLY = re.compile(r"%zmm|%[xy]mm(1[6-9]|2\d|3[01])\b|%k[1-7]\b|\{1to\d+\}|\bv(pternlog|permt2|permi2|pmov[su]?"
                         r"[dqw][bdw]|pcompress|pexpand|rndscale|scalef|fixupimm|getexp|getmant|range|reduce|pmullq|"
                         r"pabsq|pmaxsq|pminsq|cvtt?ps2uqq|cvtu?qq2ps|pbroadcastm|dbpsadbw)")


def _class_target(name: str) -> str:
    return f"llvm -mcpu={name} -num-cores=2"


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    """MobileNetV2's layers (Sandler et al. 2018) at width 0.5, 10 classes, with random weights and statistics."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU6()]
        cin = 16
        for expand, cout, repeats, stride in [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 3, 2), (6, 32, 4, 2),
                                              (6, 48, 3, 1), (6, 80, 3, 2), (6, 160, 1, 1)]:
            for index in range(repeats):
                layers.append(_InvertedResidual(cin, cout, stride if index == 0 else 1, expand))
                cin = cout
        layers += [nn.Conv2d(cin, 640, 1), nn.BatchNorm2d(640), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(640, 10)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(image).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The four models, as ONNX paths: fp32 MobileNetV2 and BERT, and the two int8 ones."""
    from hf_models import ARCHITECTURES

    folder = tmp_path_factory.mktemp("isa_models")
    torch.manual_seed(32)
    mobilenet = export_torch(MobileNetV2().eval(), (torch.randn(1, 3, 32, 32),), ["x"])
    arch = ARCHITECTURES["bert"]
    names = list(arch.input_names)
    bert = export_torch(arch.build(seed=32), arch.inputs(batch=1, length=16, seed=0), names)
    rng = np.random.default_rng(32)
    images = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(3)]
    paths = {"mobilenetv2": folder / "mobilenetv2.onnx", "bert": folder / "bert.onnx"}
    import onnx

    onnx.save(mobilenet, paths["mobilenetv2"])
    onnx.save(bert, paths["bert"])
    (folder / "qdq").mkdir()
    feeds = [{n: t.numpy() for n, t in zip(names, arch.inputs(batch=1, length=16, seed=s))} for s in range(3)]
    paths["bert-qdq"] = Path(onnxruntime_quantized(bert, feeds, folder / "qdq", "QUInt8", per_channel=True))
    quantized = forge.from_onnx(str(paths["mobilenetv2"]))
    quantized.calibrate(images)
    quantized.quantize(per_channel=True, calib_method="minmax")
    return {**{name: (lambda p=p: forge.from_onnx(str(p))) for name, p in paths.items()},
            "mobilenetv2-int8": lambda: quantized}


def _disassembly(artifact: Path, objdump: str = "objdump") -> str:
    tool = shutil.which(objdump)
    assert tool, f"{objdump} is missing: binutils (x86) or binutils-aarch64-linux-gnu (Arm) disassemble artifacts"
    library = artifact / schema.LIBRARY_FILE
    done = subprocess.run([tool, "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                          check=True)
    return done.stdout


def _compile(ir: forge.IRModule, target: str, out: Path, monkeypatch) -> str:
    # Only the instructions are checked here: the numbers are the other suites', where the host runs them.
    monkeypatch.setenv("FORGE_VERIFY", "0")
    ir.compile(target=target, output_path=str(out))
    return _disassembly(out) if not target.startswith("raspberry") else _disassembly(out, "aarch64-linux-gnu-objdump")


@pytest.mark.parametrize("cpu,model", MATRIX)
def test_x86_artifacts_hold_only_their_class_instructions(models, cpu, model, tmp_path, monkeypatch):
    registers, vnni = X86[cpu]
    asm = _compile(models[model](), _class_target(cpu), tmp_path / "a", monkeypatch)
    fma = [line for line in asm.splitlines() if "vfmadd" in line and "ps" in line]
    assert fma, "no packed FMA: the kernels are not vectorized for the class"
    dots = [line for line in asm.splitlines() if "vpdpbusd" in line]
    if registers == "ymm":
        found = AVX512_ONLY.search(asm)
        assert found is None, f"AVX-512 code for {cpu}: {found.group(0)!r}"
        assert any("%ymm" in line for line in fma), "no 256-bit FMA for an AVX2 class"
    if vnni is None:
        assert not dots, f"vpdpbusd for {cpu}, which has no VNNI"
        if model in ("mobilenetv2-int8", "bert-qdq"):  # AVX2's integer kernels: int16 pairs on vpmaddwd
            assert any("vpmaddwd" in line and "%ymm" in line for line in asm.splitlines()), \
                f"no vpmaddwd in an int8 model for {cpu}"
            assert "vpmaddubsw" not in asm, "the saturating byte multiply-add"
    elif model in ("mobilenetv2-int8", "bert-qdq"):
        assert dots, f"no vpdpbusd in an int8 model for {cpu}, which has VNNI"
        assert all(f"%{vnni}" in line for line in dots), [line for line in dots if f"%{vnni}" not in line][:3]
    recorded, _ = schema.read_artifact(tmp_path / "a")  # read, not loaded: the class may not run here
    assert set(recorded["cpu_features"]["flags"]) >= {"avx2", "fma"}
    assert ("avx512f" in recorded["cpu_features"]["flags"]) == (registers == "zmm")


@pytest.mark.parametrize("tag", list(ARM))
def test_arm_artifacts_use_sdot_only_where_the_board_has_it(models, tag, tmp_path, monkeypatch):
    asm = _compile(models["mobilenetv2-int8"](), tag, tmp_path / "a", monkeypatch)
    assert re.search(r"\bfmla\b", asm), "no vector multiply-add: the kernels are not vectorized"
    assert bool(re.search(r"\bsdot\b", asm)) == ARM[tag], tag
    flags = schema.read_artifact(tmp_path / "a")[0]["cpu_features"]
    assert flags["arch"] == "aarch64" and ("asimddp" in flags["flags"]) == ARM[tag]


def _one_conv() -> forge.IRModule:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU()).eval()
    return forge.from_onnx(export_torch(model, (torch.randn(1, 8, 12, 12),), ["x"]))


@pytest.mark.parametrize("cpu", CLASSES)
def test_a_tuned_record_for_each_class_this_cpu_measures_on_holds_only_its_instructions(cpu, tmp_path,
                                                                                        monkeypatch, caplog):
    target = resolve_target(_class_target(cpu))
    if not can_run(target):
        pytest.skip(f"tuning measures candidates on this CPU, which cannot run {cpu} code")
    import logging

    ir = _one_conv()
    ir.tune(target=_class_target(cpu), work_dir=tmp_path / "db", trials=4, time_budget=120, progress=False)
    with caplog.at_level(logging.INFO, logger="forge.schedule"):
        asm = _compile(ir, _class_target(cpu), tmp_path / "a", monkeypatch)
    assert any("Tuned" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    registers, _ = X86[cpu]
    if registers == "ymm":
        assert AVX512_ONLY.search(asm) is None
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(forge.Runtime(tmp_path / "a").infer(x)[0], ir.get_inference_function()(x),
                               rtol=1e-4, atol=1e-4)


def _lacking() -> tuple[str, list[str]]:
    """A target with extensions this CPU lacks, and those extensions (as Linux names them)."""
    candidates = {"avx512f": "avx512f", "avx512vnni": "avx512_vnni", "avx512bw": "avx512bw",
                  "amx-tile": "amx_tile", "amx-int8": "amx_int8", "avx512fp16": "avx512_fp16"}
    absent = [feature for feature, flag in candidates.items() if flag not in FLAGS]
    mattr = ",".join(f"+{feature}" for feature in (absent or ["avx512f"]))
    return f"llvm -mcpu=znver3 -mattr={mattr}", [candidates[feature] for feature in absent]


def test_an_artifact_for_extensions_this_cpu_lacks_is_refused_before_it_runs(tmp_path):
    """In a fresh process: exit code 1 and the missing extensions named, never SIGILL. On a CPU that has every
    candidate extension, the recorded flags in a copy of the library are edited to one it lacks (re-sealed)."""
    target, missing = _lacking()
    ir = _one_conv()
    ir.compile(target=target, output_path=str(tmp_path / "a"))
    if not missing:  # this CPU has them all: record one no CPU reports, in a copy
        library = tmp_path / "a" / schema.LIBRARY_FILE
        data = library.read_bytes()[:-(16 + 32 + 8)]  # the content, without its checksum trailer
        assert b'"avx512f"' in data
        library.write_bytes(seal(data.replace(b'"avx512f"', b'"avx999f"')))
        missing = ["avx999f"]
    script = "import forge, sys; forge.Runtime(sys.argv[1]); print('loaded')"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "ForgeError" in done.stderr and "lacks: " in done.stderr, done.stderr[-2000:]
    for flag in missing:
        assert flag in done.stderr.rsplit("lacks: ", 1)[1].split(".")[0], (flag, done.stderr[-2000:])
    forge_bin = shutil.which("forge", path=os.path.dirname(sys.executable))
    run = subprocess.run([forge_bin, "run", str(tmp_path / "a")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "lacks: " in run.stderr and "Recompile" in run.stderr, run.stderr[-2000:]


def test_the_host_target_records_this_cpus_extensions_and_loads(tmp_path):
    ir = _one_conv()
    ir.compile(output_path=str(tmp_path / "a"))
    recorded = schema.read_artifact(tmp_path / "a")[0]["cpu_features"]
    assert recorded["arch"] == "x86_64" or recorded["arch"] == "aarch64"
    assert set(recorded["flags"]) <= FLAGS, set(recorded["flags"]) - FLAGS  # nothing this CPU lacks
    x = np.random.default_rng(2).standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(forge.Runtime(tmp_path / "a").infer(x)[0], ir.get_inference_function()(x),
                               rtol=1e-4, atol=1e-4)


def test_a_host_model_name_with_extensions_this_cpu_lacks_is_narrowed_to_what_it_has(monkeypatch):
    """A hypervisor may hide extensions its CPU model has: ``"llvm"`` turns those off with ``-mattr``."""
    from forge_core.targets import isa

    real = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")
    features = {str(k): bool(v) for k, v in real().items()}
    features.update({"avx512f": False, "avx512vnni": False, "avx512bw": False})
    monkeypatch.setattr(isa, "_host_cpu_features", lambda: features)
    mattr = isa.host_mattr("znver5", [])
    assert {"-avx512f", "-avx512vnni", "-avx512bw"} <= set(mattr)
    narrowed = tvm.target.Target({"kind": "llvm", "mcpu": "znver5", "mattr": mattr})
    assert "avx512f" not in isa.required_cpu_features(narrowed)["flags"]


def test_tuning_for_a_class_this_cpu_cannot_run_is_refused(tmp_path):
    target, missing = _lacking()
    if not missing:
        pytest.skip("this CPU has every extension of the candidates: tuning for them measures here")
    with pytest.raises(forge.ForgeError, match="which lacks ") as refused:
        _one_conv().tune(target=target + " -num-cores=2", work_dir=tmp_path / "db", trials=2, progress=False)
    assert all(flag in str(refused.value) for flag in missing), (missing, str(refused.value))
    assert not (tmp_path / "db").exists()


def test_benchmarks_say_which_cpu_class_their_figures_are_for():
    from forge_core.runtime.cpu_features import describe_host

    line = describe_host()
    assert line.startswith("CPU: ") and MODEL in line
    for flag in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if "(x86_64)" in line else ():
        assert re.search(rf"\b{flag}\b", line.split(";")[0] if flag in FLAGS else line.split("without")[-1]), line
    benchmarks = Path(__file__).parent.parent / "benchmarks"
    for script in sorted(benchmarks.glob("*.py")):
        if "__main__" in script.read_text() and script.name != "timing_worker.py":  # the worker prints JSON
            assert "describe_host()" in script.read_text(), script.name
