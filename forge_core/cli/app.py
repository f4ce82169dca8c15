"""Argument parsing and error handling of ``forge``.

Errors print one line, ``forge: error: ...``, and exit 1; ``--debug`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from forge_core import __version__
from forge_core.cli import commands
from forge_core.compiler.options import CHANNEL_LAYOUTS, OPT_LEVELS
from forge_core.errors import ForgeError
from forge_core.settings import ACTIVATION_DTYPES, CALIB_METHODS, COMPILE_DEFAULTS, QUANT_TYPES, QUANTIZE_DEFAULTS

_C, _Q = COMPILE_DEFAULTS, QUANTIZE_DEFAULTS


def compile_arguments(p: argparse.ArgumentParser, *, which: tuple[str, ...]) -> None:
    """The flags of ``compile()``'s options ``which`` (:class:`forge_core.settings.CompileSettings` names),
    each spelled here once with the settings' default, for every command that compiles or tunes."""
    flags: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
        "output_path": (("-o", "--output"), {"default": _C.output_path, "help": "artifact directory (output_path)"}),
        "host": (("--host",), {"default": _C.host, "help": "host target for GPU targets"}),
        "opt_level": (("--opt-level",), {"type": int, "default": _C.opt_level, "choices": sorted(OPT_LEVELS),
                                         "help": "; ".join(f"{k}: {v}" for k, v in OPT_LEVELS.items())}),
        "set_float16": (("--float16",), {"action": "store_true", "default": _C.set_float16,
                                         "help": "set_float16: fp16 storage, fp32 accumulation"}),
        "set_channel_layout": (("--channel-layout",), {"choices": sorted(CHANNEL_LAYOUTS),
                                                       "default": _C.set_channel_layout,
                                                       "help": "set_channel_layout"}),
        "export_relay": (("--export-relay",), {"action": "store_true", "default": _C.export_relay,
                                               "help": "write model_relay.txt"}),
        "export_metadata": (("--export-metadata",), {"action": "store_true", "default": _C.export_metadata,
                                                     "help": "write model_metadata.json"}),
        "force_overwrite": (("--force",), {"action": "store_true", "default": _C.force_overwrite,
                                           "help": "force_overwrite a non-empty output directory"}),
        "uuid": (("--uuid",), {"default": _C.uuid, "help": "the artifact's uuid (default: random)"}),
        "encrypt_password": (("--encrypt",), {
            "action": "store_true",
            "help": f"encrypt the artifact; the password comes from ${commands.PASSWORD_ENV} or a prompt"}),
    }
    for name in which:
        names, options = flags[name]
        p.add_argument(*names, **options)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge", description="Load, inspect, quantize, compile and run ML models.")
    parser.add_argument("--version", action="version", version=f"forge {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def rpc_arguments(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="TVM RPC tracker: " + what)
        p.add_argument("--rpc-key", metavar="KEY", help="the device key (with --rpc-tracker)")
        p.add_argument("--rpc-timeout", type=float, default=10.0, metavar="S",
                       help="seconds to wait for the tracker to answer (default: 10)")

    def model_arguments(p: argparse.ArgumentParser, what: str = "model file (.onnx, ...)") -> None:
        p.add_argument("model", help=what)
        p.add_argument("--frontend", help="loader to use (default: from the file's suffix)")
        p.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                       help="override an input's shape; -1 for a dynamic dimension (repeatable)")

    info = sub.add_parser("info", help="print a model's summary and operator table, or a compiled artifact's")
    model_arguments(info, "model file (.onnx, ...), or a compiled artifact (its directory or model_library.so)")
    info.add_argument("--key", metavar="modelKey.bin",
                      help=f"an encrypted artifact's key file: verify it (password from ${commands.DECRYPT_PASSWORD_ENV} "
                           "or a prompt)")
    info.add_argument("--graph", metavar="PATH",
                      help="also draw the main graph with Graphviz to PATH (.svg, .png or .pdf)")
    info.set_defaults(handler=commands.cmd_info)

    comp = sub.add_parser("compile", help="compile a model into an artifact directory")
    model_arguments(comp)
    comp.add_argument("--target", default="llvm", help="target string, JSON or tag (default: llvm)")
    compile_arguments(comp, which=("output_path", "host", "opt_level", "set_float16", "set_channel_layout",
                                   "export_relay", "export_metadata", "force_overwrite", "uuid", "encrypt_password"))
    comp.add_argument("--shape-bucket", action="append", metavar="'NAME=D0,D1,... [NAME=...]'",
                      help="shape_buckets: also build the dynamic model for these exact input shapes, which then "
                           "run as fast as a static artifact (repeatable: one bucket each)")
    comp.add_argument("--tuning-db", metavar="DIR", help="apply the tuned schedules of `forge tune` (no trials)")
    comp.add_argument("--verify", action="store_true",
                      help="check every scheduled function against its unscheduled form on random inputs "
                           "(as FORGE_VERIFY=1 does); a mismatch fails the compile")
    comp.set_defaults(handler=commands.cmd_compile)

    tune = sub.add_parser("tune", help="tune a model's operators for a CPU target into a database")
    model_arguments(tune)
    tune.add_argument("--target", default="llvm", help="CPU target string or tag (default: this machine)")
    tune.add_argument("--db", default="./tuning_database", metavar="DIR", help="database directory")
    tune.add_argument("--trials", type=int, default=2000, help="trial budget over all operators")
    tune.add_argument("--minutes", type=float, help="time budget")
    tune.add_argument("--trials-per-task", type=int, help="most trials for one operator")
    compile_arguments(tune, which=("opt_level", "set_float16", "set_channel_layout"))
    rpc_arguments(tune, "measure the candidates on the devices of KEY registered with the tracker")
    tune.add_argument("--devices", type=int, metavar="N",
                      help="candidates measured at once, one a device (default: every device of the key)")
    tune.set_defaults(handler=commands.cmd_tune)

    quant = sub.add_parser(
        "quantize", help="calibrate, quantize to int8/uint8 and compile a model into an artifact directory",
        description="Calibrate a model on sample inputs, quantize it (QDQ) and compile it, as ir.calibrate(), "
                    "ir.quantize() and ir.compile() do.",
    )
    model_arguments(quant)
    quant.add_argument(
        "--calib", metavar="PATH",
        help="calibration samples: a directory of .npy files (one sample each, single-input models) or of .npz "
             "files (one sample each, keyed by input name); or an .npz file keyed by the input names whose arrays "
             "stack the samples along their leading axis (sample i is arr[i:i+1] when the array has the input's "
             "rank, keeping a batch dimension of 1, else arr[i]); or, for a single-input model, an .npz with one "
             "sample per array. Files and keys are read in natural order, one sample at a time; dtypes must match "
             "the inputs' (nothing is cast). Required unless --quant-type dynamic")
    quant.add_argument("--method", default=_Q.calib_method, choices=list(CALIB_METHODS),
                       help=f"calibration method of the activation ranges (default: {_Q.calib_method})")
    quant.add_argument("--percentile", type=float, default=_Q.percentile, metavar="P",
                       help=f"the cut-off of --method percentile (default: {_Q.percentile})")
    quant.add_argument("--per-channel", action="store_true", default=_Q.per_channel,
                       help="one kernel scale per output channel")
    quant.add_argument("--activation-dtype", default=_Q.activation_dtype, choices=list(ACTIVATION_DTYPES),
                       help=f"(default: {_Q.activation_dtype})")
    quant.add_argument("--kernel-dtype", default=_Q.kernel_dtype, choices=list(ACTIVATION_DTYPES),
                       help="(default: the activation dtype)")
    quant.add_argument("--quant-type", default=_Q.quant_type, choices=list(QUANT_TYPES),
                       help="static: calibrated activation scales; dynamic: scales computed at run time, no "
                            "calibration; any (default): static (calibration runs)")
    quant.add_argument("--exclude", action="append", metavar="NODE",
                       help="keep this node float (a layer name of the report or `forge info`; repeatable)")
    quant.add_argument("--max-samples", type=int, metavar="N", help="use the first N calibration samples")
    quant.add_argument("--report", action="store_true",
                       help="print each quantized layer's SQNR against the float model on the calibration samples")
    quant.add_argument("--report-json", metavar="FILE", help="write that report as JSON (null for an exact layer)")
    quant.add_argument("-o", "--output", required=True, help="artifact directory (output_path)")
    quant.add_argument("--target", default="llvm", help="target string, JSON or tag (default: llvm)")
    compile_arguments(quant, which=("opt_level", "set_channel_layout", "force_overwrite", "encrypt_password"))
    quant.set_defaults(handler=commands.cmd_quantize)

    run = sub.add_parser("run", help="run a compiled artifact and time it")
    run.add_argument("artifact", help="artifact directory or model_library.so")
    run.add_argument("--key", metavar="modelKey.bin",
                     help=f"the key file of an encrypted artifact (password from ${commands.DECRYPT_PASSWORD_ENV} "
                          "or a prompt)")
    run.add_argument("--input", action="append", metavar="X.npy", help="an input, in order (default: random)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    run.add_argument("--repeat", type=int, default=20, help="timed runs")
    run.add_argument("--save-outputs", metavar="DIR", help="write output_<i>.npy files")
    run.add_argument("--json", action="store_true", help="print one JSON report")
    run.add_argument("--profile", action="store_true", help="time every function of the model")
    rpc_arguments(run, "run on a device of KEY registered with the tracker; timings taken on the device")
    run.set_defaults(handler=commands.cmd_run)

    bundle = sub.add_parser("bundle", help="write a directory that runs an artifact on a board with Python 3 and "
                                           "numpy alone")
    bundle.add_argument("artifact", help="artifact directory or model_library.so")
    bundle.add_argument("--platform", default="linux-aarch64", choices=["linux-aarch64", "linux-x86_64"],
                        help="the board's platform (default: linux-aarch64)")
    bundle.add_argument("--python", default="3.11", choices=["3.11", "3.12"], help="the board's Python (default 3.11)")
    bundle.add_argument("-o", "--output", required=True, help="the bundle's directory")
    bundle.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    bundle.set_defaults(handler=commands.cmd_bundle)

    server = sub.add_parser("rpc-server", help="serve this machine as a remote device (TVM's RPC server, with "
                                               "Forge's profiler)")
    server.add_argument("--tracker", metavar="HOST:PORT", help="register with this RPC tracker")
    server.add_argument("--key", default="", help="the device key to register under (with --tracker)")
    server.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    server.add_argument("--port", type=int, default=9090, help="first port to try (default: 9090)")
    server.add_argument("--port-end", type=int, default=9199, help="last port to try (default: 9199)")
    server.add_argument("--custom-addr", metavar="HOST", help="address the tracker tells clients (behind NAT)")
    server.set_defaults(handler=commands.cmd_rpc_server)

    tags = sub.add_parser("tags", help="list target tags")
    tags.add_argument("--category", help="cuda, x86, arm, android, riscv, ...")
    tags.add_argument("--verbose", action="store_true", help="show each tag's target string and note")
    tags.set_defaults(handler=commands.cmd_tags)

    plugins = sub.add_parser("plugins", help="list loaded plugins")
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(handler=commands.cmd_plugins)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_said_once)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        commands.err.print("forge: interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's contract: one line, no traceback
        if args.debug:
            raise
        commands.err.print(f"forge: error: {error_message(exc)}", markup=False, highlight=False)
        return 1


def _said_once(record: logging.LogRecord) -> bool:
    """One command says a thing once: a warning logged by each of its compiles (the quantization report's and
    the artifact's) reaches the terminal the first time only."""
    key = (record.name, record.levelno, record.getMessage())
    if key in _SAID:
        return False
    _SAID.add(key)
    return True


_SAID: set[tuple[str, int, str]] = set()


def error_message(exc: BaseException) -> str:
    """What ``forge: error:`` says: the message; for a bare ``OSError``, the path and the system's reason
    (``'x.npy': No such file or directory``, not ``[Errno 2] No such file or directory: 'x.npy'``)."""
    if isinstance(exc, OSError) and not isinstance(exc, ForgeError) and exc.strerror:
        if exc.filename is None:
            return exc.strerror
        names = repr(os.fsdecode(exc.filename))
        if exc.filename2 is not None:
            names += f" -> {os.fsdecode(exc.filename2)!r}"
        return f"{names}: {exc.strerror}"
    return str(exc).strip() or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
