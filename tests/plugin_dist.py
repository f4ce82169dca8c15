"""Install a plugin for a test the way pip does: a module plus a dist-info with entry points."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path


def write_plugin_dist(
    site: Path, dist: str, module: str, source: str, entry_point: str | None = None, version: str = "1.0"
) -> Path:
    """Write ``<module>.py`` and ``<dist>-<version>.dist-info`` (group ``forge``) into ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[forge]\n{entry_point or dist} = {module}\n")
    importlib.invalidate_caches()
    return site
