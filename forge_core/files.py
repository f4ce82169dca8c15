"""Writing outputs all or nothing, and naming the path when a file cannot be read or written.

Every output Forge writes (an artifact directory, a tuning database, a
report, a picture, saved arrays) is first written beside its final place,
under a hidden temporary name, and renamed into place only once complete
(:func:`os.replace`, atomic within a file system). A failure at any point
(disk full, quota, file too large, permission denied, an interrupt) removes
what was staged and the parent directories it created, and leaves what was
at the final path before untouched.

Errors are :class:`forge_core.errors.FileAccessError`: an ``OSError`` whose
message is one line naming the final path and the system's reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from forge_core.errors import FileAccessError

TEMP_MARK = ".tmp-"
"""Part of every temporary name Forge stages an output under (``.<name>.tmp-<random>``)."""


def cache_dir(name: str) -> Path:
    """Forge's cache directory ``name``: under ``$FORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/forge``, else
    ``~/.cache/forge`` (nvcc's fatbins, the wheels of bundles)."""
    root = os.environ.get("FORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "forge")
    return Path(root) / name


def file_error(code: int, filename: str | os.PathLike[str], verb: str = "write") -> FileAccessError:
    """A :class:`FileAccessError` with the system's text for ``code``."""
    return FileAccessError(code, os.strerror(code), str(filename), verb)


@contextlib.contextmanager
def naming(path: str | os.PathLike[str], verb: str = "write") -> Iterator[None]:
    """Restate an ``OSError`` raised inside as a :class:`FileAccessError` naming ``path``."""
    try:
        yield
    except FileAccessError:
        raise
    except OSError as exc:
        raise FileAccessError.from_os_error(exc, path, verb) from exc


def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_directory_writable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`FileAccessError` when files cannot be added to the directory ``path`` (or it made)."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise FileAccessError(errno.EEXIST, "it exists and is not a directory", str(path))
    if not path.is_dir():
        check_creatable(path)
        return
    _check_writable(path, path)


def check_file_writable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`FileAccessError` when :func:`write_file` could not write ``path`` (checked before work)."""
    path = Path(path)
    if path.is_dir():
        raise file_error(errno.EISDIR, path)
    if not path.exists() or path.is_file():
        check_creatable(path)
    elif not os.access(path, os.W_OK):  # a device or a pipe, written directly
        raise file_error(errno.EACCES, path)


def check_creatable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`FileAccessError` when ``path`` cannot be created (or replaced) by a rename in its parent.

    The closest existing ancestor of the parent must be a directory this
    process may write, on a file system mounted read-write. A check before
    long work gives the reason at once; the writes themselves still report
    (and clean up after) what the check cannot foresee, such as a full disk.
    """
    path = Path(path)
    _check_writable(nearest_existing(Path(os.path.abspath(path)).parent), path)


def _check_writable(ancestor: Path, path: Path) -> None:
    if not ancestor.is_dir():
        raise FileAccessError(errno.ENOTDIR, f"{str(ancestor)!r} is not a directory", str(path))
    read_only = False
    with contextlib.suppress(OSError, AttributeError):
        read_only = bool(os.statvfs(ancestor).f_flag & os.ST_RDONLY)
    if read_only:
        raise file_error(errno.EROFS, path)
    effective = os.access in os.supports_effective_ids
    if not os.access(ancestor, os.W_OK | os.X_OK, effective_ids=effective):
        reason = os.strerror(errno.EACCES)
        detail = "" if ancestor in (path.absolute(), path.absolute().parent) else \
            f" (the directory {str(ancestor)!r} is not writable)"
        raise FileAccessError(errno.EACCES, f"{reason}{detail}", str(path))


def make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing ancestors; return those created, outermost first."""
    missing = []
    current = Path(os.path.abspath(directory))
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    created = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError:
            remove_created(created)
            raise
        created.append(folder)
    return created


def remove_created(created: list[Path]) -> None:
    """Remove the directories :func:`make_parents` created, innermost first, where still empty."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a moment, for every thread)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def temp_name(name: str) -> str:
    return f".{name}{TEMP_MARK}{secrets.token_hex(4)}"


def make_temp_dir(parent: Path, name: str) -> Path:
    """A new directory beside ``parent / name``, with the mode a directory made by ``mkdir`` would have."""
    folder = Path(tempfile.mkdtemp(prefix=f".{name}{TEMP_MARK}", dir=parent))
    os.chmod(folder, 0o777 & ~_umask())
    return folder


def remove_tree(path: Path) -> None:
    """Remove ``path`` (a file or a directory tree), also where a directory in it is read-only."""
    def writable_then_retry(function, target, _error) -> None:  # noqa: ANN001 - shutil's callback
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            function(target)

    if path.is_dir() and not path.is_symlink():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=writable_then_retry)
        else:
            shutil.rmtree(path, onerror=writable_then_retry)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _copy_tree(source: Path, destination: Path) -> None:
    """Copy the files under ``source`` into ``destination``; an error names the file being written."""
    for folder, folders, files in os.walk(source):
        target = destination / Path(folder).relative_to(source)
        for name in folders:
            with naming(target / name):
                (target / name).mkdir(exist_ok=True)
        for name in files:
            with naming(target / name):
                shutil.copy2(Path(folder) / name, target / name, follow_symlinks=False)


class StagedFile:
    """One file written all or nothing: ``with StagedFile(path) as staged: staged.write(data); staged.commit()``.

    :meth:`write` fills a temporary file beside ``path``; :meth:`commit`
    renames it into place (a reader sees the old file or the new one, never a
    part). Without a commit, the temporary file and the parent directories
    created for it are removed and the old file is untouched. A ``path`` that
    exists and is not a regular file (``/dev/stdout``, a pipe) is written
    directly by :meth:`write`: there is nothing to stage or rename. ``mode`` sets
    the permissions (default: the old file's, or a new file's under the umask).

    Errors are :class:`FileAccessError` naming ``path``.
    """

    def __init__(self, path: str | os.PathLike[str], *, mode: int | None = None) -> None:
        self.path = Path(path)
        self.mode = mode
        self.staged: Path | None = None
        self.created: list[Path] = []
        self.info: os.stat_result | None = None

    def __enter__(self) -> StagedFile:
        try:
            self.info = os.stat(self.path)
        except FileNotFoundError:
            self.info = None
        except OSError as exc:
            raise FileAccessError.from_os_error(exc, self.path) from exc
        if self.info is not None and stat.S_ISDIR(self.info.st_mode):
            raise file_error(errno.EISDIR, self.path)
        return self

    def write(self, data: bytes | str) -> None:
        """Stage the whole content of the file (once)."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        if self.info is not None and not stat.S_ISREG(self.info.st_mode):  # a device, a pipe: nothing to stage
            with naming(self.path), open(self.path, "wb") as handle:
                handle.write(payload)
            return
        assert self.staged is None, "write() stages the whole file, once"
        with naming(self.path):
            self.created = make_parents(self.path.parent)
            staged = self.path.parent / temp_name(self.path.name)
            if self.mode is not None:
                permissions = self.mode
            else:
                permissions = stat.S_IMODE(self.info.st_mode) if self.info is not None else 0o666
            descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 0o600 if self.mode is not None else permissions)
            self.staged = staged
            with open(descriptor, "wb") as handle:
                handle.write(payload)
            if self.mode is not None or self.info is not None:  # the umask does not apply to these
                os.chmod(staged, permissions)

    def commit(self) -> Path:
        with naming(self.path):
            if self.staged is not None:
                os.replace(self.staged, self.path)
                self.staged = None
                self.created = []
        return self.path

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.staged is not None:
            with contextlib.suppress(OSError):
                self.staged.unlink()
            self.staged = None
        remove_created(self.created)
        self.created = []


def write_file(path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` all or nothing (:class:`StagedFile`); returns ``path``.

    Raises:
        FileAccessError: naming ``path``, with the system's reason.
    """
    with StagedFile(path, mode=mode) as staged:
        staged.write(data)
        return staged.commit()


class StagedDirectory:
    """Write a directory's files all or nothing.

    ``with StagedDirectory(path) as tmp: ...write files into tmp...; staged.commit()``

    * ``replace=True`` (an artifact directory): ``tmp`` becomes ``path``; a
      directory already there is moved aside first and removed only once the
      new one is in place (``seed=True`` copies its files into ``tmp`` first,
      to extend them, as a tuning database is);
    * ``replace=False`` (``--save-outputs``): the files of ``tmp`` are moved
      into ``path``, next to what it holds; a file of the same name is replaced.

    Without :meth:`commit`, or when it fails, ``tmp`` and the parent
    directories created for it are removed and ``path`` is as it was. An
    ``OSError`` raised inside the block becomes a :class:`FileAccessError`
    naming the final path of the file (never ``tmp``).
    """

    def __init__(self, path: str | os.PathLike[str], *, replace: bool = True, seed: bool = False) -> None:
        self.path = Path(os.path.abspath(path))
        self.shown = Path(path)
        self.replace = replace
        self.seed = seed
        self.tmp: Path | None = None
        self.created: list[Path] = []
        self.committed = False

    def final(self, filename: object) -> str:
        """The final path (as the caller named it) of ``filename``, a path inside ``tmp``; others unchanged."""
        if filename is None:
            return str(self.shown)
        text = os.fsdecode(filename) if isinstance(filename, bytes | os.PathLike) else str(filename)
        if self.tmp is not None:
            with contextlib.suppress(ValueError):
                relative = Path(os.path.abspath(text)).relative_to(self.tmp)
                return str(self.shown / relative) if relative.parts else str(self.shown)
        return text

    def restate(self, exc: OSError) -> FileAccessError:
        """``exc`` as a :class:`FileAccessError` naming the final path of its file."""
        verb = exc.verb if isinstance(exc, FileAccessError) else "write"
        strerror = exc.strerror or (os.strerror(exc.errno) if exc.errno else None) or str(exc)
        return FileAccessError(exc.errno, strerror, self.final(exc.filename), verb)

    def __enter__(self) -> Path:
        try:
            if os.path.lexists(self.path) and not self.path.is_dir():
                raise FileAccessError(errno.EEXIST, "it exists and is not a directory", str(self.shown))
            if self.replace or not self.path.exists():
                self.created = make_parents(self.path.parent)
                self.tmp = make_temp_dir(self.path.parent, self.path.name)
                if self.seed and self.path.is_dir():
                    _copy_tree(self.path, self.tmp)
            else:
                self.tmp = make_temp_dir(self.path, "forge")
        except BaseException as exc:
            restated = self.restate(exc) if isinstance(exc, OSError) else None
            self._discard()
            if restated is not None:
                raise restated from exc
            raise
        return self.tmp

    def commit(self) -> None:
        """Move the staged files into place."""
        assert self.tmp is not None and not self.committed
        try:
            if not self.replace and self.path.is_dir():
                self._merge()
            else:
                self._swap()
        except OSError as exc:
            raise self.restate(exc) from exc
        self.committed = True

    def _swap(self) -> None:
        assert self.tmp is not None
        backup: Path | None = None
        if os.path.lexists(self.path):
            backup = self.path.parent / temp_name(self.path.name)
            os.replace(self.path, backup)
        try:
            os.replace(self.tmp, self.path)
        except BaseException:
            if backup is not None:
                os.replace(backup, self.path)
            raise
        self.tmp = None
        if backup is not None:
            remove_tree(backup)

    def _merge(self) -> None:
        assert self.tmp is not None
        staged_files = sorted(self.tmp.iterdir())
        for staged in staged_files:  # a rename that would fail, found before any is made
            if (self.path / staged.name).is_dir():
                raise file_error(errno.EISDIR, self.shown / staged.name)
        for staged in staged_files:
            os.replace(staged, self.path / staged.name)
        self.tmp.rmdir()
        self.tmp = None

    def _discard(self) -> None:
        if self.tmp is not None:
            remove_tree(self.tmp)
            self.tmp = None
        remove_created(self.created)
        self.created = []

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.committed:
            restated = None
            if isinstance(exc, OSError) and (not isinstance(exc, FileAccessError) or self._inside(exc.filename)):
                restated = self.restate(exc)
            self._discard()
            if restated is not None:
                raise restated from exc

    def _inside(self, filename: object) -> bool:
        return filename is not None and self.final(filename) != str(filename)


def leftovers(directory: str | os.PathLike[str]) -> list[str]:
    """Names in ``directory`` that look like Forge's temporary files (what a crash could leave)."""
    with contextlib.suppress(OSError):
        return sorted(name for name in os.listdir(directory) if name.startswith(".") and TEMP_MARK in name)
    return []
