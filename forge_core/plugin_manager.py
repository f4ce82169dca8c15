"""Finding, loading and querying Forge plugins.

Order of registration, as in pytest and tox:

1. forge_core's built-in plugins (:data:`BUILTIN_PLUGINS`), registered exactly
   as an external plugin would be;
2. the entry points of group ``forge`` from installed distributions, narrowed
   by the environment variable ``FORGE_PLUGINS``;
3. a check that every hook implementation matches a spec in
   :mod:`forge_core.hookspecs`.

``FORGE_PLUGINS`` (unset by default: every installed plugin loads), a
comma-separated list, as pytest's ``-p``:

* ``FORGE_PLUGINS=""`` or ``FORGE_PLUGINS=none`` loads no external plugin;
* ``FORGE_PLUGINS=onnx,acme-tags`` loads only the entry points with those
  names or from those distributions (built-ins always load);
* ``FORGE_PLUGINS=no:cpu_schedules`` switches a plugin off, built-in or
  external (by plugin or distribution name); the rest load as usual. A
  third-party plugin of the same name then takes the built-in's place.
  The :data:`ESSENTIAL_PLUGINS` cannot be switched off.

A plugin that fails to import is skipped with a :class:`ForgePluginWarning`
naming it and the error. ``FORGE_TRACE_HOOKS=1`` writes every hook call, the
plugin it reached and its time to stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

import pluggy

from forge_core import hookspecs
from forge_core.errors import PluginConflictError, PluginError, PluginNotInstalledError

logger = logging.getLogger("forge.plugins")

ENTRY_POINT_GROUP = "forge"
PLUGINS_ENV = "FORGE_PLUGINS"
TRACE_ENV = "FORGE_TRACE_HOOKS"

BUILTIN_PLUGINS: tuple[str, ...] = (
    "forge_core.builtin.folding_passes",
    "forge_core.builtin.graph_passes",
    "forge_core.builtin.transform_passes",
    "forge_core.builtin.fast_math",
    "forge_core.builtin.inference_rewrites",
    "forge_core.builtin.cpu_schedules",
    "forge_core.builtin.target_tags",
    "forge_core.builtin.exporters",
)
"""Modules of forge_core registered as plugins, before any external one."""

ESSENTIAL_PLUGINS: frozenset[str] = frozenset({"folding_passes", "graph_passes", "exporters"})
"""Built-ins that ``FORGE_PLUGINS=no:NAME`` and :meth:`ForgePluginManager.unregister` refuse.

Import runs ``folding_passes``' passes on every model and ``compile()``
``graph_passes``' (the quantized operators' lowering among them); the
``exporters`` write the library and metadata that the runtime reads. The other
built-ins (schedules, tag sets, fast math, transforms) may be switched off or
replaced by a third-party plugin of the same name.
"""


class ForgePluginWarning(UserWarning):
    """A plugin could not be loaded and was skipped."""


# --------------------------------------------------------------------------
# What plugins register
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Frontend:
    """A model loader: ``load(model, **options) -> IRModule``."""

    name: str
    load: Callable[..., Any]
    plugin: str
    description: str = ""


@dataclass(frozen=True)
class PassSpec:
    """A named transform ``transform(mod, context) -> mod`` of TVM's Relax IR.

    ``order``, ``targets`` and ``function_attrs`` concern ``schedule`` passes,
    which ``compile()`` runs without being asked by name (see
    :func:`forge_core.hookspecs.register_passes`).
    """

    name: str
    transform: Callable[..., Any]
    plugin: str
    stage: str = "optimize"
    description: str = ""
    sets_flags: Mapping[str, bool] = field(default_factory=dict)
    discards_calibration: bool = False
    order: int = 0
    targets: tuple[str, ...] | None = None
    function_attrs: tuple[str, ...] | None = None

    def applies_to(self, mod: Any, target: Any) -> bool:
        """Whether this schedule pass runs on ``mod`` (a lowered ``tvm.IRModule``) for ``target``.

        Its ``targets`` hold ``target``'s kind (``"llvm"``, ``"cuda"``...) and,
        where it names ``function_attrs``, a PrimFunc of ``mod`` carries one.
        """
        if self.targets is not None and (target is None or target.kind.name not in self.targets):
            return False
        if self.function_attrs is None:
            return True
        for func in mod.functions.values():
            attrs = getattr(func, "attrs", None)
            if attrs is not None and any(key in attrs for key in self.function_attrs):
                return True
        return False


@dataclass(frozen=True)
class TargetTag:
    """A named alias of a target."""

    name: str
    target: str | Mapping[str, Any]
    category: str
    note: str
    plugin: str


@dataclass(frozen=True)
class Exporter:
    """An artifact writer ``writer(artifact, directory) -> list[Path]``."""

    format: str
    write: Callable[..., Any]
    plugin: str
    description: str = ""


@dataclass(frozen=True)
class Converter:
    """An operator converter for one frontend (see ``register_converters``)."""

    frontend: str
    domain: str
    op_type: str
    convert: Callable[..., Any]
    plugin: str
    description: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """One loaded plugin, as :func:`forge.list_plugins` reports it."""

    name: str
    version: str
    distribution: str
    hooks: tuple[str, ...]
    builtin: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "distribution": self.distribution,
            "hooks": list(self.hooks),
            "builtin": self.builtin,
        }


PASS_STAGES = ("import", "optimize", "schedule", "transform")

T = TypeVar("T")


# --------------------------------------------------------------------------
# The manager
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginSelection:
    """Which plugins load: what ``FORGE_PLUGINS`` says.

    ``allowed``: the external plugins (entry-point or distribution names) that
    may load, ``None`` for every one. ``disabled``: plugins switched off with
    ``no:NAME``, built-in or external.
    """

    allowed: frozenset[str] | None = None
    disabled: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, raw: str | None) -> PluginSelection:
        """Read a ``FORGE_PLUGINS`` value (``None``: unset)."""
        if raw is None:
            return cls()
        parts = [part.strip() for part in raw.split(",") if part.strip()]
        disabled = frozenset(part[3:].strip() for part in parts if part.lower().startswith("no:"))
        named = [part for part in parts if not part.lower().startswith("no:")]
        if "" in disabled:
            raise PluginError(f"{PLUGINS_ENV}={raw!r} holds 'no:' without a plugin name; write no:NAME")
        if not parts or any(part.lower() in ("none", "0") for part in named):
            return cls(frozenset(), disabled)
        return cls(frozenset(named) if named else None, disabled)

    @classmethod
    def from_environment(cls) -> PluginSelection:
        """The selection ``FORGE_PLUGINS`` makes now."""
        return cls.parse(os.environ.get(PLUGINS_ENV))


def _forge_core_version() -> str:
    try:
        return importlib.metadata.version("forge-core")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class ForgePluginManager:
    """Loads Forge's plugins and gives typed access to what they register.

    Callers use :meth:`frontends`, :meth:`passes`, :meth:`target_tags` and
    :meth:`exporters`; they never call ``pm.hook.*`` themselves.
    """

    def __init__(
        self,
        builtin_plugins: Iterable[str] = BUILTIN_PLUGINS,
        load_entry_points: bool = True,
        selection: PluginSelection | None = None,
    ) -> None:
        """Register ``builtin_plugins``, then the entry points, as ``selection`` says.

        ``selection`` defaults to what ``FORGE_PLUGINS`` says
        (:meth:`PluginSelection.from_environment`).
        """
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self._meta: dict[str, tuple[str, str, bool]] = {}  # name -> (distribution, version, builtin)
        self._cache: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self.selection = selection if selection is not None else PluginSelection.from_environment()
        refused = sorted(self.selection.disabled & ESSENTIAL_PLUGINS)
        if refused:
            raise PluginError(
                f"{PLUGINS_ENV} switches off {', '.join(map(repr, refused))}, which Forge cannot run without "
                f"(essential plugins: {', '.join(sorted(ESSENTIAL_PLUGINS))}). "
                f"Remove {', '.join('no:' + name for name in refused)} from {PLUGINS_ENV}."
            )
        if os.environ.get(TRACE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
            tracer = _HookTracer()
            self.pm.add_hookcall_monitoring(tracer.before, tracer.after)
        version = _forge_core_version()
        seen: set[str] = set()
        for module_name in builtin_plugins:
            name = module_name.rsplit(".", 1)[-1]
            if name in self.selection.disabled:
                seen.add(name)
                logger.debug("built-in plugin %s switched off by %s", name, PLUGINS_ENV)
                continue
            module = importlib.import_module(module_name)
            self._register(module, name, "forge-core", version, builtin=True)
        if load_entry_points:
            seen |= self._load_entry_points(builtin_names={m.rsplit(".", 1)[-1] for m in builtin_plugins})
        unknown = sorted(self.selection.disabled - seen)
        if unknown:
            warnings.warn(
                f"{PLUGINS_ENV} switches off {', '.join(map(repr, unknown))}, but no installed plugin or "
                f"distribution has that name; loaded plugins: {', '.join(self._meta)}",
                ForgePluginWarning,
                stacklevel=3,
            )
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(
                f"Plugin {self.pm.get_name(exc.plugin)!r} implements a hook that Forge does not define: "
                f"{exc}. Known hooks: {', '.join(hookspecs.HOOK_NAMES)}."
            ) from exc

    # -- registration ------------------------------------------------------

    def _register(self, plugin: ModuleType | object, name: str, dist: str, version: str, builtin: bool) -> None:
        if self.pm.has_plugin(name):
            first, _, first_builtin = self._meta[name]
            error = PluginConflictError("plugin name", name, first, dist)
            if first_builtin:
                error.args = (f"{error.args[0]} To replace Forge's built-in {name!r} with {dist!r}'s, switch the "
                              f"built-in off: {PLUGINS_ENV}=no:{name}.",)
            raise error
        self.pm.register(plugin, name=name)
        self._meta[name] = (dist, version, builtin)

    def register(self, plugin: ModuleType | object, name: str, version: str = "0") -> None:
        """Register a plugin object at run time (for tests and embedding applications)."""
        with self._lock:
            self._register(plugin, name, name, version, builtin=False)
            self.pm.check_pending()
            self._cache.clear()

    def plugin(self, name: str, *, kind: str = "plugin", extra: str | None = None) -> Any:
        """The registered plugin object ``name`` (a module, usually).

        Raises :class:`PluginNotInstalledError` (naming ``extra``) when no such plugin is loaded: not
        installed, or switched off by ``FORGE_PLUGINS``.
        """
        found = self.pm.get_plugin(name)
        if found is None:
            raise PluginNotInstalledError(kind, name, extra, available=list(self._meta))
        return found

    def unregister(self, name: str) -> object:
        """Remove the plugin ``name`` (built-in or not) and forget what it registered; return the plugin.

        Raises :class:`PluginError` for an :data:`ESSENTIAL_PLUGINS` member or a name no plugin has.
        """
        with self._lock:
            if name in ESSENTIAL_PLUGINS:
                raise PluginError(f"The plugin {name!r} is essential to Forge and cannot be unregistered "
                                  f"(essential plugins: {', '.join(sorted(ESSENTIAL_PLUGINS))}).")
            if not self.pm.has_plugin(name):
                raise PluginError(f"No plugin named {name!r} is registered; registered: {', '.join(self._meta)}")
            plugin = self.pm.unregister(name=name)
            del self._meta[name]
            self._cache.clear()
            return plugin

    def _load_entry_points(self, builtin_names: set[str]) -> set[str]:
        """Register the selected entry points; return the ``no:`` names that switched one off.

        ``no:NAME`` of a built-in switches off the built-in only, so that an
        entry point of that name takes its place; such an entry point is
        switched off by its distribution's name.
        """
        allowed, disabled = self.selection.allowed, self.selection.disabled
        switched_off: set[str] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist_name = ep.dist.name if ep.dist is not None else ep.name
            version = ep.dist.version if ep.dist is not None else "0"
            off = disabled & ({ep.name} - builtin_names | {dist_name})
            if off:
                switched_off |= off
                logger.debug("plugin %s (%s) switched off by %s", ep.name, dist_name, PLUGINS_ENV)
                continue
            if allowed is not None and ep.name not in allowed and dist_name not in allowed:
                logger.debug("plugin %s (%s) not selected by %s", ep.name, dist_name, PLUGINS_ENV)
                continue
            if self.pm.has_plugin(ep.name) and self._meta[ep.name][0] == dist_name:
                continue  # the same distribution seen twice on sys.path
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - any failure of a third party's import
                warnings.warn(
                    f"Forge plugin {ep.name!r} (distribution {dist_name} {version}) failed to load and was "
                    f"skipped: {type(exc).__name__}: {exc}",
                    ForgePluginWarning,
                    stacklevel=2,
                )
                continue
            self._register(plugin, ep.name, dist_name, version, builtin=False)
        return switched_off

    # -- collecting registrations -------------------------------------------

    def _collect(self, hook_name: str, kind: str, make: Callable[..., T],
                 key: Callable[[Any], str] | None = None) -> dict[str, T]:
        """Call every implementation of ``hook_name``; items are keyed by their name (or ``key(item)``)."""
        with self._lock:
            if hook_name in self._cache:
                return self._cache[hook_name]
            items: dict[str, Any] = {}
            # get_hookimpls() lists implementations in registration order. Each
            # plugin is called through pluggy (so FORGE_TRACE_HOOKS sees it) on
            # a subset hook caller holding only that plugin's implementations,
            # which tells which plugin registered each item.
            impls = getattr(self.pm.hook, hook_name).get_hookimpls()
            plugins: list[tuple[str, object]] = []
            for impl in impls:
                if not any(plugin is impl.plugin for _, plugin in plugins):
                    plugins.append((impl.plugin_name, impl.plugin))
            for plugin_name, plugin in plugins:

                def register(name: str, *args: Any, _plugin: str = plugin_name, **kwargs: Any) -> None:
                    item = make(name, *args, plugin=_plugin, **kwargs)
                    item_key = key(item) if key is not None else name
                    if item_key in items:
                        raise PluginConflictError(kind, item_key, items[item_key].plugin, _plugin)
                    items[item_key] = item

                others = [other.plugin for other in impls if other.plugin is not plugin]
                self.pm.subset_hook_caller(hook_name, remove_plugins=others)(register=register)
            self._cache[hook_name] = items
            return items

    def frontends(self) -> dict[str, Frontend]:
        """Every registered loader, by name."""
        return self._collect("register_frontends", "frontend", _make_frontend)

    def frontend(self, name: str, extra: str | None = None) -> Frontend:
        """The loader ``name``, or :class:`PluginNotInstalledError` naming the extra to install."""
        found = self.frontends()
        if name not in found:
            raise PluginNotInstalledError("frontend", name, extra, available=list(found))
        return found[name]

    def passes(self) -> dict[str, PassSpec]:
        """Every registered pass, by name."""
        return self._collect("register_passes", "pass", _make_pass)

    def get_pass(self, name: str, extra: str | None = None) -> PassSpec:
        """The pass ``name``, or :class:`PluginNotInstalledError` (naming ``extra``, the extra to install)."""
        found = self.passes()
        if name not in found:
            raise PluginNotInstalledError("pass", name, extra, available=list(found))
        return found[name]

    def target_tags(self) -> dict[str, TargetTag]:
        """Every registered target tag, by name."""
        return self._collect("register_target_tags", "target tag", _make_tag)

    def exporters(self) -> dict[str, Exporter]:
        """Every registered exporter, by format."""
        return self._collect("register_exporters", "exporter", _make_exporter)

    def exporter(self, fmt: str) -> Exporter:
        found = self.exporters()
        if fmt not in found:
            raise PluginNotInstalledError("exporter", fmt, available=list(found))
        return found[fmt]

    def converters(self, frontend: str) -> dict[tuple[str, str], Converter]:
        """The converters registered for ``frontend``, by ``(domain, op_type)``."""
        every = self._all_converters()
        return {(c.domain, c.op_type): c for c in every.values() if c.frontend == frontend}

    def _all_converters(self) -> dict[str, Converter]:
        return self._collect("register_converters", "converter", _make_converter,
                             key=lambda c: f"{c.frontend}:{c.domain or 'default'}:{c.op_type}")

    def registrations(self) -> dict[str, dict[str, int]]:
        """How many items of each kind every plugin registered: ``{plugin: {"passes": 3, ...}}``.

        Calls every hook (what ``forge plugins`` shows, and traces with ``FORGE_TRACE_HOOKS``).
        """
        counts: dict[str, dict[str, int]] = {}
        kinds: tuple[tuple[str, Callable[[], Mapping[Any, Any]]], ...] = (
            ("frontends", self.frontends), ("passes", self.passes), ("target tags", self.target_tags),
            ("exporters", self.exporters), ("converters", self._all_converters),
        )
        for kind, collect in kinds:
            for item in collect().values():
                plugin_counts = counts.setdefault(item.plugin, {})
                plugin_counts[kind] = plugin_counts.get(kind, 0) + 1
        return counts

    def list_plugins(self) -> list[PluginInfo]:
        """Each plugin's name, version, distribution and the hooks it implements."""
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            dist, version, builtin = self._meta.get(name, (name, "0", False))
            callers = self.pm.get_hookcallers(plugin) or []
            hooks = tuple(sorted(caller.name for caller in callers))
            infos.append(PluginInfo(name, version, dist, hooks, builtin))
        return infos


class _HookTracer:
    """``FORGE_TRACE_HOOKS``: one stderr line per hook call, its plugin(s) and its time.

    Written to ``sys.stderr`` itself, as datasette's tracing does, so that it
    shows whatever the logging configuration (the CLI logs warnings only).
    """

    def __init__(self) -> None:
        self._starts = threading.local()

    def before(self, hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
        stack = getattr(self._starts, "stack", None)
        if stack is None:
            stack = self._starts.stack = []
        stack.append(time.perf_counter())

    def after(self, outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl],
              kwargs: Mapping[str, Any]) -> None:
        stack = getattr(self._starts, "stack", None)
        elapsed = (time.perf_counter() - stack.pop()) * 1e3 if stack else float("nan")
        plugins = ", ".join(i.plugin_name for i in impls) or "-"
        line = f"forge: hook {hook_name} [{plugins}] {elapsed:.2f} ms"
        if outcome.exception is not None:
            line += f", raised {type(outcome.exception).__name__}: {outcome.exception}"
        print(line, file=sys.stderr, flush=True)


def _make_frontend(name: str, load: Callable[..., Any], *, plugin: str, description: str = "") -> Frontend:
    if not callable(load):
        raise PluginError(f"Plugin {plugin!r} registered frontend {name!r} with a loader that is not callable")
    return Frontend(str(name), load, plugin, description)


def _names(plugin: str, name: str, field_name: str, value: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        names = (value,)  # type: ignore[assignment]
    if not names or not all(isinstance(v, str) and v for v in names):
        raise PluginError(f"Plugin {plugin!r} registered pass {name!r} with {field_name}={value!r}; "
                          "expected a non-empty list of names, or None for every one")
    return names


def _make_pass(
    name: str, transform: Callable[..., Any], *, plugin: str, stage: str = "optimize", description: str = "",
    sets_flags: Mapping[str, bool] | None = None, discards_calibration: bool = False, order: int = 0,
    targets: Iterable[str] | str | None = None, function_attrs: Iterable[str] | str | None = None,
) -> PassSpec:
    if stage not in PASS_STAGES:
        raise PluginError(
            f"Plugin {plugin!r} registered pass {name!r} with stage {stage!r}; expected one of {PASS_STAGES}"
        )
    if not callable(transform):
        raise PluginError(f"Plugin {plugin!r} registered pass {name!r} with a transform that is not callable")
    if isinstance(order, bool) or not isinstance(order, int):
        raise PluginError(f"Plugin {plugin!r} registered pass {name!r} with order={order!r}; expected an int")
    if stage != "schedule" and (order or targets is not None or function_attrs is not None):
        raise PluginError(f"Plugin {plugin!r} registered pass {name!r} of stage {stage!r} with order, targets "
                          "or function_attrs; those select schedule passes only (other stages run by name)")
    return PassSpec(str(name), transform, plugin, stage, description, dict(sets_flags or {}),
                    bool(discards_calibration), order, _names(plugin, name, "targets", targets),
                    _names(plugin, name, "function_attrs", function_attrs))


def schedule_passes(passes: Iterable[PassSpec]) -> list[PassSpec]:
    """The ``schedule`` passes among ``passes`` in the order ``compile()`` runs them: ``order``, then name."""
    return sorted((p for p in passes if p.stage == "schedule"), key=lambda p: (p.order, p.name))


def _make_tag(
    name: str, target: str | Mapping[str, Any], *, plugin: str, category: str, note: str = ""
) -> TargetTag:
    if not isinstance(target, (str, Mapping)):
        raise PluginError(f"Plugin {plugin!r} registered tag {name!r} with a target of type {type(target).__name__}")
    return TargetTag(str(name), target if isinstance(target, str) else dict(target), str(category), str(note), plugin)


def _make_converter(
    frontend: str, op_type: str, convert: Callable[..., Any], *, plugin: str, domain: str = "", description: str = ""
) -> Converter:
    if not callable(convert):
        raise PluginError(f"Plugin {plugin!r} registered a {frontend} converter for {op_type!r} that is not callable")
    return Converter(str(frontend), str(domain), str(op_type), convert, plugin, description)


def _make_exporter(fmt: str, write: Callable[..., Any], *, plugin: str, description: str = "") -> Exporter:
    if not callable(write):
        raise PluginError(f"Plugin {plugin!r} registered exporter {fmt!r} with a writer that is not callable")
    return Exporter(str(fmt), write, plugin, description)


_manager: ForgePluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> ForgePluginManager:
    """The process-wide plugin manager, created on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = ForgePluginManager()
        return _manager


def reset_plugin_manager() -> None:
    """Forget the loaded plugins; the next call of :func:`get_plugin_manager` loads them again."""
    global _manager
    with _manager_lock:
        _manager = None
