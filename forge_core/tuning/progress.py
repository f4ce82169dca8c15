"""The tuning progress bar (rich), or nothing when it is turned off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from forge_core.tuning.session import Progress as ProgressCallback


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[ProgressCallback | None]:
    """Yield a ``progress(done, total, message)`` callback drawing a bar on stderr."""
    if not enabled:
        yield None
        return
    with Progress(TextColumn("Tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), transient=False) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, message: str) -> None:
            bar.update(task, completed=done, total=total or None, description=message)

        yield update
