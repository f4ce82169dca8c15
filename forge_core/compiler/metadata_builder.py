"""Building the metadata document that is embedded in the library."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import tvm
from tvm import relax

from forge_core.compiler.options import CompileOptions
from forge_core.runtime import metadata as schema
from forge_core.runtime.signature import TensorSpec
from forge_core.security.encrypted_library import KEY_FILE
from forge_core.targets.isa import required_cpu_features
from forge_core.targets.parsing import plain_config, target_to_string

_LAYOUT_ATTRS = ("data_layout", "layout")


def input_layouts(mod: tvm.IRModule) -> dict[str, str]:
    """Layouts of ``main``'s inputs that feed a convolution or pooling directly."""
    params = {var.name: var for var in mod["main"].params}
    found: dict[str, str] = {}

    def visit(expr: relax.Expr) -> None:
        if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op) or not expr.args:
            return
        first = expr.args[0]
        if not isinstance(first, relax.Var) or first.name not in params or expr.attrs is None:
            return
        for attr in _LAYOUT_ATTRS:
            value = getattr(expr.attrs, attr, None)
            if value is not None:
                found.setdefault(first.name, str(value))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _target_entry(target: tvm.target.Target | None) -> dict[str, Any] | None:
    if target is None:
        return None
    config = {k: v for k, v in plain_config(target).items() if k != "host"}
    return {"string": target_to_string(target), "config": config}


def _io(specs: list[TensorSpec], layouts: dict[str, str]) -> list[dict[str, Any]]:
    return [{**spec.to_json(), "layout": layouts.get(spec.name)} for spec in specs]


def build_metadata(
    *,
    options: CompileOptions,
    target: tvm.target.Target,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    layouts: dict[str, str],
    fingerprint: str,
    structural_hash: int,
    forge_version: str,
    quantization: dict[str, Any] | None = None,
    arrived_quantized: bool = False,
) -> dict[str, Any]:
    host = target.host if target.kind.name != "llvm" else None
    return {
        "forge_artifact": schema.ARTIFACT_MARK,
        "schema_version": schema.SCHEMA_VERSION,
        "uuid": options.uuid,
        "forge_version": forge_version,
        "tvm_version": str(tvm.__version__),
        "fingerprint": fingerprint,
        "structural_hash": f"{structural_hash & 0xFFFFFFFFFFFFFFFF:016x}",
        "target": _target_entry(target),
        "host": _target_entry(host),
        "device_type": "cuda" if target.kind.name == "cuda" else "cpu",
        # a GPU target's host code: its host, or TVM's default (the generic CPU of LLVM's default triple)
        "cpu_features": required_cpu_features(host if host is not None else target if target.kind.name == "llvm"
                                              else tvm.target.Target("llvm")),
        "inputs": _io(inputs, layouts),
        "outputs": _io(outputs, {}),
        "precision": (quantization["activation_dtype"] if quantization is not None
                      else "quantized" if arrived_quantized
                      else "float16" if options.set_float16 else "float32"),
        "channel_layout": options.set_channel_layout,
        "opt_level": options.opt_level,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "encrypted": options.encrypted,
        **({"key_file": KEY_FILE} if options.encrypted else {}),
        **({"quantization": quantization} if quantization is not None else {}),
    }


def metadata_function(document: dict[str, Any]) -> relax.Function:
    """A Relax function ``forge_metadata() -> str`` that carries the document into the library."""
    bb = relax.BlockBuilder()
    with bb.function(schema.METADATA_FUNCTION, [], pure=True):
        bb.emit_func_output(tvm.ir.StringImm(schema.dumps(document)))
    return bb.get()[schema.METADATA_FUNCTION]


def schedules_entry(report: dict[str, list[str]], fallback_rules: tuple[str, ...]) -> dict[str, Any]:
    """The ``schedules`` metadata entry: each kernel's schedule rule, and the kernels that fell back."""
    rules = {name: rule for rule, names in report.items() for name in names}
    return {"rules": dict(sorted(rules.items())),
            "fallbacks": sorted(name for name, rule in rules.items() if rule in fallback_rules)}


def record_schedules(mod: tvm.IRModule, entry: dict[str, Any]) -> tvm.IRModule:
    """``mod`` with ``entry`` added as ``schedules`` to the metadata document it carries, if it carries one."""
    gvs = [gv for gv in mod.functions if gv.name_hint == schema.METADATA_FUNCTION]
    if not gvs:
        return mod
    document = json.loads(str(mod[gvs[0]].body.body.value))  # SeqExpr(StringImm), as metadata_function builds
    document["schedules"] = entry
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    result[gvs[0]] = metadata_function(document)
    return result
