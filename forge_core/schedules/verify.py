"""Verification mode: every scheduled PrimFunc is checked against its unscheduled form.

A schedule rewrites a PrimFunc's loops; it must not change what the function
computes. A rule whose write-back covers more than its tile computed, or whose
padding stage misses a border, gives wrong numbers with no error. In
verification mode the compiler builds each function a schedule rule or a
tuning record rewrote twice, as scheduled and as legalized (plain loop nests,
the reference), runs both on the same random inputs and raises
:class:`ScheduleVerificationError` naming the function, the rule and the
largest difference at the first mismatch.

It is on when the environment variable ``FORGE_VERIFY`` is ``1`` (the test
suite sets it) or inside :func:`verifying` (``forge compile --verify``).

Inputs: floats are standard normal; 8- and 16-bit integers uniform over their
range; wider integers, which index (gather, take) or carry shapes, are 0 so that
no index leaves its tensor. A function that converts floats to integers (an index
or a size computed in float: a resize's) runs on twelve draws of floats from 0
to 100, 16, 8 and 4 (:data:`CASTABLE_RANGES`). Every buffer the function writes starts as NaN (or
a sentinel) in the scheduled run and as 0 in the reference run, so an element
the schedule forgets to write is a mismatch too. A function is compared on the
host CPU: the target itself when the host runs it, the target less the
extensions this CPU lacks when it has not all of them (``-mcpu=znver4`` on an
AVX2 machine), generic LLVM for a cross target (the schedule's loop structure
is what is checked; a function that calls the target's own instructions,
VNNI's or Arm's ``sdot``, is then not verified, and the log says so). Both
forms are built into one library by LLVM at ``-O1`` (:data:`LLVM_OPT_LEVEL`):
the same code generator on both sides, so the schedule is what differs. A function scheduled per
batch item (``batch_loop.py``) is verified with its batch bound to :data:`VERIFIED_BATCH`; one scheduled
by row blocks (``row_blocks.py``) at sizes that take each of its paths (:func:`verified_rows`); any other
function with symbolic dims (a rule over them, an elementwise kernel of a model with dynamic dims) with every
dim, and every dim passed by value, bound to :data:`VERIFIED_DIMS`. GPU targets' functions, and functions whose
dims cannot be bound (a dim computed from a variable no parameter defines), are not verified, and the log says
so.
With ``FORGE_VERIFY_CACHE`` set to a directory, a function verified once is remembered there
across processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block

from forge_core.errors import CompilationError
from forge_core.schedules.batch_loop import BATCH_LOOP_ATTR, batch_bound
from forge_core.schedules.row_blocks import BLOCK_ROWS, ROW_BLOCKS_ATTR, bind_rows, dim_names, scalar_params

logger = logging.getLogger("forge.verify")

ENV_VAR = "FORGE_VERIFY"
# LLVM's level for the two forms verification builds: -O1 without the loop and SLP vectorizers, which took
# half of verification's time (an int8 BERT's compile: 90 s -> 56 s) and are not what is being checked.
LLVM_OPT_LEVEL = 1
# Largest difference allowed, relative to the largest magnitude in the reference output.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
_SEED = 20261123
_forced = 0
# (hash of the unscheduled function, hash of the scheduled one, target) already checked in this process.
_verified: set[tuple[int, int, str]] = set()
CACHE_ENV_VAR = "FORGE_VERIFY_CACHE"
"""A directory where verified functions are remembered across processes (the test suite's workers and the
CLI subprocesses it starts share one); unset, each process checks each function once."""
# The failure raised inside TVM's pass infrastructure, which re-raises it as another type.
_failure = threading.local()


class ScheduleVerificationError(CompilationError):
    """A scheduled function computes something other than its unscheduled form."""

    def __init__(self, function: str, rule: str, output: str, max_error: float, scale: float, tolerance: float):
        self.function, self.rule, self.output = function, rule, output
        self.max_error, self.scale, self.tolerance = max_error, scale, tolerance
        super().__init__(
            f"Schedule verification failed: function {function!r} as scheduled by {rule} differs from its "
            f"unscheduled form in output {output!r}: max |error| {max_error:.6g}, max |reference| {scale:.6g}, "
            f"allowed {tolerance:.3g}. This is a bug in the schedule rule; compile without it "
            f"(opt_level or target) and report it."
        )


def _fail(error: ScheduleVerificationError) -> None:
    _failure.error = error
    raise error


def take_failure() -> ScheduleVerificationError | None:
    """The verification error raised in this thread since the last call, if any (for the compiler to re-raise)."""
    error = getattr(_failure, "error", None)
    _failure.error = None
    return error


def verification_enabled() -> bool:
    """Whether compilation checks every scheduled function (``FORGE_VERIFY=1`` or :func:`verifying`)."""
    return _forced > 0 or os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def verifying() -> Iterator[None]:
    """Turn verification mode on inside the ``with`` block, whatever ``FORGE_VERIFY`` says."""
    global _forced
    _forced += 1
    try:
        yield
    finally:
        _forced -= 1


@dataclass
class VerificationReport:
    """What one verification pass checked: function names by outcome."""

    verified: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class _Analysis:
    """What the checker needs to know about an unscheduled function's blocks."""

    written: set[int] = field(default_factory=set)  # handles of the buffers a block writes
    dtypes: set[str] = field(default_factory=set)  # of every buffer a block touches
    divides_integers: bool = False  # an integer Div/Mod/FloorDiv/FloorMod by loaded integers
    float_addressed: bool = False  # a load whose index is computed from loaded floats (RoiAlign, grid sampling)
    casts_float_to_int: bool = False  # a float converted to an integer type (a quantize's last step)
    computed_index: bool = False  # a load whose index computes with loaded values, not just a loaded index


_DIVISIONS = (tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod)
_LOAD = tvm.ir.expr.TensorLoad  # what tirx.BufferLoad builds
_CALL = tvm.ir.expr.Call  # what a TIR call (T.call_llvm_pure_intrin, T.reinterpret...) builds
# A direct call of an LLVM intrinsic: how tensorized kernels use the target's own instructions (Arm's sdot).
_LLVM_PURE_INTRIN = tvm.ir.Op.get("tirx.call_llvm_pure_intrin")
_CHILDREN = ("a", "b", "value", "condition", "true_value", "false_value", "args", "indices", "body", "vectors",
             "iter_values", "predicate", "block", "seq", "then_case", "else_case", "init", "min", "extent",
             "alloc_buffers", "match_buffers")


def _loads(expr: object, which: Callable[[object], bool] = lambda load: True,
           loaded_vars: frozenset[int] | set[int] = frozenset()) -> bool:
    """Whether ``expr`` loads from a buffer (a load ``which`` accepts) or reads a variable in ``loaded_vars``."""
    pending = [expr]
    while pending:
        node = pending.pop()
        if (isinstance(node, _LOAD) and which(node)) or (
                isinstance(node, tvm.ir.expr.Var) and node.__chandle__() in loaded_vars):
            return True
        pending.extend(_children(node))
    return False


def _children(node: object) -> list[object]:
    found: list[object] = []
    for name in _CHILDREN:
        child = getattr(node, name, None)
        if child is None or isinstance(child, (str, int, float)):
            continue
        if isinstance(child, (tvm_ffi.Array, list, tuple)):
            found.extend(child)
        elif isinstance(child, (tvm.ir.expr.Expr, tirx.Stmt)):
            found.append(child)
    return found


def _strip_casts(expr: object) -> object:
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr


def _calls_llvm_intrinsic(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` calls an LLVM intrinsic directly (``T.call_llvm_pure_intrin``).

    A walk of the function's calls that stops at the first such call, not a
    search of its printed script (slow on large functions).
    """
    def stop_at_intrinsic(call: tvm.ir.expr.Call) -> tvm_ffi.VisitInterrupt | None:
        return tvm_ffi.VisitInterrupt(call) if call.op.same_as(_LLVM_PURE_INTRIN) else None

    return tvm_ffi.structural_walk(func, (_CALL, stop_at_intrinsic), order="pre") is not None


def _analyse(func: tirx.PrimFunc) -> _Analysis:
    """Walk the blocks of the unscheduled ``func`` (all its computation is in blocks)."""
    sch = s_tir.Schedule(func)
    analysis = _Analysis()
    pending_blocks = [get_root_block(sch)]
    while pending_blocks:
        block = pending_blocks.pop()
        stmt = sch.get(block)
        analysis.written.update(region.source.__chandle__() for region in stmt.writes)
        analysis.dtypes.update(str(region.source.dtype) for region in (*stmt.reads, *stmt.writes))
        pending_blocks.extend(sch.get_child_blocks(block))
    # The whole body at once: block bindings (iter_values) compute indices too. Variables bound to loaded
    # values (Let) count as loads.
    nodes: list[object] = [func.body]
    everything: list[object] = []
    loaded_vars: set[int] = set()
    while nodes:
        node = nodes.pop()
        everything.append(node)
        if isinstance(node, (tirx.Let, tirx.LetStmt)) and _loads(node.value):
            loaded_vars.add(node.var.__chandle__())
        nodes.extend(_children(node))
    for node in everything:
        if isinstance(node, tirx.Cast) and "int" in str(node.ty) and "float" in str(getattr(node.value, "ty", "")):
            analysis.casts_float_to_int = True
        if isinstance(node, _DIVISIONS) and "int" in str(node.ty) and _loads(node.b, loaded_vars=loaded_vars):
            analysis.divides_integers = True
        if isinstance(node, _LOAD):
            for index in node.indices:
                if not _loads(index, loaded_vars=loaded_vars):
                    continue
                if _loads(index, lambda load: "float" in str(getattr(load, "ty", ""))):
                    analysis.float_addressed = True
                if not isinstance(_strip_casts(index), _LOAD):
                    # An index computed from loaded values (Tile's floormod by its repeats): 0 is no safe input.
                    analysis.computed_index = True
    return analysis


def _params(func: tirx.PrimFunc, written: set[int]) -> list[tuple[str, tuple[int, ...], str, bool]] | None:
    """(name, shape, dtype, written) of each buffer parameter; None when a shape is symbolic or a param is not a buffer.

    ``written`` holds the handles of the buffers the unscheduled function writes; a scheduled function has the
    same parameters, so the same set serves both.
    """
    result = []
    for param in func.params:
        if not isinstance(param, tirx.Buffer):
            return None
        if not all(isinstance(d, (int, tirx.IntImm)) for d in param.shape):
            return None
        result.append((str(param.name), tuple(int(d) for d in param.shape), str(param.dtype), param.__chandle__() in written))
    return result


CASTABLE_RANGES = (100.0, 16.0, 8.0, 4.0) * 3
"""The draws of a function that converts floats to integers: floats from 0 to each bound, every one of which
every integer type holds. Such a function computes indices or sizes (a resize's source pixel, clamped to its
input's size), and the clamp takes most elements: a scheduled resize index computing with a wrong size
(SLANet's, with a batch item's 1 instead of its 3) matched its reference on 0 to 100 and on one draw from 0 to 4,
and differs on 8% of draws from 0 to 100 and about 30% of those from 0 to 16, 8 or 4 (3 elements). Twelve
draws miss it about once in 30; a run of the built pair costs microseconds to a millisecond."""


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, castable: float | None = None) -> np.ndarray:
    """Random content of an input buffer; ``castable``: floats from 0 to that bound (every integer type holds
    them)."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        if castable:
            return rng.uniform(0.0, castable, shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    if info.bits <= 16:
        return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)
    return np.zeros(shape, dtype)  # indices and shapes: 0 is in range of any non-empty axis


def _fill(shape: tuple[int, ...], dtype: str, reference: bool) -> np.ndarray:
    """The starting content of a written buffer: 0 for the reference run, NaN (or a sentinel) for the other."""
    if reference:
        return np.zeros(shape, dtype)
    if np.dtype(dtype).kind == "f":
        return np.full(shape, np.nan, dtype)
    if np.dtype(dtype).kind == "b":
        return np.ones(shape, bool)
    return np.full(shape, np.iinfo(dtype).max // 3 + 7, dtype)


def _host_target(target: tvm.target.Target) -> tvm.target.Target:
    from forge_core.targets.isa import runnable_here

    host = tvm.target.Target.from_device(tvm.cpu())
    triple = str(target.attrs.get("mtriple", "") or "")
    if not triple or triple == str(host.attrs.get("mtriple", "") or ""):
        return runnable_here(target)  # the target, less the extensions this CPU lacks (AVX-512 on an AVX2 host)
    return tvm.target.Target({"kind": "llvm"})


def _build(original: tirx.PrimFunc, scheduled: tirx.PrimFunc, target: tvm.target.Target) -> tvm.runtime.Module:
    """Both forms in one library (``reference``, ``scheduled``), built by LLVM at :data:`LLVM_OPT_LEVEL`.

    One module and one JIT session: two cost about twice the per-module
    overhead that dominates small kernels. Both forms go through the same
    LLVM at the same level, so what differs between them is the schedule,
    which is what is checked; the artifact itself is built at LLVM's full
    level, and the test suite compares artifacts with their frameworks too.
    """
    config = {key: value for key, value in target.export().items() if not key.startswith("feature.")}
    config.pop("host", None)
    config["opt-level"] = LLVM_OPT_LEVEL
    return tvm.compile(tvm.IRModule({"reference": original.with_attr("global_symbol", "reference"),
                                     "scheduled": scheduled.with_attr("global_symbol", "scheduled")}),
                       target=tvm.target.Target(config))


def _call(library: tvm.runtime.Module, inputs: list[np.ndarray],
          params: list[tuple[str, tuple[int, ...], str, bool]], reference: bool) -> list[np.ndarray]:
    device = tvm.cpu()
    args = [tvm.runtime.tensor(_fill(shape, dtype, reference) if written else data, device)
            for (_, shape, dtype, written), data in zip(params, inputs)]
    library["reference" if reference else "scheduled"](*args)
    return [a.numpy() for a in args]


def verify_function(name: str, rule: str, original: tirx.PrimFunc, scheduled: tirx.PrimFunc,
                    target: tvm.target.Target) -> str | None:
    """Check ``scheduled`` against ``original`` on random inputs; None when done, else why it was skipped.

    Raises :class:`ScheduleVerificationError` at the first output that differs.
    """
    analysis = _analyse(original)
    params = _params(original, analysis.written)
    scheduled_params = _params(scheduled, set())
    if params is None or scheduled_params is None:
        return "symbolic shapes"
    if any(p[2] not in ("float16", "float32", "float64") and not p[2].startswith(("int", "uint", "bool"))
           for p in params):
        return "a buffer type numpy cannot hold"
    if [p[1:3] for p in params] != [p[1:3] for p in scheduled_params]:
        return "the schedule changed the function's signature"
    if analysis.float_addressed:
        # Random floats (RoiAlign's boxes) address anywhere, in range or not; 0 keeps only integer indices in range.
        return "it computes addresses from floating-point data"
    if analysis.computed_index:
        return "it computes addresses from loaded values"
    if analysis.divides_integers:
        # 0 traps (SIGFPE kills the process), and any other value may index out of range where the same
        # integers also shape an index (Tile's floormod, a gather): no input serves both.
        return "it divides by integers it loads"
    host = _host_target(target)
    if host is not target and _calls_llvm_intrinsic(scheduled):
        # The target's own instructions (Arm's sdot, AVX-512 VNNI on an AVX2 host): this host cannot run them.
        return "it calls instructions of the target that this host cannot run"
    key = (tvm_ffi.structural_hash(original, map_free_vars=True), tvm_ffi.structural_hash(scheduled, map_free_vars=True),
           str(host))
    if key in _verified or _remembered(key):
        return None
    # A function that computes in float16 inside (set_float16 casts) is held to float16's tolerance.
    tolerance = max((TOLERANCE.get(d, 0.0) for d in analysis.dtypes), default=0.0)
    rng = np.random.default_rng(_SEED)
    # A float outside the range of the integer type it is converted to is undefined in LLVM (fptoui of
    # -0.7 to uint8 is poison): scalar and vectorized code then differ, with no bug in either. A function
    # that converts floats to integers (at opt_level 0, a quantize's cast stands alone) gets floats that
    # every integer type holds.
    library = _build(original, scheduled, host)
    for bound in CASTABLE_RANGES if analysis.casts_float_to_int else (None,):
        inputs = [_random(rng, shape, dtype, bound) for _, shape, dtype, _ in params]
        expected = _call(library, inputs, params, reference=True)
        got = _call(library, inputs, params, reference=False)
        mismatch = _first_mismatch(params, expected, got, tolerance)
        if mismatch is not None:
            break
    if mismatch is None:
        _verified.add(key)
        _remember(key)
        return None
    # Before blaming the schedule, the reference runs again: an unscheduled function that reads memory it does
    # not own on these inputs (an input that shapes addresses in a way the checker does not see) gives other
    # results each run, and there is then no reference to compare with. (Run only on a mismatch: a second
    # reference run on every function cost a third of verification's run time.)
    again = _call(library, inputs, params, reference=True)
    if any(not np.array_equal(a, b, equal_nan=a.dtype.kind == "f") for a, b in zip(expected, again)):
        return "its unscheduled form gives different results on the same random inputs"
    buffer, error, scale, allowed = mismatch
    _fail(ScheduleVerificationError(name, rule, buffer, error, scale, allowed))
    return None  # unreachable: _fail raises


def _cache_file(key: tuple[int, int, str]) -> Path | None:
    directory = os.environ.get(CACHE_ENV_VAR, "").strip()
    if not directory:
        return None
    digest = hashlib.sha256(repr(key).encode()).hexdigest()
    return Path(directory) / digest


def _remembered(key: tuple[int, int, str]) -> bool:
    path = _cache_file(key)
    if path is None or not path.exists():
        return False
    _verified.add(key)
    return True


def _remember(key: tuple[int, int, str]) -> None:
    path = _cache_file(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:  # a cache that cannot be written costs time, never a compile
        logger.debug("verification cache %s not written: %s", path, exc)


def _first_mismatch(params: list[tuple[str, tuple[int, ...], str, bool]], expected: list[np.ndarray],
                    got: list[np.ndarray], tolerance: float) -> tuple[str, float, float, float] | None:
    """(buffer, max error, max |reference|, allowed) of the first written buffer beyond tolerance, else None."""
    for (buffer, _, dtype, written), want, have in zip(params, expected, got):
        if not written:
            continue
        want64, have64 = want.astype(np.float64), have.astype(np.float64)
        finite = np.isfinite(want64)
        scale = float(np.abs(want64[finite]).max(initial=0.0))
        # NaN where exactly one run has NaN, an infinity the other run lacks: unbounded error.
        if not np.array_equal(want64[~finite], have64[~finite], equal_nan=True) or np.isnan(have64[finite]).any():
            return buffer, float("inf"), scale, 0.0
        error = float(np.abs(want64[finite] - have64[finite]).max(initial=0.0))
        allowed = max(tolerance, TOLERANCE.get(dtype, 0.0)) * max(scale, 1.0)
        if error > allowed:
            return buffer, error, scale, allowed
    return None


VERIFIED_BATCH = 3
"""The batch a function scheduled per batch item is verified at (several items, each through its view)."""


def _with_batch(original: tirx.PrimFunc, scheduled: tirx.PrimFunc, batch: int) -> tuple[tirx.PrimFunc, tirx.PrimFunc]:
    """Both functions with their batched buffers' first dim bound to ``batch``."""
    return original.specialize(batch_bound(original, batch)), scheduled.specialize(batch_bound(scheduled, batch))


def verified_rows(names: list[str]) -> list[dict[str, int]]:
    """The sizes a function scheduled by row blocks is verified at: rows over a block and not a multiple of it
    (the last block overlaps the one before), and fewer rows than a block (computed in a zeroed scratch block).
    With two dims or more, the first is 3, so that the rows of several items follow each other."""
    over = {name: 1 for name in names}
    over[names[-1]] = BLOCK_ROWS // 2 - 1 if len(names) > 1 else BLOCK_ROWS + 5
    if len(names) > 1:
        over[names[0]] = 3
    under = {name: 1 for name in names}
    under[names[-1]] = 5
    return [over, under]


def _every_dim_bound(func: tirx.PrimFunc, sizes: dict[str, int]) -> tirx.PrimFunc:
    """``func`` with its dims and integer scalar parameters bound to ``sizes``, in rounds: a buffer whose dims are
    computed from scalar parameters (``(h - 1) // 32 + 1``) gets constant dims once they are bound, and its other
    dims are bound in the next round."""
    for _ in range(3):
        mapping = bind_rows(func, sizes, scalars=True)
        if not mapping:
            break
        func = func.specialize(mapping)
    return func


VERIFIED_DIMS = (19,)
"""The size every symbolic dim of a function (and every dim passed by value) is bound to for verification: 19,
over two vectors and no multiple of one, and over every row tile of a dynamic convolution and no multiple of one
(its clamped last tile). A row narrower than a tile runs TVM's guarded split, checked by the rules' tests (each
size verified costs a build of the function). Binding every dim to one size may leave a function whose dims are
related (an output of ``n - 1`` rows with a dim of its own) reading past a buffer: its unscheduled form then
gives different results on the same inputs, and it is reported as not verified."""


def verify_schedules(before: tvm.IRModule, after: tvm.IRModule, target: tvm.target.Target,
                     default_rule: str) -> VerificationReport:
    """Verify every PrimFunc of ``after`` that differs from the same function in ``before``.

    The rule named is the function's ``forge.schedule_rule`` attribute, else ``default_rule``.
    """
    from forge_core.schedules.apply import RULE_ATTR

    report = VerificationReport()
    if target.kind.name != "llvm":
        logger.info("verification runs CPU functions only; %s functions are not verified", target.kind.name)
        return report
    for gv, func in after.functions.items():
        if not isinstance(func, tirx.PrimFunc) or gv not in before.functions:
            continue
        original = before[gv]
        if not isinstance(original, tirx.PrimFunc) or func.same_as(original):
            continue
        rule = str(func.attrs[RULE_ATTR]) if func.attrs is not None and RULE_ATTR in func.attrs else default_rule
        name = gv.name_hint
        try:
            if func.attrs is not None and BATCH_LOOP_ATTR in func.attrs:
                # The loop over the batch and the item views are checked with the batch bound to a size.
                rule = f"{rule} per batch item"
                original, func = _with_batch(original, func, VERIFIED_BATCH)
            if func.attrs is not None and ROW_BLOCKS_ATTR in func.attrs:
                # The blocks of rows, the overlapping last one and the scratch block, each at a size that takes it.
                rule = f"{rule} by row blocks"
                skipped = None
                for sizes in verified_rows(str(func.attrs[ROW_BLOCKS_ATTR]).split(",")):
                    skipped = skipped or verify_function(name, rule, original.specialize(bind_rows(original, sizes)),
                                                         func.specialize(bind_rows(func, sizes)), target)
            elif dim_names(original) or scalar_params(original):
                # Symbolic dims, and dims passed by value, each bound to each size (a rule over symbolic dims, any
                # other function of a model with dynamic dims, a per-item function's other dims).
                skipped = None
                for size in VERIFIED_DIMS:
                    sizes = dict.fromkeys(dim_names(original) + [str(p.name) for p in scalar_params(original)], size)
                    skipped = skipped or verify_function(name, f"{rule} at {size}", _every_dim_bound(original, sizes),
                                                         _every_dim_bound(func, sizes), target)
            else:
                skipped = verify_function(name, rule, original, func, target)
        except ScheduleVerificationError:
            raise
        except Exception as exc:  # noqa: BLE001 - a function the checker cannot build or run: say so, never hide it
            skipped = f"could not be checked: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if skipped is None:
            report.verified.append(name)
        else:
            report.skipped[name] = skipped
            logger.info("not verified: %s (%s): %s", name, rule, skipped)
    if report.verified or report.skipped:
        logger.info("verified %d scheduled function(s) against their unscheduled form; %d not verifiable",
                    len(report.verified), len(report.skipped))
    return report
