"""The tuning database directory: MetaSchedule's JSON files, and applying them at compile time."""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms

from forge_core.errors import ForgeError
from forge_core.schedules.apply import RULE_ATTR, SCHEDULED_ATTR

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
TUNED_RULE = "Tuned"


def open_database(directory: Path, create: bool) -> ms.database.JSONDatabase:
    if not create and not (directory / RECORDS).is_file():
        raise ForgeError(f"{str(directory)!r} holds no tuning database ({RECORDS}); run IRModule.tune() first")
    directory.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(
        path_workload=str(directory / WORKLOADS), path_tuning_record=str(directory / RECORDS), allow_missing=create
    )


def apply_database(mod: tvm.IRModule, target: tvm.target.Target, directory: Path) -> tvm.IRModule:
    """Replace every PrimFunc the database has a record for by its best tuned schedule.

    No trial runs. Functions it replaced are marked scheduled (rule ``Tuned``),
    so the default rules leave them alone.
    """
    database = open_database(directory, create=False)
    before = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    with target, database:
        applied = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    result = tvm.IRModule(dict(applied.functions), attrs=applied.attrs)
    for gv, func in applied.functions.items():
        if isinstance(func, tirx.PrimFunc) and gv in before and not func.same_as(before[gv]):
            result[gv] = func.with_attr(SCHEDULED_ATTR, True).with_attr(RULE_ATTR, TUNED_RULE)
    return result
