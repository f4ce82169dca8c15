from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Verification mode for every model the suite compiles, in this process and in the
# subprocesses it starts: each scheduled function is checked against its unscheduled form.
os.environ["FORGE_VERIFY"] = "1"

from forge_core.plugin_manager import reset_plugin_manager  # noqa: E402


@pytest.fixture
def fresh_plugins(monkeypatch):
    """A plugin manager rebuilt for this test, and rebuilt again afterwards."""
    monkeypatch.delenv("FORGE_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()
