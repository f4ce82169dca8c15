"""``IRModule.tune``: MetaSchedule over the model's fused operators, within a trial and a time budget.

The database starts with Forge's default schedule of every task, measured by
the same runner as the tuned candidates, so the best record of a task is never
slower than what compiling without tuning gives.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms

from forge_core.compiler.options import CompileOptions
from forge_core.compiler.pipeline import lower_to_tir, prepare_graph
from forge_core.errors import ForgeError, OptionError
from forge_core.ir import weights
from forge_core.schedules.apply import SCHEDULED_ATTR, default_rules, first_schedule
from forge_core.schedules.blocks import is_static
from forge_core.runtime.cpu_features import host_cpu_model, host_machine, missing_features
from forge_core.targets.isa import required_cpu_features
from forge_core.targets.parsing import resolve_target
from forge_core.errors import FileAccessError
from forge_core.files import StagedDirectory
from forge_core.tuning.database import check_database_directory, check_written, open_database
from forge_core.tuning.intrinsics import cpu_tensor_intrinsics
from forge_core.tuning.builder import make_builder
from forge_core.remote.devices import RemoteDevices
from forge_core.tuning.runners import device_count, make_runner

if TYPE_CHECKING:
    from forge_core.ir.parts import ModuleParts

logger = logging.getLogger("forge.tune")

Progress = Callable[[int, int, str], None]
"""``progress(trials_done, trials_total, message)``"""


@dataclass
class TaskResult:
    name: str
    weight: int
    default_ms: float | None
    best_ms: float | None


@dataclass
class TuningReport:
    """What a tuning session did."""

    database: Path
    target: str
    trials: int
    seconds: float
    stopped_by_time: bool
    tasks: list[TaskResult] = field(default_factory=list)
    records: int = 0
    """Tuning records the database holds after the session."""
    failed: int = 0
    """Candidates whose build or measurement failed (a device that disconnected, a timeout)."""
    first_failure: str | None = None
    """The first of those failures' messages."""
    devices: str = "this machine"
    """Where the candidates were measured."""

    @property
    def estimated_speedup(self) -> float | None:
        """Weighted default time over weighted best time, over the tasks measured both ways."""
        pairs = [(t.weight * t.default_ms, t.weight * t.best_ms) for t in self.tasks if t.default_ms and t.best_ms]
        if not pairs:
            return None
        return sum(d for d, _ in pairs) / sum(b for _, b in pairs)

    def summary(self) -> str:
        speedup = self.estimated_speedup
        lines = [
            f"Tuned {len(self.tasks)} tasks with {self.trials} trials in {self.seconds:.0f} s on {self.devices}"
            f"{' (time budget reached)' if self.stopped_by_time else ''}; database {self.database}",
            f"{self.failed} candidates failed; the first: {self.first_failure}" if self.failed else "",
            f"Estimated operator-time speedup over the default schedules: {speedup:.2f}x" if speedup else "",
        ]
        for task in self.tasks:
            default = f"{task.default_ms:.3f} ms" if task.default_ms else "-"
            best = f"{task.best_ms:.3f} ms" if task.best_ms else "-"
            lines.append(f"  {task.name} x{task.weight}: default {default}, best {best}")
        return "\n".join(line for line in lines if line)


class _BudgetReached(Exception):
    """Raised inside MetaSchedule's loop to end it when the time budget is spent."""


@derived_object
class _BudgetAndProgress(ms.measure_callback.PyMeasureCallback):
    """Counts trials for the progress bar and ends tuning when the time budget is spent.

    Runs after MetaSchedule's own callbacks, so the batch just measured is in
    the database when the exception ends the loop; at the deadline it first
    collects the batches of the other tasks still being measured. (Terminating
    tasks from here instead trips a check in TVM's task scheduler.)
    """

    def __init__(self, deadline: float | None, total: int, progress: Progress | None) -> None:
        super().__init__()
        self.deadline = deadline
        self.total = total
        self.progress = progress
        self.trials = 0
        self.stopped = False
        self.failed = 0
        self.first_failure: str | None = None
        self.interrupted = False  # Ctrl-C inside this callback: TVM's FFI hands it back as a RuntimeError

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
              runner_results: Any) -> None:
        self.trials += len(runner_results)
        for built, result in zip(builder_results, runner_results):
            error = built.error_msg or result.error_msg
            if error:
                self.failed += 1
                if self.first_failure is None:
                    self.first_failure = _first_line(str(error))
        if self.progress is not None:
            try:
                self.progress(self.trials, self.total, f"task {task_id}")
            except KeyboardInterrupt:
                self.interrupted = True
                raise
        if self.deadline is not None and time.monotonic() > self.deadline and not self.stopped:
            self.stopped = True
            # MetaSchedule builds every task's batch before it collects the first one: with
            # many small tasks, most measured candidates still wait. Collect them (their
            # records reach the database through the default callbacks; this one, called
            # again, only counts), then end the search.
            for other, record in enumerate(task_scheduler.tasks_):
                if other != task_id and not record.is_terminated and record.measure_candidates is not None:
                    task_scheduler.join_running_task(other)
            raise _BudgetReached(f"forge: tuning time budget reached after {self.trials} trials")


def _first_line(error: str) -> str:
    """A runner's or builder's error in one line: its first line, and its last that names an error."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return error[:300]
    named = [line for line in lines[1:] if "Error" in line or "error" in line]
    return (lines[0] if not named else f"{lines[0].rstrip(':')}: {named[-1]}")[:300]


def _run_secs(result: Any) -> float | None:
    secs = [float(s) for s in (result.run_secs or [])]
    return sum(secs) / len(secs) if secs and result.error_msg is None else None


def _replays(func: tirx.PrimFunc, sch: s_tir.Schedule) -> bool:
    """Whether ``sch``'s trace, replayed on ``func``, gives ``sch``'s function.

    A rule that rebuilds the function (padded pixels or channels, a transposed convolution's gather) returns a
    schedule of the rebuilt function: its trace, committed as the default's record, replays on the task's
    function to something else, and a tuned record measured against nothing replaced the default at compile
    (a 1x1 convolution on a 7x7 map took 7.4 ms tuned, 1.1 ms by its rule).
    """
    replayed = s_tir.Schedule(func)
    try:
        sch.trace.apply_to_schedule(replayed, remove_postproc=False)
    except Exception:  # noqa: BLE001 - the trace names blocks the function does not have
        return False
    return bool(tvm_ffi.structural_equal(replayed.mod["main"], sch.mod["main"]))


def _seed_defaults(tasks: list[Any], target: tvm.target.Target, database: Any, builder: Any,
                   runner: Any) -> tuple[dict[str, float], list[str], dict[str, str]]:
    """Measure Forge's default schedule of each task and commit it to ``database``: the milliseconds of each
    task measured, the tasks whose default cannot be a record (its trace does not replay, see
    :func:`_replays`), which are not to be tuned, and the error of each default that failed to build or run.

    A default that fails is measured once more: a build or run that timed out on a loaded machine left its
    task without a record, and the search, with nothing to start from, gave that task no candidate at all.
    """
    rules = default_rules()
    schedules = {}
    rebuilt = []
    with target:
        for task in tasks:
            func = task.dispatched[0]["main"]
            chosen = first_schedule(func, target, rules, task.task_name)
            if chosen is None:
                continue
            if not _replays(func, chosen[1]):
                rebuilt.append(task.task_name)
                continue
            schedules[task.task_name] = (task, chosen[1])
    measured: dict[str, float] = {}
    errors: dict[str, str] = {}
    for _ in range(2):
        pending = [name for name in schedules if name not in measured]
        if not pending:
            break
        errors = _measure_defaults({name: schedules[name] for name in pending}, target, database, builder,
                                   runner, measured)
    for name, error in errors.items():
        logger.warning("tuning: the default schedule of task %s failed to build or run twice, the last time "
                       "with: %s; the search starts that task from nothing", name, error)
    return measured, rebuilt, errors


def _measure_defaults(schedules: dict[str, tuple[Any, Any]], target: tvm.target.Target, database: Any,
                      builder: Any, runner: Any, measured: dict[str, float]) -> dict[str, str]:
    """Build and run each default schedule, commit each measured one's record and its milliseconds to
    ``measured``; returns the error of each that failed."""
    names = list(schedules)
    built = builder.build([ms.builder.BuilderInput(schedules[name][1].mod, target) for name in names])
    errors: dict[str, str] = {}
    runner_inputs, ready = [], []
    for name, result in zip(names, built):
        if result.error_msg is not None:
            errors[name] = _first_line(str(result.error_msg))
            continue
        args_info = ms.arg_info.ArgInfo.from_entry_func(schedules[name][1].mod, remove_preproc=True)
        runner_inputs.append(ms.runner.RunnerInput(result.artifact_path, "cpu", args_info))
        ready.append((name, args_info))
    for (name, args_info), future in zip(ready, runner.run(runner_inputs) if runner_inputs else []):
        result = future.result()
        secs = _run_secs(result)
        if secs is None:
            errors[name] = _first_line(str(result.error_msg or "no time measured"))
            continue
        task, sch = schedules[name]
        workload = database.commit_workload(task.dispatched[0])
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [secs], target, args_info))
        measured[name] = secs * 1000
    return errors


def search_strategy(trials_per_task: int) -> Any:
    """MetaSchedule's evolutionary search, its population sized to the trials a task can get.

    TVM's default evolves 512 schedules a round, scoring each with the cost
    model, whatever the budget: with a few trials a task, that search, not
    building or measuring, took most of the session (measured: 4 trials of a
    one-matmul model spent 30 s searching). Forge keeps 512 from 32 trials a
    task up, and 16 schedules a trial below (at least 64).
    """
    population = int(min(512, max(64, 16 * trials_per_task)))
    return ms.search_strategy.EvolutionarySearch(population_size=population,
                                                 init_min_unmeasured=min(50, population // 4))


# Packages MetaSchedule's search imports without TVM declaring them: the extra ``tune``
_SEARCH_PACKAGES = ("psutil", "xgboost", "cloudpickle", "tornado")


def _require_search_packages() -> None:
    """Fail before any work when a package of the search is missing, naming the extra to install."""
    import importlib.util

    missing = [name for name in _SEARCH_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ForgeError(
            f"Tuning needs {', '.join(missing)} (MetaSchedule's search): pip install 'forge-core[tune]'"
        )


def tune_module(
    ir: ModuleParts,
    target: Any = "llvm",
    *,
    work_dir: str | os.PathLike[str] = "./tuning_database",
    trials: int = 2000,
    time_budget: float | None = None,
    trials_per_task: int | None = None,
    options: CompileOptions | None = None,
    progress: Progress | None = None,
    rpc: RemoteDevices | dict[str, Any] | None = None,
) -> TuningReport:
    """Tune ``ir``'s operators for ``target``; see :meth:`forge.IRModule.tune`."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise OptionError(f"trials must be a non-negative integer, given {trials!r}")
    if time_budget is not None and time_budget <= 0:
        raise OptionError(f"time_budget must be a positive number of seconds, given {time_budget!r}")
    _require_search_packages()
    tvm_target = resolve_target(target)
    if tvm_target.kind.name != "llvm":
        raise ForgeError(f"Forge tunes CPU (llvm) targets; {tvm_target.kind.name} is not supported")
    if not tvm_target.attrs.get("num-cores"):
        raise ForgeError(f"Tuning needs the target's core count: add -num-cores=N to {target!r}")
    options = options or CompileOptions.validate()
    remote = RemoteDevices.of(rpc) if rpc is not None else None
    if remote is None:
        _check_measurable_here(tvm_target, target)
    started = time.monotonic()
    directory = Path(work_dir)
    check_database_directory(directory)
    workers = device_count(remote) if remote is not None else 1  # an unreachable tracker fails here, at once
    # The session writes into a copy of the database beside it, each record as it is measured; the copy
    # is read back and renamed into place. A write that failed (a full disk) leaves the old database as it
    # was, never a part; any other failure (an interrupt, a tracker gone) keeps what was measured.
    stage = StagedDirectory(directory, replace=True, seed=True)
    scratch = tempfile.mkdtemp(prefix="forge-tune-")  # the candidates built and measured
    try:
        with stage as staged:
            try:
                report = _tune_into(ir, tvm_target, staged, trials=trials, time_budget=time_budget,
                                    trials_per_task=trials_per_task, options=options, progress=progress,
                                    started=started, scratch=scratch, remote=remote, workers=workers)
            except BaseException as exc:
                _keep_measured(stage, staged, directory, exc)
                raise
            check_written(staged, report.records, shown=directory)
            stage.commit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.database = directory
    return report


def _check_measurable_here(tvm_target: Any, given: Any) -> None:
    """Without ``rpc``, candidates run on this CPU: refuse a target whose code it cannot execute (SIGILL)."""
    required = required_cpu_features(tvm_target)
    if required is not None and required["arch"] != host_machine():
        raise ForgeError(f"Tuning for {given!r} measures candidates on a {required['arch']} CPU; this machine is "
                         f"{host_machine()}. Tune on the board through rpc= (forge tune --rpc), or on such a machine.")
    missing = missing_features(required["flags"]) if required is not None else None
    if missing:
        raise ForgeError(f"Tuning for {given!r} measures candidates on this CPU ({host_cpu_model()}), which lacks "
                         f"{', '.join(missing)}: they would stop at the first such instruction. Tune on a machine "
                         "of that class (or a board through rpc=), or tune for 'llvm', this CPU.")


def _keep_measured(stage: StagedDirectory, staged: Path, directory: Path, exc: BaseException) -> None:
    """After a failure that is not a failed write, move the staged database (old records and new) into place.

    Only when it reads back whole: each record is one line, appended as it is measured.
    """
    if isinstance(exc, OSError | MemoryError):
        return
    try:
        found = len(open_database(staged, create=False))
    except Exception:  # noqa: BLE001 - TVM's parser fails on a truncated line with its own errors
        return
    try:
        stage.commit()
    except FileAccessError:
        return
    logger.warning("tuning stopped (%s); the database %s keeps the %d records measured before",
                   type(exc).__name__, directory, found)


def _search(extracted: list[Any], directory: Path, *, trials: int, trials_per_task: int | None, builder: Any,
            runner: Any, database: Any, callback: _BudgetAndProgress) -> None:
    """MetaSchedule's search over the tasks, within the budget ``callback`` checks."""
    with cpu_tensor_intrinsics(extracted[0].target if len({str(t.target) for t in extracted}) == 1 else None):
        ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
        # TVM rebuilds this logger's configuration by handler name, and fails on a
        # handler that has none (test runners and applications attach such handlers).
        unnamed = [h for h in ms_logger.handlers if h.get_name() is None]
        for handler in unnamed:
            ms_logger.removeHandler(handler)
        try:
            contexts, task_weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                extracted, str(directory / "logs"), seed=0,
                strategy=search_strategy(trials_per_task or -(-trials // len(extracted))))
        finally:
            for handler in unnamed:
                ms_logger.addHandler(handler)
        level = ms_logger.level
        ms_logger.setLevel(logging.WARNING)
        try:
            ms.tune_tasks(
                tasks=contexts,
                task_weights=task_weights,
                work_dir=str(directory / "logs"),
                max_trials_global=trials,
                max_trials_per_task=trials_per_task,
                num_trials_per_iter=min(32, max(1, trials)),  # a small batch: the budget is checked per batch
                builder=builder,
                runner=runner,
                database=database,
                measure_callbacks=[*ms.MeasureCallback.create("default"), callback],
            )
        except Exception:  # the budget's exception arrives wrapped by TVM's FFI
            if callback.interrupted:
                raise KeyboardInterrupt from None
            if not callback.stopped:
                raise
            logger.info("time budget reached after %d trials", callback.trials)
        finally:
            ms_logger.setLevel(level)


def _tune_into(ir: ModuleParts, tvm_target: tvm.target.Target, directory: Path, *, trials: int,
               time_budget: float | None, trials_per_task: int | None, options: CompileOptions,
               progress: Progress | None, started: float, scratch: str, remote: RemoteDevices | None,
               workers: int) -> TuningReport:
    database = open_database(directory, create=True)

    mod = prepare_graph(weights.bind_params(ir.mod, ir.params), options, tvm_target)
    mod = lower_to_tir(mod, tvm_target, options.opt_level)
    # A function its emitter already scheduled (tirx.is_scheduled: a hand-written kernel) is not a task.
    extracted = [t for t in ms.relax_integration.extract_tasks(mod, tvm_target)
                 if SCHEDULED_ATTR not in (t.dispatched[0]["main"].attrs or {}) and is_static(t.dispatched[0]["main"])]

    builder = make_builder(tvm_target, scratch, remote is not None)
    runner = make_runner(remote, workers)
    if progress is not None:
        progress(0, trials, "measuring the default schedules")
    defaults, kept, default_errors = _seed_defaults(extracted, tvm_target, database, builder, runner)
    if kept:
        logger.info("%d tasks keep Forge's default schedule (its rule rebuilds the function, which a MetaSchedule "
                    "trace cannot express): %s", len(kept), ", ".join(kept))
        extracted = [t for t in extracted if t.task_name not in kept]
    logger.info("%d tunable tasks", len(extracted))

    callback = _BudgetAndProgress(started + time_budget if time_budget else None, trials, progress)
    callback.failed = len(default_errors)
    callback.first_failure = next(iter(default_errors.values()), None)
    if trials > 0 and extracted:
        _search(extracted, directory, trials=trials, trials_per_task=trials_per_task, builder=builder,
                runner=runner, database=database, callback=callback)

    del builder, runner  # their worker processes would otherwise compete with what runs next
    gc.collect()
    results = []
    for task in extracted:
        workload_mod = task.dispatched[0]
        best = None
        if database.has_workload(workload_mod):
            top = database.get_top_k(database.commit_workload(workload_mod), 1)
            if top:
                best = _run_secs(ms.runner.RunnerResult(top[0].run_secs, None))
        results.append(TaskResult(task.task_name, int(task.weight), defaults.get(task.task_name),
                                  best * 1000 if best else None))
    report = TuningReport(directory, str(tvm_target), callback.trials, time.monotonic() - started,
                          callback.stopped, results)
    report.records = len(database)
    report.failed, report.first_failure = callback.failed, callback.first_failure
    if remote is not None:
        report.devices = f"{workers} device{'s' if workers > 1 else ''} of key {remote.key!r} ({remote.tracker})"
    return report
