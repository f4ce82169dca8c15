"""Import, first inference, compile time and artifact size for the onnx wheel's nine light models.

    .venv/bin/python benchmarks/light_models.py [--json PATH]

For each model in one process: ``forge.from_onnx`` time; the first call of
``get_inference_function()`` (its build plus one run); ``compile()`` time and
the size of ``model_library.so``. Then, each in its own process, the
artifact's median latency through the runtime and onnxruntime's on the same
input (benchmarks/timing_worker.py). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import forge

HERE = Path(__file__).resolve().parent
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _time_engine(engine: str, model: Path, inputs: Path) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "timing_worker.py"), engine, str(model), str(inputs)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=str(HERE / "results" / "light_models.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-light-") as tmp:
        for path in sorted(LIGHT.glob("light_*.onnx")):
            name = path.stem.removeprefix("light_")
            started = time.perf_counter()
            ir = forge.from_onnx(path)
            import_s = time.perf_counter() - started
            shape = ir.input_shapes[0]
            x = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
            started = time.perf_counter()
            ir.get_inference_function()(x)
            first_inference_s = time.perf_counter() - started
            artifact = Path(tmp) / name
            started = time.perf_counter()
            ir.compile(output_path=artifact)
            compile_s = time.perf_counter() - started
            inputs = Path(tmp) / f"{name}.npz"
            np.savez(inputs, x)
            forge_ms = _time_engine("forge", artifact, inputs)["median_ms"]
            ort_ms = _time_engine("onnxruntime", path, inputs)["median_ms"]
            rows.append({"model": name, "import_s": import_s, "first_inference_s": first_inference_s,
                         "compile_s": compile_s, "library_mb": (artifact / "model_library.so").stat().st_size / 2**20,
                         "forge_ms": forge_ms, "onnxruntime_ms": ort_ms, "ratio": forge_ms / ort_ms})
            print(f"{name:<14} import {import_s:5.1f} s  first inference {first_inference_s:5.1f} s  "
                  f"compile {compile_s:5.1f} s  library {rows[-1]['library_mb']:6.1f} MB  "
                  f"forge {forge_ms:7.2f} ms  onnxruntime {ort_ms:7.2f} ms  ratio {rows[-1]['ratio']:.2f}x",
                  flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from forge_core.runtime.cpu_features import describe_host

    print(describe_host(), flush=True)  # every figure below counts for this CPU class
    sys.exit(main())
