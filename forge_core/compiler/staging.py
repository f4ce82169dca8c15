"""Writing an artifact directory atomically.

Files are written into a temporary directory beside ``output_path``; only
when every exporter succeeded does it replace ``output_path`` (the previous
artifact is moved aside first and removed last). A failure at any point
leaves ``output_path`` exactly as it was, and no temporary directory behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType


def check_output_path(path: Path, force_overwrite: bool) -> None:
    """Raise ``ValueError`` when ``path`` may not be written (before any work starts)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"output_path {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force_overwrite:
        raise ValueError(
            f"output_path {str(path)!r} exists and is not empty; pass force_overwrite=True to replace it"
        )


class StagingDirectory:
    """``with StagingDirectory(path) as tmp: ...write into tmp...; stage.commit()``."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()
        self.tmp: Path | None = None
        self.committed = False

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent))
        os.chmod(self.tmp, 0o755)
        return self.tmp

    def commit(self) -> None:
        """Move the staged files into place, replacing what was at ``path``."""
        assert self.tmp is not None
        backup: Path | None = None
        if self.path.exists():
            backup = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.old-", dir=self.path.parent))
            backup.rmdir()
            os.replace(self.path, backup)
        try:
            os.replace(self.tmp, self.path)
        except BaseException:
            if backup is not None:
                os.replace(backup, self.path)
            raise
        self.committed = True
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.committed and self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
