"""Every ``forge`` subcommand given a bad path: exit 1, one ``forge: error:`` line, no partial output.

Each case runs a real ``forge`` subprocess in a workspace directory of its own
and compares the workspace before and after: every file (bytes and mode) and
directory must be as it was, so a half-written file, a temporary directory
beside an output, a parent directory created for it or a damaged old output
all fail the case. ``TMPDIR`` points into the workspace too, so temporary
files forge (or TVM, or the linker) leaves in the system's place count.

How the failures are made, for real rather than mocked:

* read-only: the output's parent directory is ``chmod 0o555``. Root ignores
  mode bits through ``CAP_DAC_OVERRIDE``; when the tests run as root, the
  launcher drops that capability from its bounding set (``prctl(PR_CAPBSET_DROP)``)
  before it execs forge, so forge runs as a root that obeys the mode bits
  (the exec recomputes root's capabilities from the bounding set). A probe
  checks the mechanism works here, or the read-only cases skip, saying why.
* a full disk, always available: the launcher sets ``RLIMIT_FSIZE`` to a few
  KiB and ignores ``SIGXFSZ`` before it execs forge, so every write past the
  limit fails with ``EFBIG`` ("File too large") part-way through, in forge
  and in what it starts (the linker, LLVM), as ``ENOSPC`` does on a full
  disk; and ``/dev/full`` (``ENOSPC`` on every write) as a report file and
  as standard output.
* a full disk, where mounting is allowed: a tiny tmpfs mounted in a private
  mount namespace (``unshare --mount``) holds the output: real ``ENOSPC``.
  Skipped, with the reason, where ``unshare``/``mount`` are refused.

The cases run two at a time (each is mostly forge's start-up).
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forge
from forge_core.files import leftovers

LOG_WARNING = re.compile(r"^forge\.[\w.]+: ")  # the CLI's log format, "%(name)s: %(message)s"
FORGE = shutil.which("forge", path=os.path.dirname(sys.executable)) or "forge"
OPT0 = ("--opt-level", "0")
RUN_FAST = ("--repeat", "1", "--warmup", "0")
FSIZE_COMPILE = 16384
"""Below the tiny model's library (about 40 KiB): the link fails part-way."""
FSIZE_RUN = 131072
"""Above its library (``forge run`` writes it to a memory file to load it), below its output (256 KiB)."""

# Sets the limits of the case, then execs forge: no preexec_fn, so the cases can run from threads.
LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
config = json.loads(sys.argv[1])
if config["fsize"] is not None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["fsize"], resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
if config["drop_dac"] and os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            sys.exit(f"launcher: prctl(PR_CAPBSET_DROP): {os.strerror(ctypes.get_errno())}")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
os.execv(sys.argv[2], sys.argv[2:])
"""

# Mounts a tmpfs of $SIZE on $MNT in this private mount namespace, runs forge, lists what the tmpfs holds.
TMPFS_SCRIPT = r"""
mount -t tmpfs -o "size=$SIZE,mode=0755" forge-test "$MNT" || exit 97
"$@"
rc=$?
find "$MNT" -mindepth 1 > "$LISTING"
exit $rc
"""


@dataclass
class Case:
    id: str
    args: tuple[str, ...]
    expect: str
    """A part of the error line: the path and the reason."""
    setup: tuple[str, ...] = ()
    """Names of :data:`SETUPS` run in the workspace first."""
    read_only: bool = False
    fsize: int | None = None
    tmpfs: str | None = None
    stdout_full: bool = False


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    before: dict
    after: dict
    seconds: float
    listing: list[str] = field(default_factory=list)


C = Case
MODEL_INPUTS = (
    ("missing", "{S}/missing.onnx", "'{S}/missing.onnx' does not exist"),
    ("directory", "{S}/emptydir", "'{S}/emptydir' is a directory"),
    ("text-as-model", "{S}/notes.txt", "Cannot tell the framework of '{S}/notes.txt'"),
    ("garbage-onnx", "{S}/garbage.onnx", "'{S}/garbage.onnx' is not a valid ONNX model"),
)
CASES = [
    # info
    *[C(f"info-{name}", ("info", path), expect) for name, path, expect in MODEL_INPUTS],
    C("info-garbage-library", ("info", "{S}/garbage.so"), "'{S}/garbage.so' is not a Forge library"),
    C("info-key-missing", ("info", "{A}", "--key", "{S}/missing.bin"),
      "cannot read --key '{S}/missing.bin': No such file or directory"),
    C("info-graph-directory", ("info", "{M}", "--graph", "pic"), "cannot write 'pic': Is a directory",
      setup=("dir:pic",)),
    C("info-graph-wrong-extension", ("info", "{M}", "--graph", "pic.txt"), "cannot write 'txt' pictures ('pic.txt')"),
    C("info-graph-read-only", ("info", "{M}", "--graph", "ro/pic.svg"), "cannot write 'ro/pic.svg': Permission denied",
      setup=("ro:ro",), read_only=True),
    C("info-graph-full-disk", ("info", "{M}", "--graph", "new/pic.svg"), "cannot write 'new/pic.svg': File too large",
      fsize=2048),
    # compile
    *[C(f"compile-{name}", ("compile", path, "-o", "out"), expect) for name, path, expect in MODEL_INPUTS],
    C("compile-output-is-a-file", ("compile", "{M}", "-o", "out"), "'out' exists and is not a directory",
      setup=("file:out",)),
    C("compile-read-only", ("compile", "{M}", "-o", "ro/out", *OPT0), "cannot write 'ro/out': Permission denied",
      setup=("ro:ro",), read_only=True),
    C("compile-read-only-force", ("compile", "{M}", "-o", "ro/out", "--force", *OPT0),
      "cannot write 'ro/out': Permission denied", setup=("artifact:ro/out", "ro:ro"), read_only=True),
    C("compile-tuning-db-missing", ("compile", "{M}", "-o", "out", "--tuning-db", "{S}/missing-db"),
      "cannot read '{S}/missing-db': no such directory, so it holds no tuning database"),
    C("compile-tuning-db-is-a-file", ("compile", "{M}", "-o", "out", "--tuning-db", "{S}/notes.txt"),
      "cannot read '{S}/notes.txt': it is not a directory, so it holds no tuning database"),
    C("compile-full-disk", ("compile", "{M}", "-o", "new/deeper/out", *OPT0),
      "cannot write 'new/deeper/out/model_library.so': File too large", fsize=FSIZE_COMPILE),
    C("compile-full-disk-force", ("compile", "{M}", "-o", "out", "--force", "--export-metadata", *OPT0),
      "cannot write 'out/model_library.so': File too large", setup=("artifact:out",), fsize=FSIZE_COMPILE),
    C("compile-full-tmpfs", ("compile", "{M}", "-o", "mnt/out", *OPT0),
      "cannot write 'mnt/out/model_library.so': No space left on device", setup=("dir:mnt",), tmpfs="16k"),
    # tune
    *[C(f"tune-{name}", ("tune", path, "--db", "db", "--trials", "0"), expect) for name, path, expect in MODEL_INPUTS],
    C("tune-db-is-a-file", ("tune", "{R}", "--db", "db", "--trials", "0"),
      "cannot write 'db': it exists and is not a directory", setup=("file:db",)),
    C("tune-read-only", ("tune", "{R}", "--db", "ro/db", "--trials", "0"), "cannot write 'ro/db': Permission denied",
      setup=("ro:ro",), read_only=True),
    C("tune-full-disk-existing-db", ("tune", "{R}", "--db", "db", "--trials", "0", *OPT0),
      "cannot write 'db/database_workload.json': File too large", setup=("database:db",), fsize=4096),
    C("tune-full-tmpfs", ("tune", "{R}", "--db", "mnt/db", "--trials", "0", *OPT0),
      "cannot write 'mnt/db': the tuning database read back is truncated", setup=("dir:mnt",), tmpfs="8k"),
    # quantize
    *[C(f"quantize-{name}", ("quantize", path, "--calib", "{S}/calib", "-o", "out"), expect)
      for name, path, expect in MODEL_INPUTS],
    C("quantize-calib-missing", ("quantize", "{M}", "--calib", "{S}/missing", "-o", "out"),
      "--calib: '{S}/missing' does not exist"),
    C("quantize-calib-text", ("quantize", "{M}", "--calib", "{S}/notes.txt", "-o", "out"),
      "--calib: '{S}/notes.txt' is not a directory or an .npz file"),
    C("quantize-calib-not-numpy", ("quantize", "{M}", "--calib", "{S}/badcalib", "-o", "out", *OPT0),
      "--calib: '{S}/badcalib/0.npy' is not a NumPy .npy file"),
    C("quantize-read-only", ("quantize", "{M}", "--calib", "{S}/calib", "-o", "ro/out"),
      "cannot write 'ro/out': Permission denied", setup=("ro:ro",), read_only=True),
    C("quantize-report-json-directory", ("quantize", "{M}", "--calib", "{S}/calib", "-o", "out", "--report-json", "r"),
      "cannot write 'r': Is a directory", setup=("dir:r",)),
    C("quantize-report-json-read-only",
      ("quantize", "{M}", "--calib", "{S}/calib", "-o", "out", "--report-json", "ro/r.json"),
      "cannot write 'ro/r.json': Permission denied", setup=("ro:ro",), read_only=True),
    C("quantize-report-json-dev-full",
      ("quantize", "{M}", "--calib", "{S}/calib", "-o", "out", "--report-json", "/dev/full", *OPT0),
      "cannot write '/dev/full': No space left on device"),
    C("quantize-full-disk", ("quantize", "{M}", "--calib", "{S}/calib", "-o", "out", "--report-json", "r.json", *OPT0),
      "cannot write 'out/model_library.so': File too large", fsize=FSIZE_COMPILE),
    # run
    C("run-missing", ("run", "{S}/missing"), "No compiled library at '{S}/missing'"),
    C("run-directory", ("run", "{S}/emptydir"), "No compiled library at '{S}/emptydir/model_library.so'"),
    C("run-text-as-artifact", ("run", "{S}/notes.txt"), "'{S}/notes.txt' is not a Forge library"),
    C("run-garbage-library", ("run", "{S}/garbage.so"), "'{S}/garbage.so' is not a Forge library"),
    C("run-input-missing", ("run", "{A}", "--input", "{S}/missing.npy"),
      "cannot read --input '{S}/missing.npy': No such file or directory"),
    C("run-input-directory", ("run", "{A}", "--input", "{S}/emptydir"), "cannot read --input '{S}/emptydir': Is a directory"),
    C("run-input-text", ("run", "{A}", "--input", "{S}/notes.txt"), "--input '{S}/notes.txt' is not a NumPy .npy file"),
    C("run-input-garbage-npy", ("run", "{A}", "--input", "{S}/garbage.npy"),
      "--input '{S}/garbage.npy' is not a NumPy .npy file"),
    C("run-input-truncated-npy", ("run", "{A}", "--input", "{S}/truncated.npy"),
      "--input '{S}/truncated.npy' is not a readable .npy file"),
    C("run-key-missing", ("run", "{A}", "--key", "{S}/missing.bin"),
      "cannot read --key '{S}/missing.bin': No such file or directory"),
    C("run-save-outputs-is-a-file", ("run", "{A}", *RUN_FAST, "--save-outputs", "o"),
      "cannot write 'o': it exists and is not a directory", setup=("file:o",)),
    C("run-save-outputs-read-only", ("run", "{A}", *RUN_FAST, "--save-outputs", "ro/o"),
      "cannot write 'ro/o': Permission denied", setup=("ro:ro",), read_only=True),
    C("run-save-outputs-read-only-existing", ("run", "{A}", *RUN_FAST, "--save-outputs", "ro"),
      "cannot write 'ro': Permission denied", setup=("outputs:ro", "ro:ro"), read_only=True),
    C("run-save-outputs-full-disk", ("run", "{A}", *RUN_FAST, "--save-outputs", "new/o"),
      "cannot write 'new/o/output_0.npy': File too large", fsize=FSIZE_RUN),
    C("run-save-outputs-full-disk-existing", ("run", "{A}", *RUN_FAST, "--save-outputs", "o"),
      "cannot write 'o/output_0.npy': File too large", setup=("outputs:o",), fsize=FSIZE_RUN),
    C("run-stdout-full", ("run", "{A}", *RUN_FAST, "--json"),
      "cannot write '<stdout>': No space left on device", stdout_full=True),
    # tags, plugins: no path arguments; what they write is standard output
    C("tags-stdout-full", ("tags",), "cannot write '<stdout>': No space left on device",
      stdout_full=True),
    C("plugins-stdout-full", ("plugins", "--json"), "cannot write '<stdout>': No space left on device",
      stdout_full=True),
]


def _tiny_model() -> onnx.ModelProto:
    """relu(x[1, 8] @ w[8, 64] + b) broadcast to [1024, 64]: a library of about 40 KiB (at opt_level 0) whose
    output (256 KiB) is larger, so that a file size limit between the two fails ``--save-outputs`` only."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Expand", ["r", "shape"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 64])],
        [numpy_helper.from_array(rng.standard_normal((8, 64)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b"),
         numpy_helper.from_array(np.array([1024, 64], np.int64), "shape")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _relu_model() -> onnx.ModelProto:
    """One operator: one tuning task, the cheapest tuning session."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _relu_database(directory: Path) -> None:
    """A MetaSchedule database as ``forge tune`` writes it (one workload, one record), without a 10 s session."""
    import tvm
    from tvm import s_tir, te
    from tvm.s_tir import meta_schedule as ms

    from forge_core.tuning.database import RECORDS, WORKLOADS

    x = te.placeholder((1, 64), name="x")
    y = te.compute((1, 64), lambda i, j: te.max(x[i, j], tvm.tirx.const(0, "float32")), name="y")
    func = te.create_prim_func([x, y])
    mod = tvm.IRModule({"main": func})
    directory.mkdir()
    database = ms.database.JSONDatabase(path_workload=str(directory / WORKLOADS),
                                        path_tuning_record=str(directory / RECORDS), allow_missing=True)
    database.commit_tuning_record(ms.database.TuningRecord(
        s_tir.Schedule(mod).trace, database.commit_workload(mod), [1e-5],
        tvm.target.Target({"kind": "llvm", "num-cores": 1}), ms.arg_info.ArgInfo.from_prim_func(func)))


def _launch(args, *, cwd, fsize=None, read_only=False, tmpfs=None, listing=None, stdout=subprocess.PIPE,
            extra_env=None):
    command = [sys.executable, "-S", "-c", LAUNCHER, json.dumps({"fsize": fsize, "drop_dac": read_only}), *args]
    env = {**os.environ, "COLUMNS": "200", **(extra_env or {})}
    if tmpfs is not None:
        env.update(SIZE=tmpfs, MNT=str(Path(cwd) / "mnt"), LISTING=str(listing))
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", TMPFS_SCRIPT, "sh", *command]
    return subprocess.run(command, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)


def _snapshot(root: Path) -> dict:
    """Every entry under ``root``: a directory's mode, a file's mode and SHA-256."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
            entries[str(path.relative_to(root))] = (stat.filemode(info.st_mode), digest)
    return entries


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Inputs every case reads: models, bad files, a compiled artifact, a tuning database, calibration samples."""
    root = tmp_path_factory.mktemp("bad-input-shared")
    onnx.save(_tiny_model(), str(root / "tiny.onnx"))
    onnx.save(_relu_model(), str(root / "relu.onnx"))
    (root / "emptydir").mkdir()
    (root / "notes.txt").write_text("a text file, not a model\n")
    (root / "garbage.onnx").write_bytes(b"this is not protobuf \xff\xfe" * 8)
    (root / "garbage.so").write_bytes(b"not a library\n" * 8)
    (root / "garbage.npy").write_text("1 2 3\n")
    sample = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    np.save(root / "x.npy", sample)
    (root / "truncated.npy").write_bytes((root / "x.npy").read_bytes()[:-10])
    (root / "calib").mkdir()
    for index in range(2):
        np.save(root / "calib" / f"{index}.npy", sample + index)
    (root / "badcalib").mkdir()
    (root / "badcalib" / "0.npy").write_text("not numpy\n")
    _relu_database(root / "db")
    started = time.perf_counter()
    for args in (("compile", root / "tiny.onnx", "-o", root / "artifact", *OPT0),
                 ("run", root / "artifact", "--input", root / "x.npy", *RUN_FAST, "--save-outputs", root / "outputs")):
        done = _launch([FORGE, *map(str, args)], cwd=root)
        assert done.returncode == 0, done.stderr
    print(f"shared inputs built in {time.perf_counter() - started:.1f} s")
    library_size = (root / "artifact" / "model_library.so").stat().st_size
    assert FSIZE_COMPILE < library_size < FSIZE_RUN < (root / "outputs" / "output_0.npy").stat().st_size
    assert {"database_tuning_record.json", "database_workload.json"} <= set(os.listdir(root / "db"))
    assert leftovers(root) == []
    return root


def _probe_read_only(base: Path) -> str | None:
    """Why a 0o555 directory cannot be made read-only for forge here, or None when it can."""
    folder = base / "probe"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        done = _launch(["/bin/sh", "-c", "touch probe/x"], cwd=base, read_only=True)
    finally:
        folder.chmod(0o755)
    if done.returncode == 0:
        return "a 0o555 directory stays writable for this user (root, and its capabilities cannot be dropped)"
    if "launcher:" in done.stderr:
        return f"cannot drop root's CAP_DAC_OVERRIDE: {done.stderr.strip()}"
    return None


def _probe_tmpfs(base: Path) -> str | None:
    """Why a tmpfs cannot be mounted in a private mount namespace here, or None when it can."""
    (base / "mnt").mkdir()
    try:
        done = _launch(["/bin/true"], cwd=base, tmpfs="16k", listing=base / "listing")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare is not available: {exc}"
    if done.returncode != 0:
        return f"cannot mount a tmpfs in a private mount namespace (unshare --mount): {done.stderr.strip()[-200:]}"
    return None


SETUPS = {
    "dir": lambda ws, shared, arg: (ws / arg).mkdir(parents=True),
    "file": lambda ws, shared, arg: (ws / arg).write_text("a file in the way\n"),
    "artifact": lambda ws, shared, arg: shutil.copytree(shared / "artifact", ws / arg),
    "database": lambda ws, shared, arg: shutil.copytree(shared / "db", ws / arg),
    "outputs": lambda ws, shared, arg: (
        shutil.copytree(shared / "outputs", ws / arg, dirs_exist_ok=True), (ws / arg / "mine.txt").write_text("keep")),
    "ro": lambda ws, shared, arg: ((ws / arg).mkdir(exist_ok=True), (ws / arg).chmod(0o555)),
}


def _run_case(case: Case, shared: Path, base: Path) -> Result:
    workspace = base / case.id
    workspace.mkdir()
    (workspace / "tmp").mkdir()  # TMPDIR: what forge leaves in the system's temporary directory counts too
    for step in case.setup:
        name, _, arg = step.partition(":")
        SETUPS[name](workspace, shared, arg)
    paths = {"S": str(shared), "M": str(shared / "tiny.onnx"), "R": str(shared / "relu.onnx"),
             "A": str(shared / "artifact")}
    args = [FORGE, *(a.format(**paths) for a in case.args)]
    listing = base / f"{case.id}.listing"
    before = _snapshot(workspace)
    started = time.perf_counter()
    if case.stdout_full:
        with open("/dev/full", "w") as full:
            done = _launch(args, cwd=workspace, stdout=full, extra_env={"TMPDIR": str(workspace / "tmp")})
    else:
        done = _launch(args, cwd=workspace, fsize=case.fsize, read_only=case.read_only, tmpfs=case.tmpfs,
                       listing=listing, extra_env={"TMPDIR": str(workspace / "tmp")})
    seconds = time.perf_counter() - started
    after = _snapshot(workspace)
    for folder in workspace.rglob("*"):  # let pytest remove the workspace as any user
        if folder.is_dir():
            folder.chmod(0o755)
    found = listing.read_text().split() if listing.exists() else []
    return Result(done.returncode, done.stdout or "", done.stderr, before, after, seconds, found)


@pytest.fixture(scope="module")
def results(request, shared, tmp_path_factory):
    """Every selected case, run two at a time; with the reasons some cannot run here."""
    selected = {item.callspec.params["case"].id for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec") and "case" in item.callspec.params}
    base = tmp_path_factory.mktemp("bad-input")
    skips = {"read_only": _probe_read_only(base), "tmpfs": _probe_tmpfs(base)}
    runnable = [case for case in CASES if case.id in selected
                and not (case.read_only and skips["read_only"]) and not (case.tmpfs and skips["tmpfs"])]
    shared_before = _snapshot(shared)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case.id: pool.submit(_run_case, case, shared, base) for case in runnable}
        done = {name: future.result() for name, future in futures.items()}
    print(f"{len(done)} cases in {time.perf_counter() - started:.1f} s; slowest: " + ", ".join(
        f"{name} {r.seconds:.1f} s" for name, r in sorted(done.items(), key=lambda kv: -kv[1].seconds)[:3]))
    assert _snapshot(shared) == shared_before, "a case changed the shared inputs"
    return done, skips


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_path_fails_with_one_line_and_leaves_nothing(case, results, shared):
    done, skips = results
    if case.read_only and skips["read_only"]:
        pytest.skip(skips["read_only"])
    if case.tmpfs and skips["tmpfs"]:
        pytest.skip(skips["tmpfs"])
    result = done[case.id]
    # The compile log's warnings may come first (int8 on a CPU without a byte dot product says it computes in
    # float32), each once; then the error, on one line, with no traceback.
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    warnings = [line for line in lines[:-1] if LOG_WARNING.match(line)]
    assert warnings == lines[:-1], f"stderr is not one error line after the log's warnings:\n{result.stderr}"
    assert len(set(warnings)) == len(warnings), f"a warning said twice:\n{result.stderr}"
    lines = lines[-1:]
    assert lines[0].startswith("forge: error: "), lines[0]
    assert case.expect.format(S=shared) in lines[0]
    assert result.after == result.before, f"the workspace changed: {lines[0]}"
    assert result.listing == [], f"left on the full tmpfs: {result.listing}"


# --- what the staging keeps working -------------------------------------------------------------


def test_a_seeded_staging_directory_extends_what_was_there(shared, tmp_path):
    """How tune() extends a database: a copy beside it, written to, then swapped in whole."""
    from forge_core.files import StagedDirectory

    database = shutil.copytree(shared / "db", tmp_path / "db")
    before = _tree(database)
    staged = StagedDirectory(database, replace=True, seed=True)
    with staged as folder:
        assert _tree(folder) == before
        (folder / "new.json").write_text("{}")
        assert _tree(database) == before  # nothing reaches the database before the commit
        staged.commit()
    assert _tree(database) == {**before, "new.json": b"{}"}
    assert sorted(os.listdir(tmp_path)) == ["db"]


def test_save_outputs_into_an_existing_directory_keeps_its_other_files(shared, tmp_path):
    folder = tmp_path / "o"
    folder.mkdir()
    (folder / "mine.txt").write_text("keep")
    (folder / "output_0.npy").write_bytes(b"old")
    done = _launch([FORGE, "run", str(shared / "artifact"), "--input", str(shared / "x.npy"), *RUN_FAST,
                    "--save-outputs", str(folder)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(folder)) == ["mine.txt", "output_0.npy"]
    np.testing.assert_array_equal(np.load(folder / "output_0.npy"), np.load(shared / "outputs" / "output_0.npy"))
    assert sorted(os.listdir(tmp_path)) == ["o"]


# --- the Python API: compile() writes nothing partial either ------------------------------------


@pytest.fixture(scope="module")
def tiny_ir(shared):
    return forge.from_onnx(shared / "tiny.onnx")


def _tree(path: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_compile_api_on_a_full_disk_keeps_the_old_artifact(tiny_ir, tmp_path):
    """A file size limit on this very process: LLVM's failed write ends the export's child, not pytest."""
    import resource
    import signal

    out = tmp_path / "artifact"
    tiny_ir.compile(output_path=out, opt_level=0, export_metadata=True)
    before = _tree(out)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_COMPILE, hard))
    try:
        with pytest.raises(forge.FileAccessError) as caught:
            tiny_ir.compile(output_path=out, opt_level=0, force_overwrite=True)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.errno == errno.EFBIG and isinstance(caught.value, OSError)
    assert str(caught.value) == f"cannot write {str(out / 'model_library.so')!r}: File too large"
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["artifact"]


def test_compile_api_disk_full_while_sealing(tiny_ir, tmp_path, monkeypatch):
    """A mocked ENOSPC from Python code inside an exporter, after the linker wrote the library."""
    import forge_core.builtin.exporters as exporters

    def full(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(exporters, "seal", full)
    with pytest.raises(forge.FileAccessError, match=r"cannot write '.*new/out': No space left on device"):
        tiny_ir.compile(output_path=tmp_path / "new" / "out", opt_level=0)
    assert os.listdir(tmp_path) == []  # nor the parent directory made for it


def test_a_database_missing_records_is_not_committed(shared, tmp_path):
    from forge_core.tuning.database import RECORDS, check_written

    copy = shutil.copytree(shared / "db", tmp_path / "db")
    lines = (copy / RECORDS).read_text().splitlines()
    check_written(copy, len(lines), shown=Path("db"))
    (copy / RECORDS).write_text((copy / RECORDS).read_text()[:-20])  # half a line: what a full disk leaves
    with pytest.raises(forge.FileAccessError, match="cannot write 'db': the tuning database read back is truncated"):
        check_written(copy, len(lines), shown=Path("db"))
