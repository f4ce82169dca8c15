"""Run a compiled artifact in a fresh process: ``python run_artifact.py ARTIFACT INPUTS.npz OUTPUTS.npz [KEY PASSWORD]``.

Uses only the light runtime and reports any framework module that got imported, whether TVM's compiler
library got loaded (``TVM_USE_RUNTIME_LIB=1`` in the environment keeps it out), whether TVM's Python package got
imported (the runtime drives TVM's runtime library through tvm_ffi), and how long the runtime's import took.
"""

import json
import sys
import time

started = time.perf_counter()
import numpy as np  # noqa: E402

from forge_core.runtime import Runtime  # noqa: E402

import_s = time.perf_counter() - started

artifact, inputs_path, outputs_path = sys.argv[1:4]
key, password = (sys.argv[4:6] + [None, None])[:2]
runtime = Runtime(artifact, key, password)
with np.load(inputs_path) as data:
    inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
outputs = runtime.infer(*inputs)
np.savez(outputs_path, *outputs)
frameworks = sorted(m for m in ("onnx", "onnxruntime", "torch", "tensorflow", "forge_onnx") if m in sys.modules)
with open("/proc/self/maps") as maps:
    compiler_loaded = any("libtvm_compiler" in line for line in maps)
print(json.dumps({"uuid": runtime.uuid, "frameworks": frameworks, "device_type": runtime.device_type,
                  "compiler_loaded": compiler_loaded, "tvm_imported": "tvm" in sys.modules, "import_s": import_s}))
