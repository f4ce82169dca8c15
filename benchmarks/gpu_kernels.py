"""GPU kernels one by one: each schedule a rule could give a kernel, timed on a real GPU, beside the one Forge picks.

This is how :func:`forge_core.schedules.gpu.matmul_tile` (the tile ``SizedMatmul`` gives dlight's matmul
rule) and ``ShortReduction``'s hand-off to dlight's ``Fallback`` were chosen. Here (Forge, nvcc, no GPU)::

    .venv/bin/python benchmarks/gpu_kernels.py build --out build/gpu_kernels \\
        [--models resnet50,resnet50@8,bert6@8,dbnet@8] [--profile gpu_check.json] [--top 6]

lowers each model (``benchmarks/gpu_check.py``'s names: ``@N`` for batch N, ``_fp16`` for ``set_float16``) as
``compile()`` does for ``cuda -arch=sm_90`` up to the schedules, takes its kernels (with ``--profile``, a
``gpu_check.json`` written by ``gpu_check.py run --profile N``: each model's slowest ones; else every kernel
dlight's matmul rule takes), schedules each with every tile of :data:`TILES` (a matmul) or every reduction
rule (otherwise), and builds them into one library whose kernels nvcc compiled, beside TVM's runtime
library and Python 3.12 wheels. On the GPU machine (no TVM)::

    python3 build/gpu_kernels/gpu_kernels.py run build/gpu_kernels

times each kernel with TVM's time evaluator (20 runs, 5 repeats; each variant's output checked against the
first's) and prints, kernel by kernel, each variant's time over dlight's tile, the tile ``matmul_tile``
picks, and the totals: dlight's, Forge's pick, and the best of each kernel. Writes ``gpu_kernels.json``
(into ``$OUT`` too when set).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TILES = {  # dlight's Matmul.Config fields: block x/y, vthread x/y, micro x/y/k, vector, unroll, shared, align, inner x
    "tvm_32x64": (8, 16, 1, 1, 4, 4, 16, 2, 256, True, True, False),
    "small_16x16": (8, 8, 1, 1, 2, 2, 16, 2, 256, True, True, False),
    "small_16x32": (8, 16, 1, 1, 2, 2, 16, 2, 256, True, True, False),
    "narrow_32x32": (8, 8, 1, 1, 4, 4, 16, 2, 256, True, True, False),
    "wide_64x64": (16, 16, 1, 1, 4, 4, 8, 2, 256, True, True, False),
    "long_k_32x64": (8, 16, 1, 1, 4, 4, 32, 2, 256, True, True, False),
    "big_64x128": (16, 16, 1, 1, 4, 8, 8, 4, 256, True, True, False),
    "vector4_32x64": (8, 16, 1, 1, 4, 4, 16, 4, 256, True, True, False),
}
TILE_NAMES = {"TVM_TILE": "tvm_32x64", "LONG_K": "long_k_32x64", "NARROW_TILE": "narrow_32x32",
              "SMALL_TILE": "small_16x32"}


# --- build: here --------------------------------------------------------------------------------------------------

def _kernels(name: str, work: Path):
    """``name``'s fused, unscheduled PrimFuncs for ``cuda -arch=sm_90``, as ``compile()`` lowers them."""
    import warnings

    import torch
    import tvm
    import forge
    from forge_core.compiler.legal_layouts import LegalLayouts
    from forge_core.compiler.options import CompileOptions
    from forge_core.compiler.pipeline import _backend_stages, prepare_graph
    from forge_core.ir import weights
    from forge_core.quantization.expand import ExpandQuantize
    from forge_core.schedules.gpu import gpu_fusion_passes
    from forge_core.targets.parsing import resolve_target
    from gpu_check import _torch_model

    model, example, input_name = _torch_model(name)
    path = work / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(path), input_names=[input_name], opset_version=17, dynamo=False)
    ir = forge.from_onnx(path)
    target = resolve_target("cuda -arch=sm_90")
    options = CompileOptions.validate(opt_level=3, set_float16="fp16" in name)
    mod = prepare_graph(weights.bind_params(ir.mod, ir.params), options, target)
    with tvm.transform.PassContext(opt_level=3), target:
        lowering = [*_backend_stages(target).library_dispatch_passes(target), ExpandQuantize, LegalLayouts,
                    *gpu_fusion_passes()]  # compile()'s GPU lowering, its dlight rules left out
        mod = tvm.transform.Sequential(lowering)(mod)
    return target, {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def _variants(func, target):
    """(name, scheduled PrimFunc) for every tile of dlight's matmul rule, or else every reduction rule."""
    from tvm.s_tir import dlight

    from forge_core.schedules import gpu

    class Tiled(dlight.gpu.Matmul):
        def __init__(self, fields) -> None:
            self.fields = fields

        def get_configs(self, target):
            return dlight.gpu.Matmul.Config(*self.fields)

    def scheduled(rule):
        try:
            with target:
                sch = rule.apply(func, target, False)
        except Exception:  # noqa: BLE001 - a rule that fails on the kernel has no variant
            return None
        return None if sch is None else (sch[0] if isinstance(sch, list) else sch).mod["main"]

    with target:
        is_matmul = dlight.gpu.Matmul().apply(func, target, False) is not None
    rules = ([(name, Tiled(fields)) for name, fields in TILES.items()] if is_matmul else
             [("short_unrolled", gpu.ShortReduction(max_reduction=4096)), ("general_reduction",
              dlight.gpu.GeneralReduction()), ("reduction", dlight.gpu.Reduction()), ("gemv", dlight.gpu.GEMV()),
              ("fallback", dlight.gpu.Fallback())])
    return is_matmul, [(name, done) for name, rule in rules if (done := scheduled(rule)) is not None]


def build(out: Path, models: list[str], profile: Path | None, top: int) -> None:
    import tvm_ffi

    import tvm
    from forge_core.compiler.cuda_code import _probe, find_nvcc, packer
    from forge_core.runtime.cpu_features import describe_host
    from forge_core.schedules import gpu
    from gpu_check import _runtime_packages

    print(describe_host(), "(the machine that builds the kernels)", flush=True)
    slowest = {}
    if profile is not None:
        slowest = {row["model"]: [name for name, _, _ in row.get("profile", []) if not name.startswith("vm.")]
                   for row in json.loads(profile.read_text())}
    if out.exists():
        shutil.rmtree(out)
    work = out / "work"
    work.mkdir(parents=True)
    funcs, manifest, seen = {}, [], set()
    target = None
    for model in models:
        target, kernels = _kernels(model, work)
        names = [n for n in slowest.get(model, []) if n in kernels][:top] if model in slowest else list(kernels)
        for kernel in names:
            key = tvm_ffi.structural_hash(kernels[kernel], map_free_vars=True)
            if key in seen:
                continue
            seen.add(key)
            is_matmul, variants = _variants(kernels[kernel], target)
            if profile is None and not is_matmul:
                continue
            extents = gpu._matmul_extents(kernels[kernel]) if is_matmul else None
            pick = None
            if extents is not None:
                chosen = gpu.matmul_tile(*extents)
                pick = next(TILE_NAMES[n] for n in TILE_NAMES if getattr(gpu, n) is chosen)
            for variant, scheduled in variants:
                symbol = f"k{len(funcs)}"
                funcs[symbol] = scheduled.with_attr("global_symbol", symbol)
                manifest.append({"func": symbol, "model": model, "kernel": kernel, "variant": variant,
                                 "extents": extents, "pick": pick,
                                 "params": [(str(p.name), [int(d) for d in p.shape], str(p.dtype))
                                            for p in scheduled.params]})
        print(f"{model}: {len(names)} kernels, {len(funcs)} variants so far", flush=True)
    started = time.perf_counter()
    library = tvm.compile(tvm.IRModule(funcs), target=target)
    library.export_library(str(out / "kernels.so"), fpack_imports=packer("sm_90", _probe(find_nvcc())))
    print(f"{len(funcs)} kernels built by nvcc in {time.perf_counter() - started:.0f} s", flush=True)
    shutil.rmtree(work)
    (out / "manifest.json").write_text(json.dumps(manifest))
    _runtime_packages(out)
    shutil.copy(Path(__file__), out / "gpu_kernels.py")
    shutil.copy(HERE / "gpu_check.py", out / "gpu_check.py")
    shutil.copy(HERE / "models.py", out / "models.py")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB")


# --- run: on the GPU machine --------------------------------------------------------------------------------------

def run(bundle: Path) -> int:
    from gpu_check import _install, _preload_cudart

    site = _install(bundle)
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    sys.path.insert(0, str(site))
    print("cudart:", _preload_cudart(), flush=True)
    import numpy as np

    import tvm
    from forge_core.runtime.cpu_features import describe_host
    from forge_core.runtime.devices import ensure_backend

    print(describe_host(), "(the GPU machine's host)", flush=True)
    ensure_backend("cuda", str(bundle / "kernels.so"))
    device = tvm.cuda(0)
    library = tvm.runtime.load_module(str(bundle / "kernels.so"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    results, first = [], {}
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else bundle
    for entry in manifest:
        row = {k: entry[k] for k in ("model", "kernel", "variant", "extents", "pick")}
        try:
            arrays = [(np.random.default_rng(i).standard_normal(shape) * 0.5).astype(dtype) if "float" in dtype
                      else np.zeros(shape, dtype) for i, (_, shape, dtype) in enumerate(entry["params"])]
            args = [tvm.runtime.tensor(a, device) for a in arrays]
            library[entry["func"]](*args)
            device.sync()
            result = args[-1].numpy().astype("float32")
            reference = first.setdefault((entry["model"], entry["kernel"]), result)
            row["rel_err"] = float(np.abs(result - reference).max() / max(np.abs(reference).max(), 1e-9))
            timer = library.time_evaluator(entry["func"], device, number=20, repeat=5)
            row["ms"] = round(timer(*args).mean * 1e3, 4)
        except Exception as error:  # noqa: BLE001 - one variant's failure is reported, the others still run
            row["error"] = f"{type(error).__name__}: {str(error)[-300:]}"
        results.append(row)
        (out / "gpu_kernels.json").write_text(json.dumps(results, indent=0))
    return report(results)


def report(results: list[dict]) -> int:
    """Kernel by kernel, each variant's time over dlight's tile; the totals of dlight's tile, Forge's pick and
    the best. 1 when a variant failed or computed otherwise than the first."""
    kernels: dict[tuple[str, str], dict[str, dict]] = {}
    for row in results:
        kernels.setdefault((row["model"], row["kernel"]), {})[row["variant"]] = row
    totals = {"tvm": 0.0, "forge": 0.0, "best": 0.0}
    bad = 0
    for (model, kernel), variants in kernels.items():
        timed = {name: row["ms"] for name, row in variants.items() if "ms" in row}
        bad += sum("error" in row or row.get("rel_err", 0.0) > 1e-3 for row in variants.values())
        if not timed:
            continue
        base = timed.get("tvm_32x64")
        pick = next(iter(variants.values()))["pick"]
        extents = next(iter(variants.values()))["extents"]
        line = " ".join(f"{name}={ms / base:.2f}" if base else f"{name}={ms}" for name, ms in timed.items())
        print(f"{model:20s} {kernel[:40]:40s} I x J {extents} pick {pick}: {line}")
        if base and pick in timed:
            totals["tvm"] += base
            totals["forge"] += timed[pick]
            totals["best"] += min(timed.values())
    print(f"matmul kernels, ms summed: dlight's tile {totals['tvm']:.3f}, Forge's pick {totals['forge']:.3f}, "
          f"the best of each {totals['best']:.3f}; variants failed or differing: {bad}")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=Path("build/gpu_kernels"))
    b.add_argument("--models", default="resnet50,resnet50@8,bert6,bert6@8,mobilenetv2@8,dbnet@8")
    b.add_argument("--profile", type=Path, help="a gpu_check.json with profiles: each model's slowest kernels")
    b.add_argument("--top", type=int, default=6, help="kernels a model, the slowest (with --profile)")
    r = sub.add_parser("run")
    r.add_argument("bundle", type=Path)
    p = sub.add_parser("report", help="the table again, from a gpu_kernels.json")
    p.add_argument("results", type=Path)
    args = parser.parse_args()
    if args.command == "build":
        build(args.out.resolve(), args.models.split(","), args.profile, args.top)
        return 0
    if args.command == "report":
        return report(json.loads(args.results.read_text()))
    return run(args.bundle.resolve())


if __name__ == "__main__":
    sys.exit(main())
