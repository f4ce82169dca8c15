"""The tuning database directory: MetaSchedule's JSON files, and applying them at compile time."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import tvm
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms

from forge_core.errors import FileAccessError, ForgeError
from forge_core.files import check_creatable, file_error, naming
from forge_core.schedules.apply import RULE_ATTR, SCHEDULED_ATTR

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
TUNED_RULE = "Tuned"


def check_database_exists(directory: Path) -> None:
    """Raise unless ``directory`` holds a tuning database (what ``compile(tuning_database=...)`` reads)."""
    if not (directory / RECORDS).is_file():
        if not directory.exists():
            raise FileAccessError(errno.ENOENT, "no such directory, so it holds no tuning database (run "
                                  "IRModule.tune() or `forge tune` first)", str(directory), "read")
        if not directory.is_dir():
            raise FileAccessError(errno.ENOTDIR, "it is not a directory, so it holds no tuning database (the "
                                  "database is the directory IRModule.tune() wrote)", str(directory), "read")
        raise ForgeError(f"{str(directory)!r} holds no tuning database ({RECORDS}); run IRModule.tune() first")
    for name in (WORKLOADS, RECORDS):
        if (directory / name).exists() and not os.access(directory / name, os.R_OK):
            raise file_error(errno.EACCES, directory / name, "read")


def open_database(directory: Path, create: bool) -> ms.database.JSONDatabase:
    if not create:
        check_database_exists(directory)
    with naming(directory):
        directory.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(
        path_workload=str(directory / WORKLOADS), path_tuning_record=str(directory / RECORDS), allow_missing=create
    )


def check_database_directory(directory: Path) -> None:
    """Raise :class:`FileAccessError` before tuning when ``directory`` cannot hold (or be) the database."""
    if os.path.lexists(directory) and not directory.is_dir():
        raise FileAccessError(errno.EEXIST, "it exists and is not a directory", str(directory))
    check_creatable(directory)  # the extended database is renamed into place in the parent
    for name in (WORKLOADS, RECORDS):
        if (directory / name).exists() and not os.access(directory / name, os.R_OK):
            raise file_error(errno.EACCES, directory / name, "read")


def check_written(directory: Path, expected: int, shown: Path) -> None:
    """Read the database in ``directory`` back: every one of the ``expected`` records must be there.

    TVM appends each record with a C++ stream whose write errors go unchecked
    (a full disk loses records, or leaves half a line); this catches that
    before the database is renamed into place.
    """
    try:
        found = len(ms.database.JSONDatabase(path_workload=str(directory / WORKLOADS),
                                             path_tuning_record=str(directory / RECORDS), allow_missing=False))
    except Exception:  # noqa: BLE001 - TVM's parser fails on a truncated line with its own errors
        found = None
    if found != expected:
        got = "is truncated" if found is None else f"holds {found} of {expected} tuning records"
        raise FileAccessError(None, f"the tuning database read back {got}: a write failed (is the disk full?)",
                              str(shown))


def apply_database(mod: tvm.IRModule, target: tvm.target.Target, directory: Path) -> tvm.IRModule:
    """Replace every PrimFunc the database has a record for by its best tuned schedule.

    No trial runs. Functions it replaced are marked scheduled (rule ``Tuned``),
    so the default rules leave them alone.
    """
    from forge_core.tuning.intrinsics import cpu_tensor_intrinsics

    database = open_database(directory, create=False)
    before = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    with target, database, cpu_tensor_intrinsics(target):  # records name TVM's intrinsics, made correct there
        applied = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    result = tvm.IRModule(dict(applied.functions), attrs=applied.attrs)
    for gv, func in applied.functions.items():
        if isinstance(func, tirx.PrimFunc) and gv in before and not func.same_as(before[gv]):
            result[gv] = func.with_attr(SCHEDULED_ATTR, True).with_attr(RULE_ATTR, TUNED_RULE)
    return result
