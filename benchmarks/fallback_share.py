"""The share of inference time in fallback kernels, on every model of the test corpus.

    .venv/bin/python benchmarks/fallback_share.py [--models bert,vit,ResNet50,...] [--repeat 20]

A fallback kernel is one no schedule rule took: the generic parallel schedule
(``Generic``) or none at all (dynamic shapes, opaque kernels such as sorts).
Each model of the corpus (tests/hf_models.py: the transformers architectures,
exported by TorchScript at opset 17 with static shapes; tests/test_keras_applications.py:
every keras.applications family) is compiled with the default options, loaded
by the light runtime and profiled (``Runtime.profile``, ``repeat`` runs); the
artifact's ``schedules`` metadata says which kernels fell back. The target is
under 5% on every model. Prints a table with the slowest fallback kernels and
writes benchmarks/results/fallback_share.json.

The profile times each VM call from Python, so the shares of tiny models
include a few microseconds of instrumentation per call; the compile log
(``forge --debug compile``) names the same fallback kernels.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

import forge
from forge_core.runtime.profiling import fallback_share

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
TARGET = 0.05


def _transformers(name: str) -> tuple[forge.IRModule, list[np.ndarray]]:
    import onnx
    import torch
    from hf_models import ARCHITECTURES

    arch = ARCHITECTURES[name]
    model = arch.build(seed=1).eval()
    inputs = arch.inputs(1, 16, seed=2)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buffer, input_names=list(arch.input_names), output_names=["output"],
                          opset_version=17, dynamo=False)
    return forge.from_onnx(onnx.load_from_string(buffer.getvalue())), [t.numpy() for t in inputs]


def _keras(name: str) -> tuple[forge.IRModule, list[np.ndarray]]:
    from test_keras_applications import FAMILIES, build

    family = next(f for f in FAMILIES if f.constructor == name)
    image = np.random.default_rng(0).uniform(-1, 1, (1, 3, family.size, family.size)).astype("float32")
    return forge.from_keras(build(family)), [image]


def corpus() -> dict[str, object]:
    from hf_models import ARCHITECTURES
    from test_keras_applications import FAMILIES

    models: dict[str, object] = {name: _transformers for name in ARCHITECTURES}
    models.update({family.constructor: _keras for family in FAMILIES})
    return models


def measure(name: str, load, work: Path, repeat: int) -> dict:
    ir, inputs = load(name)
    ir.compile(output_path=work / name, force_overwrite=True)
    runtime = forge.Runtime(work / name)
    runtime.infer(*inputs)
    rows = runtime.profile(*inputs, repeat=repeat)
    schedules = runtime.get_metadata()["schedules"]
    return {"model": name, "fallback_share": fallback_share(rows),
            "fallback_kernels": len(schedules["fallbacks"]), "kernels": len(schedules["rules"]),
            "ms_per_run": sum(row.total_ms for row in rows),
            "slowest_fallbacks": [f"{row.name} ({row.rule}) {100 * row.share:.1f}%" for row in rows if row.fallback][:4]}


def main() -> int:
    sys.path.insert(0, str(TESTS))
    models = corpus()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(models), help=f"a subset of {', '.join(models)}")
    parser.add_argument("--repeat", type=int, default=20, help="profiled runs per model")
    parser.add_argument("--json", default=str(HERE / "results" / "fallback_share.json"))
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in models]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(models)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="forge-fallback-") as tmp:
        for name in names:
            result = measure(name, models[name], Path(tmp), args.repeat)
            results.append(result)
            print(f"{name}: {100 * result['fallback_share']:.1f}% in {result['fallback_kernels']} of "
                  f"{result['kernels']} kernels; {', '.join(result['slowest_fallbacks']) or 'no fallback'}",
                  flush=True)

    from rich.console import Console
    from rich.table import Table

    table = Table("model", "fallback %", "fallback kernels", "ms/run (profiled)", "slowest fallbacks")
    for r in results:
        table.add_row(r["model"], f"{100 * r['fallback_share']:.1f}", f"{r['fallback_kernels']}/{r['kernels']}",
                      f"{r['ms_per_run']:.2f}", ", ".join(r["slowest_fallbacks"][:2]))
    Console(width=180).print(table)
    over = [r["model"] for r in results if r["fallback_share"] >= TARGET]
    print(f"{len(results) - len(over)} of {len(results)} models under the {100 * TARGET:.0f}% target"
          + (f"; over: {', '.join(over)}" if over else ""))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    sys.exit(main())
