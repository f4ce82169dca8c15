from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from forge_core.plugin_manager import reset_plugin_manager  # noqa: E402


@pytest.fixture
def fresh_plugins(monkeypatch):
    """A plugin manager rebuilt for this test, and rebuilt again afterwards."""
    monkeypatch.delenv("FORGE_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()
