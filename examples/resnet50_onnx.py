"""Forge's main job on the ResNet-50 that the onnx wheel ships.

1. Load ``light_resnet50.onnx`` from the installed onnx package and print its summary.
2. Run it with the (unoptimized) inference function; check against the reference.
3. Compile it for this machine into ``compile_output/resnet50``.
4. In a fresh process, load the artifact with the light runtime, run it, check
   it against the reference, and time it beside onnxruntime on the same input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import forge

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODEL = LIGHT / "light_resnet50.onnx"
REFERENCE = LIGHT / "light_resnet50_output_0.pb"
OUTPUT = Path("compile_output") / "resnet50"
RTOL, ATOL = 1e-3, 1e-5  # onnx's backend test runner uses these for model tests
REPEAT = 10

# Runs in a fresh process: only the runtime, numpy and onnxruntime (the reference peer).
RUN_ARTIFACT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from forge_core.runtime import Runtime

    artifact, input_path, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
    x = np.load(input_path)
    runtime = Runtime(artifact)
    (y,) = runtime.infer(x)
    runtime.warm_up(2)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        runtime.infer(x)
        times.append(time.perf_counter() - start)
    np.save(input_path + ".out.npy", y)
    print(json.dumps({"uuid": runtime.uuid, "threads": runtime.num_threads, "median_ms": 1000 * float(np.median(times))}))
    """
)


def check(label: str, output: np.ndarray, reference: np.ndarray) -> bool:
    error = float(np.max(np.abs(output - reference)))
    ok = bool(np.allclose(output, reference, rtol=RTOL, atol=ATOL))
    print(f"{label}: max abs error {error:.2e} (rtol={RTOL}, atol={ATOL}): {'OK' if ok else 'MISMATCH'}")
    return ok


def onnxruntime_median_ms(x: np.ndarray, threads: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for _ in range(3):
        session.run(None, {name: x})
    times = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        session.run(None, {name: x})
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main() -> int:
    reference = numpy_helper.to_array(onnx.load_tensor(str(REFERENCE)))

    started = time.perf_counter()
    ir = forge.from_onnx(MODEL)
    print(f"Loaded {MODEL.name} in {time.perf_counter() - started:.1f} s\n")
    print(ir.summary(), "\n")

    # The input onnx's backend tests feed this model: arange(n) / n.
    shape = ir.input_shapes[0]
    x = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
    ok = check("Inference function vs reference", ir.get_inference_function()(x), reference)

    started = time.perf_counter()
    ir.compile(output_path=OUTPUT, force_overwrite=True, export_metadata=True)
    print(f"Compiled for this machine in {time.perf_counter() - started:.1f} s -> {OUTPUT}/")

    input_path = OUTPUT.parent / "resnet50_input.npy"
    np.save(input_path, x)
    done = subprocess.run([sys.executable, "-c", RUN_ARTIFACT, str(OUTPUT), str(input_path), str(REPEAT)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return 1
    report = json.loads(done.stdout.strip().splitlines()[-1])
    ok &= check(f"Artifact {report['uuid']} in a fresh process vs reference", np.load(f"{input_path}.out.npy"),
                reference)

    ort_ms = onnxruntime_median_ms(x, report["threads"])
    print(f"Latency (median of {REPEAT}, {report['threads']} threads): Forge {report['median_ms']:.1f} ms, "
          f"onnxruntime {ort_ms:.1f} ms, ratio {report['median_ms'] / ort_ms:.1f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
