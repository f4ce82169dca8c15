"""The ``forge`` subcommands."""

from __future__ import annotations

import argparse
import contextlib
import errno
import getpass
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from forge_core.cli.model_files import load_model, parse_buckets
from forge_core.errors import FileAccessError, ForgeError, InputError
from forge_core.files import StagedDirectory, StagedFile, check_directory_writable, check_file_writable, naming

PASSWORD_ENV = "FORGE_ENCRYPT_PASSWORD"
DECRYPT_PASSWORD_ENV = "FORGE_DECRYPT_PASSWORD"


class _StandardOutput:
    """``sys.stdout`` (looked up at each call) whose failed writes name it: ``forge tags > /dev/full``."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except OSError as exc:
            raise FileAccessError.from_os_error(exc, "<stdout>") from exc

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except OSError as exc:
            raise FileAccessError.from_os_error(exc, "<stdout>") from exc

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding... as sys.stdout has them
        return getattr(sys.stdout, name)


out = Console(file=_StandardOutput(), highlight=False, soft_wrap=True)  # type: ignore[arg-type]
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _check_input_file(path_text: str, option: str) -> Path:
    """``path_text`` names a readable file, or a :class:`FileAccessError` says why not (before any work)."""
    path = Path(path_text)
    if not path.exists():
        raise FileAccessError(errno.ENOENT, os.strerror(errno.ENOENT), path_text, f"read {option}")
    if path.is_dir():
        raise FileAccessError(errno.EISDIR, f"{os.strerror(errno.EISDIR)}, not a file", path_text, f"read {option}")
    if not os.access(path, os.R_OK):
        raise FileAccessError(errno.EACCES, os.strerror(errno.EACCES), path_text, f"read {option}")
    return path


def _load_npy(path_text: str) -> np.ndarray:
    """One ``--input`` array: a ``.npy`` file (checked by its magic bytes, whatever its name)."""
    path = _check_input_file(path_text, "--input")
    with naming(path, "read --input"), path.open("rb") as handle:
        head = handle.read(6)
    if head != b"\x93NUMPY":
        raise ForgeError(f"--input {path_text!r} is not a NumPy .npy file (numpy.save writes one); "
                         f"each --input is one array")
    try:
        with naming(path, "read --input"):
            return np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as exc:  # truncated, an object array, a bad header
        raise ForgeError(f"--input {path_text!r} is not a readable .npy file: {exc}") from None


def _is_artifact(path: Path) -> bool:
    """A compile() output directory or a library file (plain or encrypted), rather than a model."""
    from forge_core.runtime.metadata import LIBRARY_FILE
    from forge_core.security.encrypted_library import LIBRARY_MAGIC

    if path.is_dir():
        return (path / LIBRARY_FILE).is_file()
    if path.suffix == ".so":
        return True
    with contextlib.suppress(OSError), path.open("rb") as handle:
        head = handle.read(len(LIBRARY_MAGIC))
        return head.startswith(b"\x7fELF") or head == LIBRARY_MAGIC
    return False


def _decrypt_password(args: argparse.Namespace) -> str | None:
    """The password that opens ``--key``: from $FORGE_DECRYPT_PASSWORD, else a prompt; never an argument."""
    if args.key is None:
        return None
    _check_input_file(args.key, "--key")
    password = os.environ.get(DECRYPT_PASSWORD_ENV)
    if password:
        return password
    if not sys.stdin.isatty():
        raise ForgeError(f"--key needs the artifact's password: set {DECRYPT_PASSWORD_ENV}, or run in a terminal "
                         "to be prompted")
    return getpass.getpass(f"Password of {args.key}: ")


def _artifact_info(args: argparse.Namespace) -> int:
    from forge_core.runtime.metadata import library_path, read_artifact

    library = library_path(args.model)
    document, encrypted = read_artifact(library)
    password = _decrypt_password(args) if encrypted else None
    table = Table("", "", show_header=False, box=None)
    table.add_row("library", str(library))
    table.add_row("uuid", document.get("uuid", "?"))
    table.add_row("target", (document.get("target") or {}).get("string", "?"))
    table.add_row("device", str(document.get("device_type")))
    config = (document.get("target") or {}).get("config") or {}
    if config.get("kind") == "cuda":
        code = document.get("cuda")
        if code:
            table.add_row("gpu arch", f"{code.get('arch')}; kernels as a {code.get('code')} of "
                                      f"{' + '.join(code.get('contents', []))}, built by nvcc {code.get('nvcc')} "
                                      "(CUDA {0}); loads with the driver alone".format(
                                          ".".join(str(code.get("nvcc")).split(".")[:2])))
        else:  # an artifact of an earlier Forge
            table.add_row("gpu arch", f"{config.get('arch') or 'not named'}; kernels as CUDA source, compiled when "
                                      "the library loads (TVM's compiler library and NVRTC needed)")
    table.add_row("precision", str(document.get("precision")))
    table.add_row("opt_level", str(document.get("opt_level")))
    table.add_row("created", f"{document.get('created')} (Forge {document.get('forge_version')}, "
                             f"TVM {document.get('tvm_version')})")
    table.add_row("encrypted", f"yes, key file {document.get('key_file', '?')}" if encrypted else "no")
    for kind in ("inputs", "outputs"):
        for spec in document.get(kind, []):
            shape = "?" if spec.get("shape") is None else "x".join(str(d) for d in spec["shape"])
            layout = f" {spec['layout']}" if spec.get("layout") else ""
            table.add_row(kind[:-1], f"{spec.get('name')}: {spec.get('dtype')}[{shape}]{layout}")
    for bucket in document.get("shape_buckets") or ():
        sizes = ", ".join(f"{name}=" + "x".join(str(d) for d in shape) for name, shape in bucket["inputs"].items())
        table.add_row("shape bucket", f"{sizes} ({bucket['function']})")
    out.print(table, markup=False)
    if encrypted and args.key is None:
        out.print("The details above are read from the encrypted library's header; --key verifies them.",
                  markup=False)
    elif args.key is not None and not encrypted:
        out.print(f"{library} is not encrypted; --key is ignored", markup=False)
    elif args.key is not None:
        from forge_core.security.opening import open_encrypted

        with err.status("Decrypting"):
            open_encrypted(library.read_bytes(), library, args.key, password)
        out.print(f"key: {args.key} opens the library; the header above is authentic", markup=False)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from forge_core.runtime.metadata import LIBRARY_FILE

    path = Path(args.model)
    if args.key is not None:
        _check_input_file(args.key, "--key")
    if args.graph:
        check_file_writable(args.graph)
    if _is_artifact(path):
        return _artifact_info(args)
    if path.is_dir() and args.frontend is None and not (path / "saved_model.pb").exists():
        raise ForgeError(f"{args.model!r} is a directory holding neither a compiled artifact ({LIBRARY_FILE}) "
                         "nor a TensorFlow SavedModel (saved_model.pb)")
    if args.key is not None:
        raise ForgeError(f"--key applies to a compiled artifact; {args.model} is a model")
    with err.status(f"Loading {args.model}"):
        ir = load_model(args.model, args.frontend, args.shape)
    out.print(ir.summary())
    if args.graph:
        from rich.markup import escape

        graph = ir.main
        with err.status(f"Drawing the graph to {escape(args.graph)}"):
            written = graph.render(args.graph)
        out.print(f"graph: {len(graph)} nodes drawn to {written}", markup=False)
    return 0


def _password(args: argparse.Namespace) -> str | None:
    if not args.encrypt:
        return None
    password = os.environ.get(PASSWORD_ENV)
    if password:
        return password
    if not sys.stdin.isatty():
        raise ForgeError(f"--encrypt needs a password: set {PASSWORD_ENV}, or run in a terminal to be prompted")
    password = getpass.getpass("Password for the encrypted artifact: ")
    if password != getpass.getpass("Repeat the password: "):
        raise ForgeError("The passwords differ")
    return password


def cmd_compile(args: argparse.Namespace) -> int:
    from forge_core.compiler.staging import check_output_path

    password = _password(args)
    started = time.perf_counter()
    check_output_path(Path(args.output), args.force)  # before the long steps; compile() checks again
    if args.tuning_db is not None:
        from forge_core.tuning.database import check_database_exists

        check_database_exists(Path(args.tuning_db))
    from forge_core.schedules.verify import verifying

    with err.status(f"Loading {args.model}") as status, verifying() if args.verify else contextlib.nullcontext():
        ir = load_model(args.model, args.frontend, args.shape)
        ir.tuning_database = args.tuning_db
        from forge_core.compiler.compile import compile_module

        path = compile_module(
            ir,
            target=args.target,
            host=args.host,
            output_path=args.output,
            opt_level=args.opt_level,
            set_float16=args.float16,
            set_channel_layout=args.channel_layout,
            export_relay=args.export_relay,
            export_metadata=args.export_metadata,
            force_overwrite=args.force,
            uuid=args.uuid,
            encrypt_password=password,
            shape_buckets=parse_buckets(args.shape_bucket),
            progress=lambda step: status.update(step),
        )
    files = ", ".join(sorted(p.name for p in Path(path).iterdir()))
    out.print(f"Compiled {args.model} for {args.target} in {time.perf_counter() - started:.1f} s -> {path} ({files})")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from forge_core.tuning.database import check_database_directory

    check_database_directory(Path(args.db))  # before loading; tune() writes a copy, renamed in when complete
    rpc = _remote_devices(args)
    with err.status(f"Loading {args.model}"):
        ir = load_model(args.model, args.frontend, args.shape)
    report = ir.tune(
        target=args.target,
        work_dir=args.db,
        trials=args.trials,
        time_budget=args.minutes * 60 if args.minutes else None,
        trials_per_task=args.trials_per_task,
        opt_level=args.opt_level,
        set_float16=args.float16,
        set_channel_layout=args.channel_layout,
        progress=err.is_terminal,
        rpc=rpc,
    )
    out.print(report.summary(), markup=False)
    out.print(f"Compile with it: forge compile {args.model} --target {args.target!r} --tuning-db {args.db}",
              markup=False)
    return 0


@contextlib.contextmanager
def _naming_the_sample_file(samples: Any) -> Iterator[None]:
    """Add the file (or archive entry) of a sample the model rejects to the error's message."""
    try:
        yield
    except InputError as exc:
        source = getattr(samples, "last_source", None)
        if source is None:
            raise
        raise InputError(f"{str(exc).rstrip('.')} (from {source})") from None


def _finite_or_none(value: Any) -> Any:
    """JSON has no infinity: a bit-exact layer's SQNR (+inf) is written as null."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def _print_quantization_report(report: Any, worst_count: int = 5) -> None:
    from rich.text import Text

    worst = [row for row in report.worst(worst_count) if not np.isposinf(row.sqnr_db)]
    worst_names = {row.name for row in worst} if len(report.layers) > worst_count else set()
    table = Table("layer", "kind", "SQNR dB", "input scale",
                  title=f"Quantization report: SQNR against the float model over {report.num_samples} samples")
    for column in table.columns[2:]:
        column.justify = "right"
    for row in report.layers:
        scale = f"{row.input_scale:.4g}" if row.input_scale is not None else "dynamic"
        table.add_row(Text(row.name), row.kind, f"{row.sqnr_db:.2f}", scale,
                      style="bold red" if row.name in worst_names else None)
    if report.outputs:
        table.add_section()
        for name, value in report.outputs.items():
            table.add_row(Text(f"output {name}"), "", f"{value:.2f}", "")
    out.print(table)
    if worst:
        listing = ", ".join(f"{row.name} ({row.sqnr_db:.2f} dB)" for row in worst)
        out.print(f"Lowest SQNR: {listing}. Keep a layer float with --exclude NAME.", markup=False)


def cmd_quantize(args: argparse.Namespace) -> int:
    from forge_core.cli.calibration_files import calibration_samples
    from forge_core.compiler.staging import check_output_path

    password = _password(args)
    started = time.perf_counter()
    dynamic = args.quant_type == "dynamic"
    wants_report = args.report or args.report_json is not None
    if args.calib is None and (not dynamic or wants_report):
        need = "--report and --report-json need" if dynamic else f"--quant-type {args.quant_type} needs"
        raise ForgeError(f"{need} calibration samples: pass --calib DIR (one .npy/.npz per sample) or --calib FILE.npz")
    check_output_path(Path(args.output), args.force)  # before the long steps
    if args.report_json is not None:
        check_file_writable(args.report_json)
    with err.status(f"Loading {args.model}"):
        ir = load_model(args.model, args.frontend, args.shape)
    if args.exclude:  # an unknown name fails now, not after calibration
        from forge_core.quantization.plan import build_plan

        build_plan(ir.mod, ir.params, exclude=args.exclude)
    samples = calibration_samples(args.calib, ir.input_specs, args.max_samples) if args.calib else None
    if not dynamic:
        with _naming_the_sample_file(samples):
            ir.calibrate(samples)
        out.print(f"Calibrated on {samples.describe()}", markup=False)
    ir.quantize(
        activation_dtype=args.activation_dtype,
        kernel_dtype=args.kernel_dtype,
        per_channel=args.per_channel,
        calib_method=args.method,
        quant_type=args.quant_type,
        exclude=args.exclude or (),
        percentile=args.percentile,
    )
    info = ir.quantization_info
    granularity = "per-channel" if info.per_channel else "per-tensor"
    method = f", {info.calib_method}" if info.quant_type == "static" and info.calib_method else ""
    excluded = f"; kept float: {', '.join(info.excluded)}" if info.excluded else ""
    layers = f"{len(info.layers)} layer{'s' if len(info.layers) != 1 else ''}"
    out.print(f"Quantized {layers} ({info.quant_type}, activations {info.activation_dtype}, "
              f"kernels {info.kernel_dtype} {granularity}{method}){excluded}", markup=False)
    from forge_core.compiler.compile import compile_module

    report = None
    if wants_report:  # before compiling: the artifact and the report are written together, or neither
        with _naming_the_sample_file(samples):
            report = ir.quantization_report(samples)
    # The report is staged beside its place first (a full disk fails here, before the artifact is
    # written), the artifact is written atomically, and the report renamed into place last.
    with StagedFile(args.report_json) if args.report_json is not None else contextlib.nullcontext() as staged:
        if staged is not None:
            staged.write(json.dumps(_finite_or_none(report.to_dict()), indent=2, allow_nan=False) + "\n")
        with err.status(f"Compiling {args.model}") as status:
            path = compile_module(
                ir,
                target=args.target,
                output_path=args.output,
                opt_level=args.opt_level,
                set_channel_layout=args.channel_layout,
                force_overwrite=args.force,
                encrypt_password=password,
                progress=lambda step: status.update(step),
            )
        if staged is not None:
            staged.commit()
    files = ", ".join(sorted(p.name for p in Path(path).iterdir()))
    out.print(f"Compiled {args.model} ({info.activation_dtype}) for {args.target} in "
              f"{time.perf_counter() - started:.1f} s -> {path} ({files})", markup=False)
    if report is not None and args.report:
        _print_quantization_report(report)
    if args.report_json is not None:
        out.print(f"Report written to {args.report_json}", markup=False)
    return 0


def _percentile_table(latencies_ms: np.ndarray) -> str:
    points = {f"p{p}": float(np.percentile(latencies_ms, p)) for p in (50, 90, 99)}
    return ", ".join(f"{k} {v:.3f} ms" for k, v in points.items()) + f", mean {latencies_ms.mean():.3f} ms"


class _PythonWrites:
    """A file numpy writes through ``write()``: ``ndarray.tofile`` (what ``np.save`` does to a real file)
    reports a short write as ``65536 requested and 32736 written``, without the errno that says why."""

    def __init__(self, handle: Any) -> None:
        self.write = handle.write


def _save_npy(path: Path, value: np.ndarray) -> None:
    with naming(path), path.open("wb") as handle:
        np.lib.format.write_array(_PythonWrites(handle), np.asanyarray(value), allow_pickle=False)


def _remote_devices(args: argparse.Namespace) -> Any:
    """``--rpc-tracker``/``--rpc-key``/``--devices`` as ``RemoteDevices`` (None: local); checked before any work."""
    if not args.rpc_tracker:
        for option, value in (("--rpc-key", args.rpc_key), ("--devices", getattr(args, "devices", None))):
            if value is not None:
                raise InputError(f"{option} needs --rpc-tracker HOST:PORT")
        return None
    if not args.rpc_key:
        raise InputError("--rpc-tracker needs --rpc-key: the device key the boards registered under")
    if args.rpc_timeout <= 0:
        raise InputError(f"--rpc-timeout must be a positive number of seconds, given {args.rpc_timeout:g}")
    from forge_core.remote.devices import RemoteDevices

    return RemoteDevices.of({"tracker": args.rpc_tracker, "key": args.rpc_key, "timeout": args.rpc_timeout,
                             "devices": getattr(args, "devices", None)})


def _open_runtime(args: argparse.Namespace) -> Any:
    """The local runtime, or the remote one with ``--rpc-tracker``."""
    from forge_core.runtime import Runtime

    remote = _remote_devices(args)
    if remote is None:
        with err.status(f"Loading {args.artifact}"):
            return Runtime(args.artifact, args.key, _decrypt_password(args))
    if args.key is not None:
        raise InputError("--key: encrypted artifacts do not run through RPC (TVM's RPC server loads plain "
                         "libraries, over an unencrypted channel); run it on the board with `forge run`")
    with err.status(f"Loading {args.artifact} on a device of key {remote.key!r} ({remote.tracker})"):
        return Runtime.remote(args.artifact, remote.tracker, remote.key, timeout=remote.timeout)


def cmd_run(args: argparse.Namespace) -> int:
    if args.save_outputs:
        check_directory_writable(args.save_outputs)
    inputs = [_load_npy(path) for path in args.input or ()]
    runtime = _open_runtime(args)
    remote = args.rpc_tracker is not None
    if args.input:
        arrays = inputs
    else:
        arrays = runtime.example_inputs(seed=args.seed)
    outputs = runtime.infer(*arrays)
    if remote:  # timed on the device's clock: TVM's time evaluator, the first run not counted
        latencies_ms = runtime.latencies(*arrays, repeat=args.repeat)
    else:
        runtime.warm_up(args.warmup, arrays)  # the given inputs: a dynamic model may refuse random ones at 1
        # Every page of the timings is written before the first run: a long --repeat (a soak) keeps one
        # resident size from its start to its end, so a leak shows as growth (benchmarks/runtime_soak.py).
        latencies_ms = np.full(args.repeat, np.nan)
        for index in range(args.repeat):
            started = time.perf_counter()
            runtime.infer(*arrays)
            latencies_ms[index] = (time.perf_counter() - started) * 1000
    if args.save_outputs:  # all files or none; other files in the directory stay
        staged = StagedDirectory(args.save_outputs, replace=False)
        with staged as directory:
            for index, value in enumerate(outputs):
                _save_npy(directory / f"output_{index}.npy", value)
            staged.commit()
    if args.json:
        report = {
            "uuid": runtime.uuid,
            "device_type": runtime.device_type,
            "threads": None if remote else runtime.num_threads,
            "remote": {"tracker": args.rpc_tracker, "key": args.rpc_key} if remote else None,
            "outputs": [
                {"name": n, "shape": list(o.shape), "dtype": str(o.dtype)}
                for n, o in zip(runtime.output_names, outputs)
            ],
            "latency_ms": {f"p{p}": float(np.percentile(latencies_ms, p)) for p in (50, 90, 99)}
            | {"mean": float(latencies_ms.mean()), "runs": len(latencies_ms)},
        }
        out.print(json.dumps(report), markup=False)
        return 0
    if remote:
        out.print(f"Artifact {runtime.uuid} on {runtime.device_type} of a device of key {args.rpc_key!r} "
                  f"({args.rpc_tracker}); latency timed on the device")
    else:
        out.print(f"Artifact {runtime.uuid} on {runtime.device_type} ({runtime.num_threads} threads)")
    table = Table("output", "shape", "dtype", "min", "max", "mean")
    for name, value in zip(runtime.output_names, outputs):
        numeric = value.astype(np.float64) if value.size else np.zeros(1)
        table.add_row(name, str(value.shape), str(value.dtype), f"{numeric.min():.6g}", f"{numeric.max():.6g}",
                      f"{numeric.mean():.6g}")
    out.print(table)
    out.print(f"Latency over {len(latencies_ms)} runs: {_percentile_table(latencies_ms)}")
    if args.profile:
        from forge_core.runtime.profiling import format_profile

        out.print(format_profile(runtime.profile(*arrays, repeat=args.repeat)), markup=False)
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    import json

    from forge_core.deploy import bundle

    out = bundle(args.artifact, args.platform, args.output, python=args.python, force_overwrite=args.force)
    description = json.loads((out / "bundle.json").read_text())
    print(f"Bundled for {description['platform']} (Python {description['python']}) in {out}: model "
          f"{description['model_bytes'] / 2**20:.1f} MiB, runtime {description['runtime_bytes'] / 2**20:.1f} MiB")
    print(f"On the board: cd {out.name} && python3 -m forge_runtime --input x.npy --output y.npy")
    return 0


def cmd_rpc_server(args: argparse.Namespace) -> int:
    from forge_core.remote.server import serve

    serve(args.tracker, args.key, host=args.host, port=args.port, port_end=args.port_end,
          custom_addr=args.custom_addr)
    return 0


def cmd_tags(args: argparse.Namespace) -> int:
    from forge_core.targets.listing import tag_target_string, tags_in

    tags = tags_in(args.category)
    if args.category and not tags:
        categories = sorted({t.category for t in tags_in()})
        raise ForgeError(f"No tags in category {args.category!r}; categories: {', '.join(categories)}")
    if not args.verbose:
        for tag in tags:
            out.print(tag.name, markup=False)
        return 0
    table = Table("tag", "category", "target", "note")
    for tag in tags:
        table.add_row(tag.name, tag.category, tag_target_string(tag), tag.note)
    out.print(table)
    return 0


_SINGULAR = {"frontends": "frontend", "passes": "pass", "target tags": "target tag", "exporters": "exporter",
             "converters": "converter"}


def cmd_plugins(args: argparse.Namespace) -> int:
    from forge_core.plugin_manager import get_plugin_manager

    manager = get_plugin_manager()
    plugins = manager.list_plugins()
    registered = manager.registrations()
    if args.json:
        out.print(json.dumps([{**p.to_dict(), "registers": registered.get(p.name, {})} for p in plugins]),
                  markup=False)
        return 0
    table = Table("plugin", "version", "distribution", "hooks", "registers")
    for plugin in plugins:
        counts = registered.get(plugin.name, {})
        table.add_row(plugin.name, plugin.version, plugin.distribution, ", ".join(plugin.hooks),
                      ", ".join(f"{count} {kind if count != 1 else _SINGULAR[kind]}" for kind, count in counts.items())
                      or "-")
    out.print(table)
    return 0
