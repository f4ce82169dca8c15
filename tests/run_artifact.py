"""Run a compiled artifact in a fresh process: ``python run_artifact.py ARTIFACT INPUTS.npz OUTPUTS.npz [KEY PASSWORD]``.

Uses only the light runtime and reports any framework module that got imported, and whether TVM's compiler
library got loaded (``TVM_USE_RUNTIME_LIB=1`` in the environment keeps it out).
"""

import json
import sys

import numpy as np

from forge_core.runtime import Runtime

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
                  "compiler_loaded": compiler_loaded}))
