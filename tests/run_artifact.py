"""Run a compiled artifact in a fresh process: ``python run_artifact.py ARTIFACT INPUTS.npz OUTPUTS.npz``.

Uses only the light runtime and reports any framework module that got imported.
"""

import json
import sys

import numpy as np

from forge_core.runtime import Runtime

artifact, inputs_path, outputs_path = sys.argv[1:4]
runtime = Runtime(artifact)
with np.load(inputs_path) as data:
    inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
outputs = runtime.infer(*inputs)
np.savez(outputs_path, *outputs)
frameworks = sorted(m for m in ("onnx", "onnxruntime", "torch", "tensorflow", "forge_onnx") if m in sys.modules)
print(json.dumps({"uuid": runtime.uuid, "frameworks": frameworks, "device_type": runtime.device_type}))
