from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Verification mode for every model the suite compiles, in this process and in the
# subprocesses it starts: each scheduled function is checked against its unscheduled form.
os.environ.setdefault("FORGE_VERIFY", "1")  # FORGE_VERIFY=0 runs the suite without it
# A function verified once is remembered for the whole run, by both workers and the subprocesses they start.
os.environ.setdefault("FORGE_VERIFY_CACHE", os.path.join(
    tempfile.gettempdir(), f"forge-verify-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"))

from forge_core.plugin_manager import reset_plugin_manager  # noqa: E402


@pytest.fixture
def fresh_plugins(monkeypatch):
    """A plugin manager rebuilt for this test, and rebuilt again afterwards."""
    monkeypatch.delenv("FORGE_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


# The longest files first (measured on 2 cores), so that with two workers (``./scripts/test`` runs
# ``-n 2 --dist loadfile --no-loadscope-reorder``) neither ends with a long file started last while the
# other idles. Seconds from `./scripts/test --durations=0` on 2026-11-24.
LONGEST_FIRST = (
    "test_onnx_conformance.py",  # 500 s, in two processes of its own
    "test_compile.py",  # 370 (2026-11-27: 3 light models of 9 verified; DenseNet-121's alone was 343 s loaded)
    "test_keras_applications.py",  # 350
    "test_tuning.py",  # 275 before the search's import was trimmed
    "test_dynamic_shapes.py",  # 250 (2026-11-27: less the DBNet CUDA build, 106; + calibration and MobileNetV2, 100)
    "test_shape_buckets.py",  # 235
    "test_isa_matrix.py",  # 14 artifacts and a tuning per class the host can run
    "test_remote.py",  # 130
    "test_bundle.py",  # 200 (2026-11-28: every arm/ tag, qemu runs, the emulated RPC board)
    "test_int8_kernels.py",  # 110
    "test_transformers_corpus.py",  # 110, + 150 for the dynamic from_torch cases (2026-11-27)
    "test_quantization.py",  # 100
    "test_schedule_fuzz.py",  # 85
    "test_graph_api.py",  # 80
    "test_cli_bad_input.py",  # 75
    "test_tensorrt_partition.py",  # 75
)


def pytest_sessionfinish(session, exitstatus):
    """The run's verification cache goes with the run (the controller removes it once the workers are done)."""
    if not hasattr(session.config, "workerinput"):
        import shutil

        shutil.rmtree(os.environ["FORGE_VERIFY_CACHE"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
