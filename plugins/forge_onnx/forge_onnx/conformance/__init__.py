"""Running ONNX's backend test suite through Forge (and onnxruntime, the reference).

``python -m forge_onnx.conformance --help``. Cases run in worker processes
(a crash or a hang costs one case, not the run); the passing cases are kept in
``passing_cases.txt`` beside this file, a list that only grows.
"""

from pathlib import Path

PASSING_LIST = Path(__file__).with_name("passing_cases.txt")
