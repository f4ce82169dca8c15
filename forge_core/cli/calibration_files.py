"""Calibration samples named on the command line (``forge quantize --calib PATH``).

``PATH`` is one of:

* a directory of ``.npy`` files, each one sample of a single-input model;
* a directory of ``.npz`` files, each one sample: its keys are the model's
  input names (a single-input model also takes an archive holding one array,
  whatever its key);
* an ``.npz`` file whose keys are the model's input names: each array holds
  the samples stacked along its leading axis. Sample ``i`` is ``arr[i:i+1]``
  when the array has the input's rank (the batch dimension of 1 is kept:
  ``(N, 3, 224, 224)`` for an input ``(1, 3, 224, 224)``), or ``arr[i]`` when it
  has one more dimension (``(N, 1, 3, 224, 224)``); every array needs the same
  leading length;
* an ``.npz`` file of a single-input model whose keys are not its input name
  (``np.savez(path, *samples)``): each array is one sample.

Files and keys are taken in natural order (``sample_2`` before
``sample_10``, ``arr_2`` before ``arr_10``); hidden files (``.name``) in a
directory are skipped. Nothing is cast: a float64 sample for a float32 input is
an error, as everywhere in Forge.

Samples are read lazily, one at a time, and the collection can be iterated
again (calibration, then the report); ``len()`` gives the progress bar its
total. Stacked ``.npz`` arrays are streamed row by row from the archive, so a
large archive is never loaded whole.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator, Sequence
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from forge_core.errors import ForgeError, MalformedDataError, UnsupportedFeatureError
from forge_core.runtime.signature import TensorSpec

SUFFIXES = (".npy", ".npz")


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


class CalibrationSamples:
    """The samples of one ``--calib`` path, read lazily; ``source(i)`` names where sample ``i`` comes from.

    ``last_source`` names the sample read most recently: when the model rejects
    a sample, that is the one.
    """

    def __init__(self, path: Path, count: int, limit: int | None) -> None:
        self.path = path
        self._count = count if limit is None else min(count, limit)
        self.last_source: str | None = None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        samples = self._samples()
        try:
            for index in range(self._count):
                sample = next(samples, None)
                if sample is None:
                    return
                self.last_source = self.source(index)
                yield sample
        finally:
            samples.close()

    def _samples(self) -> Iterator[Any]:
        raise UnsupportedFeatureError(f"{type(self).__name__} does not define _samples(), which its base class leaves to it")

    def source(self, index: int) -> str:
        raise UnsupportedFeatureError(f"{type(self).__name__} does not define source(), which its base class leaves to it")

    def describe(self) -> str:
        raise UnsupportedFeatureError(f"{type(self).__name__} does not define describe(), which its base class leaves to it")


class _FileSamples(CalibrationSamples):
    """One sample per ``.npy``/``.npz`` file of a directory."""

    def __init__(self, path: Path, files: list[Path], specs: Sequence[TensorSpec], limit: int | None) -> None:
        super().__init__(path, len(files), limit)
        self.files = files
        self.specs = specs

    def _samples(self) -> Iterator[Any]:
        for file in self.files:
            yield self._read(file)

    def _read(self, file: Path) -> Any:
        names = [spec.name for spec in self.specs]
        try:
            if file.suffix.lower() == ".npy":
                with file.open("rb") as handle:
                    if handle.read(6) != b"\x93NUMPY":
                        raise ForgeError(f"--calib: {str(file)!r} is not a NumPy .npy file (numpy.save writes one)")
                return np.load(file, allow_pickle=False)
            with np.load(file, allow_pickle=False) as archive:
                keys = list(archive.files)
                if len(names) == 1 and len(keys) == 1:
                    return archive[keys[0]]
                if sorted(keys) != sorted(names):
                    raise ForgeError(
                        f"--calib: {str(file)!r} holds {_listing(keys)}; a sample of this model needs one array "
                        f"per input: {_listing(names)}")
                return {name: archive[name] for name in names}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ForgeError(f"--calib: cannot read {str(file)!r}: {exc}") from None

    def source(self, index: int) -> str:
        return str(self.files[index])

    def describe(self) -> str:
        return f"{len(self)} sample{'s' if len(self) != 1 else ''} from {self.path}"


class _ArchiveSamples(CalibrationSamples):
    """An ``.npz`` whose arrays are each one sample of a single-input model."""

    def __init__(self, path: Path, keys: list[str], limit: int | None) -> None:
        super().__init__(path, len(keys), limit)
        self.keys = keys

    def _samples(self) -> Iterator[Any]:
        try:
            with np.load(self.path, allow_pickle=False) as archive:
                for key in self.keys:
                    yield archive[key]
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ForgeError(f"--calib: cannot read {str(self.path)!r}: {exc}") from None

    def source(self, index: int) -> str:
        return f"{self.path}[{self.keys[index]!r}]"

    def describe(self) -> str:
        return f"{len(self)} sample{'s' if len(self) != 1 else ''} (arrays) from {self.path}"


class _StackedSamples(CalibrationSamples):
    """An ``.npz`` keyed by input name, each array's leading axis indexing samples; streamed row by row."""

    def __init__(self, path: Path, headers: dict[str, tuple[tuple[int, ...], bool, np.dtype]],
                 specs: Sequence[TensorSpec], limit: int | None) -> None:
        lengths = {name: shape[0] for name, (shape, _, _) in headers.items() if shape}
        scalars = [name for name, (shape, _, _) in headers.items() if not shape]
        if scalars:
            raise ForgeError(f"--calib: {str(path)!r}: {_listing(scalars)} hold a scalar; each array needs a "
                             "leading axis of samples")
        if len(set(lengths.values())) > 1:
            counts = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
            raise ForgeError(f"--calib: {str(path)!r}: the arrays' leading axes (sample counts) differ ({counts})")
        super().__init__(path, next(iter(lengths.values())), limit)
        self.headers = headers
        self.specs = specs
        # keep the batch axis (arr[i:i+1]) when the array has the input's rank, else drop it (arr[i])
        self.keep_batch = {spec.name: spec.shape is not None and len(headers[spec.name][0]) == len(spec.shape)
                           for spec in specs}

    def _samples(self) -> Iterator[Any]:
        names = [spec.name for spec in self.specs]
        try:
            with zipfile.ZipFile(self.path) as archive:
                streams = {name: _RowReader(archive, name, *self.headers[name]) for name in names}
                try:
                    for _ in range(len(self)):
                        rows = {name: streams[name].next_row() for name in names}
                        sample = {name: row[np.newaxis] if self.keep_batch[name] else row for name, row in rows.items()}
                        yield sample[names[0]] if len(names) == 1 else sample
                finally:
                    for stream in streams.values():
                        stream.close()
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ForgeError(f"--calib: cannot read {str(self.path)!r}: {exc}") from None

    def source(self, index: int) -> str:
        return f"{self.path}[{index}]"

    def describe(self) -> str:
        return f"{len(self)} sample{'s' if len(self) != 1 else ''} (stacked by input name) from {self.path}"


class _RowReader:
    """Reads an ``.npy`` member of a zip archive one leading-axis row at a time."""

    def __init__(self, archive: zipfile.ZipFile, name: str, shape: tuple[int, ...], fortran: bool,
                 dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        self.stream = archive.open(f"{name}.npy")
        self.whole: np.ndarray | None = None
        self.row = 0
        if fortran:  # rows are not contiguous on disk: read the array (rare: np.save of a Fortran-ordered array)
            self.whole = np.lib.format.read_array(self.stream, allow_pickle=False)
        else:
            _read_header(self.stream)
        self.row_bytes = dtype.itemsize * prod(shape[1:])

    def next_row(self) -> np.ndarray:
        if self.whole is not None:
            row = np.ascontiguousarray(self.whole[self.row])
        else:
            data = self.stream.read(self.row_bytes)
            if len(data) != self.row_bytes:
                raise MalformedDataError("the archive ends before its arrays do")
            row = np.frombuffer(bytearray(data), dtype=self.dtype).reshape(self.shape[1:])
        self.row += 1
        return row

    def close(self) -> None:
        self.stream.close()


def _read_header(stream: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


def _listing(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "no arrays"


def _archive_keys(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ForgeError(f"--calib: {str(path)!r} is not a readable .npz archive: {exc}") from None
    return sorted((m[:-4] for m in members if m.endswith(".npy")), key=_natural_key)


def _stacked(path: Path, specs: Sequence[TensorSpec], limit: int | None) -> _StackedSamples:
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for spec in specs:
                with archive.open(f"{spec.name}.npy") as stream:
                    headers[spec.name] = _read_header(stream)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ForgeError(f"--calib: cannot read {str(path)!r}: {exc}") from None
    for name, (_, _, dtype) in headers.items():
        if dtype.hasobject:
            raise ForgeError(f"--calib: {str(path)!r}: array {name!r} holds Python objects; save numeric arrays")
    return _StackedSamples(path, headers, specs, limit)


def calibration_samples(path_text: str, specs: Sequence[TensorSpec], limit: int | None = None) -> CalibrationSamples:
    """The samples at ``path_text`` (see the module's docstring) for a model with inputs ``specs``.

    ``limit`` keeps the first ``limit`` samples. Raises :class:`ForgeError` for a
    missing path, an empty directory, a file that is not ``.npy``/``.npz``, or a
    layout that does not fit the model's inputs. Shapes and dtypes are checked
    by calibration, sample by sample.
    """
    if limit is not None and limit < 1:
        raise ForgeError(f"--max-samples must be at least 1; given {limit}")
    path = Path(path_text)
    names = [spec.name for spec in specs]
    if not path.exists():
        raise ForgeError(f"--calib: {path_text!r} does not exist")
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if not p.name.startswith(".")), key=lambda p: _natural_key(p.name))
        if not files:
            raise ForgeError(f"--calib: the directory {path_text!r} is empty; put one .npy or .npz file per sample "
                             "in it")
        others = [p for p in files if p.is_dir() or p.suffix.lower() not in SUFFIXES]
        if others:
            raise ForgeError(f"--calib: {str(others[0])!r} is not a .npy or .npz file; the directory {path_text!r} "
                             "must hold one .npy or .npz file per sample")
        if len(names) != 1 and any(p.suffix.lower() == ".npy" for p in files):
            raise ForgeError(f"--calib: the model has {len(names)} inputs ({_listing(names)}) and a .npy file holds "
                             "one array: save each sample as an .npz keyed by input name (np.savez(path, **inputs))")
        return _FileSamples(path, files, specs, limit)
    if path.suffix.lower() != ".npz":
        hint = (" (a single .npy file is not taken: put one .npy file per sample in a directory, or the stacked "
                "samples in an .npz keyed by input name)" if path.suffix.lower() == ".npy" else "")
        raise ForgeError(f"--calib: {path_text!r} is not a directory or an .npz file{hint}")
    keys = _archive_keys(path)
    if not keys:
        raise ForgeError(f"--calib: the archive {path_text!r} holds no arrays")
    if sorted(keys) == sorted(names):
        return _stacked(path, specs, limit)
    if len(names) == 1:
        return _ArchiveSamples(path, keys, limit)
    raise ForgeError(f"--calib: the keys of {path_text!r} ({_listing(keys)}) are not the model's input names "
                     f"({_listing(names)}): stack the samples along each array's leading axis, keyed by input name")
