"""Turn a target in any of the docs' forms into a :class:`tvm.target.Target`.

TVM 0.27 accepts only a config dict (or a registered TVM tag). Forge accepts,
for ``target`` and ``host`` alike:

* a docs-style string: ``"llvm -mcpu=skylake -mattr=+avx2,+fma -num-cores=4"``,
  ``"cuda -arch=sm_86"``; each ``-key=value`` is typed by the target kind's
  option schema (ints, bools, comma-separated lists);
* a JSON string: ``'{"kind": "llvm", "mcpu": "skylake"}'``;
* a dict: ``{"kind": "cuda", "arch": "sm_86", "host": {...}}``;
* a tag name registered by a plugin: ``"raspberry-pi/5"``;
* a :class:`tvm.target.Target`.

Errors raise :class:`forge_core.errors.TargetError` naming the bad part and,
where they exist, close tag names or option names.
"""

from __future__ import annotations

import difflib
import functools
import json
import shlex
import warnings
from collections.abc import Mapping
from typing import Any

import tvm
from tvm.target import Target

from forge_core.errors import TargetError

TargetLike = str | Mapping[str, Any] | Target

# Options the docs list that TVM 0.27 no longer has; dropped with a warning.
_RETIRED_OPTIONS = {"system-lib", "runtime", "link-params", "executor"}


def _known_kinds() -> list[str]:
    return [str(k) for k in Target.list_kinds()]


@functools.lru_cache(maxsize=None)
def _kind_options(kind: str) -> dict[str, str]:
    try:
        return dict(tvm.target.TargetKind.options_from_name(kind))
    except Exception as exc:  # noqa: BLE001
        raise TargetError(f"Unknown target kind {kind!r}. Known kinds: {', '.join(sorted(_known_kinds()))}") from exc


_CUDA_LIMITS = {"max_shared_memory_per_block": 49152, "max_threads_per_block": 1024}


@functools.lru_cache(maxsize=None)
def _kind_defaults(kind: str) -> dict[str, Any]:
    if kind != "cuda":
        return dict(Target({"kind": kind}).export())
    # A CUDA target without an arch logs "Unable to detect CUDA version, default to -arch=sm_50" where no GPU is
    # present; the arch is never a default here, and the limits resolve_target fills in are.
    defaults = dict(Target({"kind": kind, "arch": "sm_50", **_CUDA_LIMITS}).export())
    defaults.pop("arch")
    return defaults


def _tags() -> dict[str, Any]:
    from forge_core.plugin_manager import get_plugin_manager

    return get_plugin_manager().target_tags()


def _suggest(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=5, cutoff=0.5)
    if not close:
        # Tags are long; try matching on the last path component too.
        tail = word.rsplit("/", 1)[-1]
        close = [c for c in candidates if tail and tail.lower() in c.lower()][:5]
    return f" Did you mean: {', '.join(close)}?" if close else ""


def _typed(kind: str, key: str, value: str | None, schema: dict[str, str], source: str) -> Any:
    kind_type = schema[key]
    if kind_type == "bool":
        if value is None or value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise TargetError(f"Target option -{key} of {source!r} expects true or false, given {value!r}")
    if value is None:
        raise TargetError(f"Target option -{key} of {source!r} needs a value: -{key}=...")
    if kind_type == "int":
        try:
            return int(value)
        except ValueError:
            raise TargetError(f"Target option -{key} of {source!r} expects an integer, given {value!r}") from None
    if kind_type.startswith("Array"):
        return [part for part in value.split(",") if part]
    if kind_type == "target.Target":
        return target_config(value)
    return value


def _parse_cli(text: str) -> dict[str, Any]:
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise TargetError(f"Malformed target string {text!r}: {exc}") from exc
    kind, options = tokens[0], tokens[1:]
    schema = _kind_options(kind)
    config: dict[str, Any] = {"kind": kind}
    for token in options:
        if not token.startswith("-") or token.strip("-") == "":
            raise TargetError(
                f"Malformed target string {text!r}: {token!r} is not an option; options look like -key=value"
            )
        key, _, value = token.lstrip("-").partition("=")
        if key in _RETIRED_OPTIONS:
            warnings.warn(f"Target option -{key} in {text!r} is not supported by TVM 0.27 and is ignored", stacklevel=4)
            continue
        if key not in schema:
            raise TargetError(
                f"Unknown option -{key} for target kind {kind!r} in {text!r}."
                f"{_suggest(key, list(schema))} Known options: {', '.join(sorted(schema))}"
            )
        config[key] = _typed(kind, key, value if _ else None, schema, text)
    return config


def target_config(target: TargetLike, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The TVM config dict of ``target``, in any form Forge accepts."""
    if isinstance(target, Target):
        return plain_config(target)
    if isinstance(target, Mapping):
        config = dict(target)
        if "kind" not in config:
            raise TargetError(f"Target dict {config!r} has no 'kind' (e.g. 'llvm' or 'cuda')")
        for key in list(config):
            if key in _RETIRED_OPTIONS:
                warnings.warn(f"Target option {key!r} is not supported by TVM 0.27 and is ignored", stacklevel=3)
                del config[key]
        if isinstance(config.get("host"), (str, Mapping, Target)):
            config["host"] = target_config(config["host"], _seen)
        return config
    if not isinstance(target, str):
        raise TargetError(f"A target must be a string, dict or tvm.target.Target, not {type(target).__name__}")
    text = target.strip()
    if not text:
        raise TargetError("The target string is empty")
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TargetError(f"Target JSON {text!r} is malformed: {exc}") from exc
        if not isinstance(loaded, dict):
            raise TargetError(f"Target JSON {text!r} must be an object")
        return target_config(loaded, _seen)
    tags = _tags()
    if text in tags:
        if text in _seen:
            raise TargetError(f"Target tag {text!r} refers to itself through {' -> '.join(_seen)}")
        config = target_config(tags[text].target, _seen + (text,))
        config["tag"] = text
        return config
    first = text.split()[0]
    if first in _known_kinds():
        return _parse_cli(text)
    raise TargetError(
        f"Unknown target or tag {text!r}.{_suggest(text, sorted(tags) + _known_kinds())} "
        "List tags with forge.list_target_tags(), or give a target string such as 'llvm -mcpu=skylake'."
    )


def _check_llvm_cpu(target: Target, source: Any) -> None:
    """LLVM silently falls back to a generic CPU for an unknown -mcpu; Forge refuses it instead."""
    if target.kind.name != "llvm" or not target.attrs.get("mcpu"):
        return
    from tvm.target import codegen

    cpu = str(target.attrs["mcpu"])
    known = [str(c) for c in codegen.llvm_get_cpu_archlist(target)]
    if known and cpu not in known:
        triple = target.attrs.get("mtriple") or "the host triple"
        raise TargetError(f"Unknown CPU -mcpu={cpu} for {triple} in target {source!r}.{_suggest(cpu, known)}")


def host_cpu_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` of an ``llvm`` target that names no CPU: this machine's CPU and core count.

    ``"llvm"`` alone compiles for the machine compiling: its ``-mcpu`` (so AVX2 or
    AVX-512 is used), an ``-mattr`` that turns off each extension the CPU's
    model has and this CPU lacks (a virtual machine may hide AVX-512) or on
    each it has beyond the model (:func:`forge_core.targets.isa.host_mattr`),
    and, unless given, ``-num-cores`` from ``FORGE_NUM_THREADS`` or the cores
    this process may use. Name an ``-mcpu``, an ``-mtriple`` or a tag to build
    for another machine.
    """
    if config.get("kind") != "llvm" or config.get("mcpu") or config.get("mtriple"):
        return config
    from forge_core.targets.isa import host_mattr
    from forge_core.threads import default_thread_count

    filled = dict(config)
    filled["mcpu"] = str(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")())
    mattr = host_mattr(filled["mcpu"], list(config.get("mattr") or []))
    if mattr:
        filled["mattr"] = mattr
    filled.setdefault("num-cores", default_thread_count())
    return filled


def resolve_target(target: TargetLike, host: TargetLike | None = None, *, host_cpu: bool = True) -> Target:
    """A validated :class:`tvm.target.Target` for ``target`` and optional ``host``.

    With ``host_cpu`` (the default), an ``llvm`` target naming no CPU becomes
    this machine's CPU (:func:`host_cpu_config`).
    """
    fill = host_cpu_config if host_cpu else dict
    config = fill(target_config(target))
    if config.get("kind") == "cuda":
        # Every NVIDIA GPU since sm_50 gives a block 48 KiB of shared memory without opt-in and 1024 threads;
        # absent, TVM's GPU rules logged "Target cuda missing 'max_shared_memory_per_block'" once per kernel.
        for key, value in _CUDA_LIMITS.items():
            config.setdefault(key, value)
        if "arch" not in config:
            # TVM chose sm_50 where no GPU is present, which CUDA 13's nvcc no longer builds: this machine's GPU,
            # else the oldest arch CUDA 13 builds for, whose PTX every later GPU runs.
            from forge_core.compiler.cuda_code import default_arch

            config["arch"] = default_arch()
    host_config = target_config(host) if host is not None else config.pop("host", None)
    if host_config is not None:
        host_config = fill(host_config)
    config.pop("host", None)
    try:
        resolved = Target(config, host=host_config) if host_config is not None else Target(config)
    except (tvm.error.TVMError, ValueError, TypeError, RuntimeError) as exc:
        raise TargetError(f"Invalid target {target!r}: {exc}") from exc
    _check_llvm_cpu(resolved, target)
    if resolved.host is not None:
        _check_llvm_cpu(resolved.host, host if host is not None else target)
    return resolved


def _same(default: Any, value: Any) -> bool:
    if isinstance(default, (list, tuple)):
        default = ",".join(str(v) for v in default)
    elif isinstance(default, bool):
        default = "true" if default else "false"
    return default == value


def to_python(value: Any) -> Any:
    """A TVM container (Target, Map, Array) as plain Python dicts, lists and scalars."""
    if isinstance(value, Target):
        value = value.export()
    if hasattr(value, "items"):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [to_python(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


def plain_config(target: Target) -> dict[str, Any]:
    """``target``'s config as a plain dict, without TVM's derived ``feature.*`` keys or an empty tag."""
    config = to_python(target)
    for key in [k for k in config if k.startswith("feature.") or (k == "tag" and not config[k])]:
        del config[key]
    if isinstance(config.get("host"), dict):
        config["host"] = {k: v for k, v in config["host"].items() if not k.startswith("feature.") and k != "tag"}
    return config


def target_to_string(target: Target) -> str:
    """A docs-style string for ``target``: ``"llvm -mtriple=... -mcpu=..."`` (host not included)."""
    config = plain_config(target)
    kind = config.pop("kind")
    parts = [kind]
    defaults = _kind_defaults(kind)
    for key, value in config.items():
        if key in ("tag", "host", "keys") or value in ("", None):
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        if key in defaults and _same(defaults[key], value):
            continue
        parts.append(f"-{key}={value}")
    return " ".join(parts)
