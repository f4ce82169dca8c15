"""``IRModule.compile()``: from a module to an artifact directory."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tvm

from forge_core import __version__
from forge_core.compiler.artifact import Artifact
from forge_core.compiler.buckets import add_buckets, bucket_bindings
from forge_core.compiler.metadata_builder import build_metadata, input_layouts, metadata_function
from forge_core.compiler.options import CompileOptions
from forge_core.compiler.pipeline import build, prepare_graph
from forge_core.compiler.staging import check_output_path
from forge_core.files import StagedDirectory
from forge_core.compiler.toolchain import toolchain_for
from forge_core.errors import CompilationError, ForgeError
from forge_core.ir import weights
from forge_core.ir.state import initial_state
from forge_core.plugin_manager import get_plugin_manager
from forge_core.runtime import metadata as schema
from forge_core.runtime.signature import DYNAMIC_DIM, TensorSpec, format_shape
from forge_core.targets.parsing import resolve_target

if TYPE_CHECKING:
    from forge_core.ir.parts import ModuleParts

logger = logging.getLogger("forge.compile")

Progress = Callable[[str], None]


FORGE_FORMATS = ("library", "ir-text", "metadata")
"""The formats of Forge's own exporters; ``compile()``'s options choose among them."""


def exporter_formats(options: CompileOptions, registered: Iterable[str] = ()) -> list[str]:
    """The exporters a compilation runs, in order.

    The library; ``ir-text`` and ``metadata`` when asked (``export_relay``,
    ``export_metadata``); then every other registered format (a third-party
    exporter writes into every artifact, beside Forge's files), by name; the
    metadata file last: it hashes the library.
    """
    formats = ["library"]
    if options.export_relay:
        formats.append("ir-text")
    formats += sorted(fmt for fmt in registered if fmt not in FORGE_FORMATS)
    if options.export_metadata:
        formats.append("metadata")
    return formats


def compile_to_function(
    ir: ModuleParts,
    target: str | Mapping[str, Any] | tvm.target.Target = "llvm",
    *,
    opt_level: int = 3,
    set_float16: bool = False,
    set_channel_layout: str | None = None,
) -> Any:
    """Compile ``ir`` like ``compile()`` does, into a callable kept in memory (no artifact written).

    For runners such as the ONNX backend: same pipeline, same schedules, no
    library export. Returns a :class:`forge_core.ir.inference.InferenceFunction`.
    """
    from forge_core.ir.inference import build_inference_function

    options = CompileOptions.validate(
        opt_level=opt_level, set_float16=set_float16, set_channel_layout=set_channel_layout,
    )
    tvm_target = resolve_target(target)
    mod = prepare_graph(weights.bind_params(ir.mod, ir.params), options, tvm_target)
    database = Path(ir.tuning_database) if ir.tuning_database is not None else None
    try:
        executable = build(mod, tvm_target, options.opt_level, tuning_database=database)
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise CompilationError(f"Building for {tvm_target.kind.name} failed: {exc}") from exc
    return build_inference_function(executable, tvm_target, ir.input_specs, ir.output_specs)


def _is_write_error(exc: OSError, staging: Path) -> bool:
    """Whether ``exc`` is a failed write of the artifact (rather than, say, a missing compiler)."""
    from forge_core.compiler.isolation import DISK_ERRNOS

    if exc.filename is not None:
        with contextlib.suppress(ValueError):
            Path(os.path.abspath(os.fsdecode(exc.filename))).relative_to(staging)
            return True
    return exc.errno in DISK_ERRNOS and exc.errno != errno.EACCES


def _exporter_failed(exporter: Any, exc: BaseException) -> CompilationError:
    return CompilationError(
        f"Writing {exporter.format} (exporter of plugin {exporter.plugin!r}) failed: "
        f"{type(exc).__name__}: {str(exc).strip()}"
    )


def _note_generic_kernels(inputs: Sequence[TensorSpec]) -> None:
    """Say, once per compile, that a model with dynamic dims other than its batch gets slower kernels.

    Kernels whose only dynamic dim is the batch are scheduled per batch item at
    static speed (``schedules/batch_loop.py``), those whose rows are computed
    each alone per block of rows (``schedules/row_blocks.py``: a transformer's
    dense layers over batch and sequence), attention and softmax over a
    dynamic sequence, and convolutions (plain, depthwise, grouped and
    transposed) and pooling windows over a dynamic height and width by their
    dynamic rules, at 1-3x a static kernel's time.
    """
    dynamic = [spec for spec in inputs if spec.shape is not None and DYNAMIC_DIM in spec.shape[1:]]
    if not dynamic:
        return
    logger.warning(
        "%s: the artifact runs at any size, but its kernels over dynamic dims other than the batch run slower "
        "than a static model's (convolutions, pooling, dense layers and attention are tiled for any size, at up "
        "to a few times the static kernel's time). "
        "For full speed at the sizes you run, name them with "
        "shape_buckets=[{input: shape}, ...] (forge compile --shape-bucket), or fix the shape at import (shape=...).",
        "; ".join(f"input {spec.name!r} has dynamic dims {format_shape(spec.shape, spec.dims)}" for spec in dynamic))


def compile_module(
    ir: ModuleParts,
    target: str | Mapping[str, Any] | tvm.target.Target = "llvm",
    *,
    host: str | Mapping[str, Any] | tvm.target.Target | None = None,
    output_path: str | os.PathLike[str] | None = "./compile_output",
    opt_level: int = 3,
    set_float16: bool = False,
    set_channel_layout: str | None = None,
    export_relay: bool = False,
    export_metadata: bool = False,
    force_overwrite: bool = False,
    uuid: str | None = None,
    encrypt_password: str | None = None,
    shape_buckets: Sequence[Mapping[str, Sequence[int]]] | None = None,
    progress: Progress | None = None,
) -> Path:
    """Compile ``ir`` and write the artifact directory; returns its path. See ``IRModule.compile``."""
    report = progress or (lambda step: logger.info("%s", step))
    options = CompileOptions.validate(
        output_path=output_path, opt_level=opt_level, set_float16=set_float16,
        set_channel_layout=set_channel_layout, export_relay=export_relay, export_metadata=export_metadata,
        force_overwrite=force_overwrite, uuid=uuid, encrypt_password=encrypt_password,
    )
    tvm_target = resolve_target(target, host)
    if shape_buckets is not None:  # before the long steps; add_buckets binds them after graph preparation
        inputs = [var for var in ir.mod["main"].params if var.name not in ir.params]
        bucket_bindings(inputs, ir.input_specs, shape_buckets)
    else:
        _note_generic_kernels(ir.input_specs)
    check_output_path(options.output_path, options.force_overwrite)
    toolchain = toolchain_for(tvm_target)
    manager = get_plugin_manager()
    exporters = [manager.exporter(fmt) for fmt in exporter_formats(options, manager.exporters())]
    database = Path(ir.tuning_database) if ir.tuning_database is not None else None
    if database is not None:
        from forge_core.tuning.database import open_database

        open_database(database, create=False)  # fail before the build, not inside it

    started = time.perf_counter()
    report(f"Preparing the graph for {tvm_target.kind.name} (opt_level {options.opt_level})")
    mod = weights.bind_params(ir.mod, ir.params)
    layouts = input_layouts(mod)
    mod = prepare_graph(mod, options, tvm_target)
    buckets: list[dict[str, Any]] = []
    if shape_buckets is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warned when checked above
            mod, buckets = add_buckets(mod, ir.input_specs, shape_buckets)
    document = build_metadata(
        options=options,
        target=tvm_target,
        inputs=ir.input_specs,
        outputs=ir.output_specs,
        layouts=layouts,
        fingerprint=ir.fingerprint,
        structural_hash=hash(ir),
        forge_version=__version__,
        quantization=ir.quantization_info.to_json() if ir.quantization_info is not None else None,
        arrived_quantized=ir.is_quantized,
    )
    if buckets:
        document["shape_buckets"] = buckets
    state = initial_state(ir.mod["main"])
    if state:
        document["initial_state"] = schema.encode_arrays(state)
    if toolchain.device_code is not None:
        document["cuda"] = toolchain.device_code
    final_ir = mod
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    mod[schema.METADATA_FUNCTION] = metadata_function(document)

    report(f"Building for {document['target']['string']}")
    schedules: dict[str, Any] = {}
    try:
        executable = build(mod, tvm_target, options.opt_level, tuning_database=database, schedules=schedules)
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - TVM and LLVM fail with many error types
        raise CompilationError(f"Building for {document['target']['string']} failed: {exc}") from exc
    if schedules:
        document["schedules"] = schedules  # as the build embedded it
    artifact = Artifact(executable, tvm_target, options, final_ir, document, toolchain)

    report(f"Writing {', '.join(e.format for e in exporters)} to {options.output_path} ({toolchain.description})")
    stage = StagedDirectory(options.output_path, replace=True)
    with stage as directory:
        for exporter in exporters:
            try:
                written = exporter.write(artifact, directory)
            except ForgeError:
                raise
            except OSError as exc:
                if _is_write_error(exc, directory):  # disk full, quota, permissions: the final path, the reason
                    raise stage.restate(exc) from exc
                raise _exporter_failed(exporter, exc) from exc
            except Exception as exc:  # noqa: BLE001 - compilers and linkers fail in many ways
                raise _exporter_failed(exporter, exc) from exc
            artifact.written[exporter.format] = [str(Path(p).relative_to(directory)) for p in written]
        stage.commit()
    logger.info("Compiled to %s in %.1f s", options.output_path, time.perf_counter() - started)
    return options.output_path
