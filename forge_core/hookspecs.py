"""The plugin author's contract: every hook Forge calls.

Forge uses pluggy with the *register-callback* style: each hook receives a
``register`` callable and calls it once per item it contributes. A plugin is a
module (or object) with functions decorated by :data:`hookimpl`, published on
the entry-point group ``forge``::

    # pyproject.toml of a plugin
    [project.entry-points.forge]
    my_tags = "my_package.forge_plugin"

    # my_package/forge_plugin.py
    from forge_core.hookspecs import hookimpl

    @hookimpl
    def register_target_tags(register):
        register("acme/board-1", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a55",
                 category="arm", note="ACME Board 1, 4x Cortex-A55")

Forge's own frontends' glue, passes, tag sets and exporters are plugins that
implement these same hooks; the core never special-cases them (a built-in
runs where its registration says, e.g. its schedule pass's ``order``). Users
switch any plugin but the essential ones off with ``FORGE_PLUGINS=no:NAME``, and
a plugin of the same name may then take its place
(:mod:`forge_core.plugin_manager`).

Rules common to every hook:

* A hook returns ``None``; what it contributes goes through ``register``.
* Names are global across plugins. Two plugins registering the same frontend
  name, pass name, tag name or exporter format make the registry raise
  :class:`forge_core.errors.PluginConflictError`, naming both plugins.
* Hooks are called lazily, the first time Forge needs that kind of item, and
  once per process. A hook must therefore be cheap: import heavy frameworks
  (torch, tensorflow) inside the callables it registers, never at module level.
"""

from __future__ import annotations

from typing import Callable

import pluggy

PROJECT_NAME = "forge"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_frontends(register: Callable[..., None]) -> None:
    """Register model loaders.

    Call ``register(name, loader, *, description="")`` for each loader:

    ``name`` (str)
        The frontend's public name: ``"onnx"``, ``"torch"``, ``"tensorflow"``,
        ``"keras"``, ``"tflite"``, or a new one. ``forge.from_<name>`` and
        :func:`forge.load` dispatch on it.
    ``loader`` (callable)
        ``loader(model, **options) -> forge.IRModule``. It receives the user's
        arguments unchanged and returns a :class:`forge_core.ir.IRModule`.
        It raises :class:`forge_core.errors.ModelImportError` (or a subclass)
        for a model it cannot load, naming the unsupported operators.
    ``description`` (str)
        One line shown by ``forge plugins``.
    """


@hookspec
def register_passes(register: Callable[..., None]) -> None:
    """Register named transforms of TVM's IR.

    Call ``register(name, transform, *, stage="optimize", description="",
    sets_flags=None, discards_calibration=False, order=0, targets=None,
    function_attrs=None)``:

    ``name`` (str)
        Unique pass name, e.g. ``"fold_batch_norms"``.
    ``transform`` (callable)
        ``transform(mod: tvm.ir.IRModule, context: forge_core.passes.PassContext)
        -> tvm.ir.IRModule``. It takes a Relax ``IRModule`` and returns a new
        one; it must not mutate its input. ``context`` carries the target (or
        ``None`` outside compilation), the pass's options (what
        ``ir.apply_pass(name, **options)`` was given) and the module's
        ``params`` (read-only).
    ``stage`` (str)
        When the pass runs: ``"import"`` (while an IRModule is built),
        ``"optimize"`` (graph-level, before lowering), ``"schedule"``
        (after lowering, on TIR PrimFuncs) or ``"transform"`` (only when a
        user asks, like ``set_batch_size``). The ``import``, ``optimize`` and
        ``transform`` stages run only the passes their caller names
        (``compile()`` names its optimize passes by ``opt_level``;
        ``ir.apply_pass(name)`` any pass): registering makes such a pass
        *available*, and :func:`forge.list_passes` lists it. The ``schedule``
        stage is different: ``compile()`` runs **every** registered schedule
        pass that applies (``targets``, ``function_attrs``), by ``order``.
    ``description`` (str)
        One line shown by ``forge plugins`` and ``forge.list_passes()``; the
        transform's docstring when empty.
    ``sets_flags`` (dict)
        State flags the pass sets on the module, e.g. ``{"is_split_tensors": True}``.
    ``discards_calibration`` (bool)
        True when the pass changes the nodes that calibration statistics
        describe: ``apply_pass`` then refuses a calibrated module unless
        ``force=True``, which discards the statistics.
    ``order`` (int, schedule passes only)
        Schedule passes run by ascending ``order``, then name; each schedules
        the PrimFuncs it recognises and leaves the rest to the next one.
        Forge's ``cpu_default_schedules`` has order 100, so a pass of the
        default 0 sees the kernels before it.
    ``targets`` (list of str, schedule passes only)
        The target kinds the pass runs for (``["llvm"]``, ``["cuda"]``);
        ``None``: every target.
    ``function_attrs`` (list of str, schedule passes only)
        The pass runs only on a module holding a PrimFunc that carries one of
        these attributes (the kernels a frontend's converters marked);
        ``None``: on every module.
    """


@hookspec
def register_target_tags(register: Callable[..., None]) -> None:
    """Register target tags: named aliases of compilation targets.

    Call ``register(name, target, *, category, note)``:

    ``name`` (str)
        The tag, e.g. ``"raspberry-pi/5"``. Users pass it as ``target=``.
    ``target`` (str or dict)
        The target it stands for, in any form ``compile(target=...)`` takes:
        a docs-style string (``"llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76"``),
        a JSON string, or a dict with a ``"kind"`` key.
    ``category`` (str)
        Grouping used by the ``list_*_tags`` functions: ``"cuda"``, ``"x86"``,
        ``"arm"``, ``"android"``, or a new category.
    ``note`` (str)
        A one-line human description.
    """


@hookspec
def register_exporters(register: Callable[..., None]) -> None:
    """Register artifact writers, keyed by format.

    Call ``register(format, writer, *, description="")``:

    ``format`` (str)
        The format's key, e.g. ``"library"``, ``"ir-text"``, ``"metadata"``.
    ``writer`` (callable)
        ``writer(artifact: forge_core.compiler.Artifact, directory: pathlib.Path)
        -> list[pathlib.Path]``: writes its files into ``directory`` (a
        temporary directory that Forge moves into place when every writer
        succeeded) and returns the paths it wrote.
    ``description`` (str)
        One line shown by ``forge plugins``.
    """


@hookspec
def register_converters(register: Callable[..., None]) -> None:
    """Register operator converters that a frontend uses before its own.

    Call ``register(frontend, op_type, converter, *, domain="", description="")``:

    ``frontend`` (str)
        The frontend that uses it, e.g. ``"onnx"``.
    ``op_type`` (str)
        The source framework's operator name (for ONNX, the node's ``op_type``).
    ``converter`` (callable)
        Called as the frontend that uses it defines; the frontend's plugin
        documents that signature and the types it passes (the ``"onnx"``
        frontend's: the docstring of the ``forge_onnx.converters`` package).
        A converter raises an exception naming what is unsupported; the
        frontend reports it with the node's name.
    ``domain`` (str)
        The operator's domain: ``""`` for ONNX's default one.
    ``description`` (str)
        One line shown by ``forge plugins``.

    A registered converter takes precedence over the frontend's built-in
    conversion of the same operator; two plugins registering one
    (frontend, domain, op_type) conflict.
    """


HOOK_NAMES: tuple[str, ...] = (
    "register_frontends",
    "register_passes",
    "register_target_tags",
    "register_exporters",
    "register_converters",
)

__all__ = ["hookspec", "hookimpl", "HOOK_NAMES", "PROJECT_NAME"]
