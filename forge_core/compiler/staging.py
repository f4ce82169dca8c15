"""Writing an artifact directory atomically.

Files are written into a temporary directory beside ``output_path``; only
when every exporter succeeded does it replace ``output_path`` (the previous
artifact is moved aside first and removed last). A failure at any point
leaves ``output_path`` exactly as it was, and no temporary directory (nor a
parent directory created for it) behind: ``forge_core.files.StagedDirectory(path,
replace=True)`` does it. This module checks ``output_path`` before the work.
"""

from __future__ import annotations

from pathlib import Path

from forge_core.errors import OptionError
from forge_core.files import check_creatable


def check_output_path(path: Path, force_overwrite: bool) -> None:
    """Raise when ``path`` may not be written, before any work starts.

    ``ValueError``: ``path`` is a file, or a non-empty directory without
    ``force_overwrite``. :class:`forge_core.errors.FileAccessError`: the
    directory that would hold it cannot be written (permissions, a read-only
    file system, a file where a directory should be).
    """
    if path.exists() and not path.is_dir():
        raise OptionError(f"output_path {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force_overwrite:
        raise OptionError(
            f"output_path {str(path)!r} exists and is not empty; pass force_overwrite=True to replace it"
        )
    check_creatable(path)  # the artifact is renamed into place in the parent directory
