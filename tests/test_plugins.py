"""The plugin core: built-ins first, entry points, checks, conflicts, install hints."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from model_factory import conv_bn_net
from plugin_dist import write_plugin_dist

import forge
from forge_core.errors import PluginConflictError, PluginError, PluginNotInstalledError
from forge_core.hookspecs import hookimpl
from forge_core.plugin_manager import (
    BUILTIN_PLUGINS,
    ESSENTIAL_PLUGINS,
    ForgePluginManager,
    ForgePluginWarning,
    PluginSelection,
    get_plugin_manager,
    reset_plugin_manager,
)

BUILTINS = {module.rsplit(".", 1)[-1] for module in BUILTIN_PLUGINS}

TOY_FRONTEND = '''
import numpy as np
import tvm
from tvm import relax
from forge_core.hookspecs import hookimpl
import forge


def load_linear(weight, *, bias=None):
    """A toy frontend: y = x @ weight (+ bias) as a Relax module."""
    weight = np.asarray(weight, dtype="float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, weight.shape[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(weight)))
            if bias is not None:
                y = bb.emit(relax.op.add(y, relax.const(np.asarray(bias, dtype="float32"))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return forge.IRModule(bb.get())


@hookimpl
def register_frontends(register):
    register("toy", load_linear, description="toy linear models")


@hookimpl
def register_passes(register):
    register("toy_identity", lambda mod, ctx: mod, stage="optimize", description="does nothing")
'''


@pytest.fixture
def site(tmp_path, monkeypatch, fresh_plugins):
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def test_builtins_and_the_onnx_plugin_are_listed(fresh_plugins):
    plugins = {p.name: p for p in forge.list_plugins()}
    builtin = plugins["folding_passes"]
    assert builtin.builtin and builtin.distribution == "forge-core" and builtin.hooks == ("register_passes",)
    onnx_plugin = plugins["onnx"]
    assert onnx_plugin.distribution == "forge-onnx"
    assert onnx_plugin.version == "0.1.0"
    assert onnx_plugin.hooks == ("register_converters", "register_frontends", "register_passes")
    assert not onnx_plugin.builtin
    # Built-ins register before external plugins.
    names = [p.name for p in forge.list_plugins()]
    assert names.index("folding_passes") < names.index("onnx")


def test_a_plugin_found_through_a_real_entry_point_adds_a_loader(site):
    write_plugin_dist(site, "forge-toy", "forge_toy_plugin", TOY_FRONTEND, entry_point="toy")
    plugins = {p.name: p for p in forge.list_plugins()}
    assert plugins["toy"].distribution == "forge-toy" and plugins["toy"].version == "1.0"
    assert plugins["toy"].hooks == ("register_frontends", "register_passes")
    weight = np.arange(6, dtype=np.float32).reshape(3, 2)
    ir = forge.load("toy", weight, bias=[1.0, -1.0])
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    np.testing.assert_allclose(ir.get_inference_function()(x), x @ weight + [1.0, -1.0])
    assert get_plugin_manager().get_pass("toy_identity").plugin == "toy"


def test_a_plugin_that_fails_to_import_warns_and_the_rest_load(site):
    write_plugin_dist(site, "forge-broken", "forge_broken_plugin", "raise RuntimeError('boom at import')\n")
    with pytest.warns(ForgePluginWarning, match=r"'forge-broken'.*RuntimeError: boom at import"):
        plugins = {p.name for p in forge.list_plugins()}
    assert "forge-broken" not in plugins
    assert "onnx" in plugins
    assert isinstance(forge.from_onnx(conv_bn_net()), forge.IRModule)


def test_two_plugins_with_the_same_loader_name_conflict_naming_both(site):
    source = '''
from forge_core.hookspecs import hookimpl
@hookimpl
def register_frontends(register):
    register("onnx", lambda model: None)
'''
    write_plugin_dist(site, "forge-onnx-clone", "forge_onnx_clone", source)
    with pytest.raises(PluginConflictError) as info:
        forge.from_onnx(conv_bn_net())
    message = str(info.value)
    assert "frontend 'onnx'" in message and "'onnx'" in message and "'forge-onnx-clone'" in message


def test_two_plugins_with_the_same_tag_conflict_naming_both(site):
    for n in (1, 2):
        source = f'''
from forge_core.hookspecs import hookimpl
@hookimpl
def register_target_tags(register):
    register("acme/board", "llvm -mcpu=cortex-a53", category="arm", note="board from plugin {n}")
'''
        write_plugin_dist(site, f"acme-tags-{n}", f"acme_tags_{n}", source)
    with pytest.raises(PluginConflictError, match=r"target tag 'acme/board'.*'acme-tags-1'.*'acme-tags-2'"):
        get_plugin_manager().target_tags()


def test_a_hook_that_matches_no_spec_is_rejected(site):
    source = '''
from forge_core.hookspecs import hookimpl
@hookimpl
def register_frontend(register):  # typo: the hook is register_frontends
    pass
'''
    write_plugin_dist(site, "forge-typo", "forge_typo_plugin", source)
    with pytest.raises(PluginError, match=r"'forge-typo'.*register_frontend.*Known hooks"):
        forge.list_plugins()


def test_environment_variable_disables_external_plugins(fresh_plugins, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "")
    names = {p.name for p in forge.list_plugins()}
    assert names == BUILTINS
    with pytest.raises(PluginNotInstalledError, match=r"pip install 'forge-core\[onnx\]'"):
        forge.from_onnx(conv_bn_net())


def test_environment_variable_restricts_external_plugins(site, monkeypatch):
    write_plugin_dist(site, "forge-toy", "forge_toy_plugin", TOY_FRONTEND, entry_point="toy")
    monkeypatch.setenv("FORGE_PLUGINS", "forge-toy")  # a distribution name
    names = {p.name for p in forge.list_plugins()}
    assert names == BUILTINS | {"toy"}


@pytest.mark.parametrize(
    "loader, extra",
    [("from_torch", "torch"), ("from_tensorflow", "tf"), ("from_keras", "tf"), ("from_tflite", "tf")],
)
def test_a_loader_whose_plugin_is_missing_names_the_extra(fresh_plugins, monkeypatch, loader, extra):
    monkeypatch.setenv("FORGE_PLUGINS", "onnx")
    with pytest.raises(PluginNotInstalledError) as info:
        getattr(forge, loader)(object())
    assert f"pip install 'forge-core[{extra}]'" in str(info.value)
    assert isinstance(info.value, ImportError)
    assert not isinstance(info.value, AttributeError)


def test_importing_forge_does_not_import_torch_or_tensorflow():
    code = (
        "import sys, forge; forge.list_plugins(); "
        "print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.strip() == "[]"


def test_hook_documentation_lists_every_hook():
    from forge_core import hookspecs

    for name in hookspecs.HOOK_NAMES:
        doc = getattr(hookspecs, name).__doc__
        assert doc and "register(" in doc, name


class _PassPlugin:
    """A run-time plugin registering one pass named ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    def register_passes(self, register):
        register(self.name, lambda mod, ctx: mod, description="does nothing")


def test_trace_hooks_writes_each_hook_call_its_plugin_and_time_to_stderr(monkeypatch, capsys):
    monkeypatch.setenv("FORGE_TRACE_HOOKS", "1")
    manager = ForgePluginManager(load_entry_points=False)
    manager.register(_PassPlugin("traced_identity"), name="tracer")
    passes = manager.passes()
    lines = capsys.readouterr().err.splitlines()
    assert any(re.fullmatch(r"forge: hook register_passes \[folding_passes\] \d+\.\d\d ms", line) for line in lines), lines
    assert any(re.fullmatch(r"forge: hook register_passes \[tracer\] \d+\.\d\d ms", line) for line in lines), lines
    # Each item is still attributed to the plugin that registered it.
    assert passes["traced_identity"].plugin == "tracer"
    assert passes["fold_constants"].plugin == "folding_passes"


def test_trace_hooks_shows_on_stderr_of_the_forge_command():
    forge_bin = shutil.which("forge", path=os.path.dirname(sys.executable)) or "forge"
    done = subprocess.run([forge_bin, "plugins"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FORGE_TRACE_HOOKS": "1", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    traced = [line for line in done.stderr.splitlines() if line.startswith("forge: hook ")]
    assert any("register_frontends [onnx]" in line for line in traced), done.stderr
    assert "folding_passes" in done.stdout and "forge: hook" not in done.stdout


def test_hook_calls_are_not_traced_without_trace_hooks(monkeypatch, capsys):
    monkeypatch.delenv("FORGE_TRACE_HOOKS", raising=False)
    manager = ForgePluginManager(load_entry_points=False)
    manager.passes()
    assert "forge: hook" not in capsys.readouterr().err


def test_no_prefix_switches_off_a_builtin_and_an_entry_point(fresh_plugins, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "no:cpu_schedules, no:onnx")
    names = {p.name for p in forge.list_plugins()}
    assert "cpu_schedules" not in names and "onnx" not in names
    assert BUILTINS - {"cpu_schedules"} <= names and "torch" in names  # the rest load as usual
    assert "cpu_default_schedules" not in get_plugin_manager().passes()
    with pytest.raises(PluginNotInstalledError, match=r"frontend 'onnx'"):
        forge.from_onnx(conv_bn_net())


def test_no_prefix_combines_with_an_allow_list(fresh_plugins, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "onnx,no:fast_math")
    names = {p.name for p in forge.list_plugins()}
    assert names == (BUILTINS - {"fast_math"}) | {"onnx"}


@pytest.mark.parametrize("name", sorted(ESSENTIAL_PLUGINS))
def test_an_essential_plugin_cannot_be_switched_off(fresh_plugins, monkeypatch, name):
    monkeypatch.setenv("FORGE_PLUGINS", f"no:{name}")
    with pytest.raises(PluginError, match=rf"switches off '{name}', which Forge cannot run without.*Remove no:{name}"):
        forge.list_plugins()
    with pytest.raises(PluginError, match=rf"'{name}' is essential"):
        ForgePluginManager(load_entry_points=False, selection=PluginSelection()).unregister(name)


def test_switching_off_a_name_no_plugin_has_warns(fresh_plugins, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "no:cpu_schedule")  # a typo
    with pytest.warns(ForgePluginWarning, match=r"'cpu_schedule'.*no installed plugin.*cpu_schedules"):
        forge.list_plugins()


def test_no_without_a_name_is_refused():
    with pytest.raises(PluginError, match="no:NAME"):
        PluginSelection.parse("onnx,no:")


REPLACEMENT_TAGS = """
from forge_core.hookspecs import hookimpl

@hookimpl
def register_target_tags(register):
    register("acme/board-1", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a55", category="arm",
             note="ACME Board 1")
"""


def test_a_third_party_plugin_replaces_a_switched_off_builtin_of_the_same_name(site, monkeypatch):
    # An installed distribution (outside the checkout) whose entry point is named like the built-in tag set.
    write_plugin_dist(site, "acme-tags", "acme_tags_plugin", REPLACEMENT_TAGS, entry_point="target_tags")
    with pytest.raises(PluginConflictError, match=r"'target_tags'.*'forge-core'.*'acme-tags'.*FORGE_PLUGINS=no:target_tags"):
        forge.list_plugins()
    reset_plugin_manager()
    monkeypatch.setenv("FORGE_PLUGINS", "no:target_tags")
    plugins = {p.name: p for p in forge.list_plugins()}
    assert plugins["target_tags"].distribution == "acme-tags" and not plugins["target_tags"].builtin
    tags = get_plugin_manager().target_tags()
    assert set(tags) == {"acme/board-1"} and tags["acme/board-1"].plugin == "target_tags"
    assert "raspberry-pi/5" not in tags  # the built-in set is gone, not merged


def test_unregister_removes_a_plugin_and_what_it_registered():
    manager = ForgePluginManager(load_entry_points=False, selection=PluginSelection())
    manager.register(_PassPlugin("short_lived"), name="visitor")
    assert "short_lived" in manager.passes()
    plugin = manager.unregister("visitor")
    assert isinstance(plugin, _PassPlugin)
    assert "short_lived" not in manager.passes()
    assert "visitor" not in {p.name for p in manager.list_plugins()}
    manager.unregister("fast_math")  # a built-in that is not essential
    assert "fast_math" not in manager.passes()
    with pytest.raises(PluginError, match=r"No plugin named 'visitor'"):
        manager.unregister("visitor")


def test_two_run_time_plugins_with_the_same_pass_conflict_naming_both():
    manager = ForgePluginManager(builtin_plugins=(), load_entry_points=False)
    manager.register(_PassPlugin("twin"), name="first")
    manager.register(_PassPlugin("twin"), name="second")
    with pytest.raises(PluginConflictError, match=r"pass 'twin'.*'first'.*'second'"):
        manager.passes()


# ----------------------------------------------------------------------
# Schedule passes: what they apply to, and in which order
# ----------------------------------------------------------------------


class _RecordingSchedules:
    """Three run-time schedule passes that record the order they ran in and leave the module as it is."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def _record(self, name):
        def transform(mod, context):
            self.ran.append(name)
            return mod
        return transform

    @hookimpl
    def register_passes(self, register):
        register("z_first", self._record("z_first"), stage="schedule", order=-5)
        register("a_second", self._record("a_second"), stage="schedule")  # default order 0
        register("gpu_only", self._record("gpu_only"), stage="schedule", targets=["cuda", "rocm"])
        register("marked_only", self._record("marked_only"), stage="schedule", function_attrs="acme.marked")
        register("after_forge", self._record("after_forge"), stage="schedule", order=200, targets="llvm")


def test_schedule_passes_run_by_order_for_their_targets_and_modules(fresh_plugins, tmp_path):
    from forge_core.plugin_manager import schedule_passes

    recorder = _RecordingSchedules()
    manager = get_plugin_manager()
    manager.register(recorder, "recording-schedules")
    builtin = manager.get_pass("cpu_default_schedules")
    assert (builtin.order, builtin.targets) == (100, ("llvm",))
    ordered = [p.name for p in schedule_passes(manager.passes().values())]
    assert ordered.index("z_first") < ordered.index("a_second") < ordered.index("cpu_default_schedules") \
        < ordered.index("after_forge")
    forge.from_onnx(conv_bn_net()).compile(output_path=tmp_path / "a", opt_level=0)
    assert (tmp_path / "a" / "model_library.so").is_file()
    # No GPU target and no PrimFunc carrying acme.marked: those two did not run; the built-in ran between.
    assert recorder.ran == ["z_first", "a_second", "after_forge"]


def test_the_recurrent_kernel_pass_applies_only_to_modules_with_recurrent_kernels():
    import tvm
    from model_factory import make_model
    from onnx import TensorProto, helper, numpy_helper

    from forge_core.compiler.pipeline import lower_to_tir

    spec = get_plugin_manager().get_pass("recurrent_kernels")
    assert spec.plugin == "onnx" and spec.targets is None
    target = tvm.target.Target("llvm")
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
               for name, shape in (("W", (1, 16, 4)), ("R", (1, 16, 4)))]
    lstm = make_model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=4, name="lstm")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, 4])], weights)
    for model, applies in ((lstm, True), (conv_bn_net(), False)):
        ir = forge.from_onnx(model)
        lowered = lower_to_tir(tvm.relax.transform.BindParams("main", ir.params)(ir.mod), target, 1)
        assert spec.applies_to(lowered, target) is applies


@pytest.mark.parametrize("options, message", [
    ({"stage": "optimize", "order": 3}, r"stage 'optimize' with order, targets or function_attrs"),
    ({"stage": "schedule", "order": "first"}, r"order='first'; expected an int"),
    ({"stage": "schedule", "targets": []}, r"targets=\[\]; expected a non-empty list"),
])
def test_schedule_pass_fields_are_checked(options, message):
    class Plugin:
        @hookimpl
        def register_passes(self, register):
            register("odd", lambda mod, ctx: mod, **options)

    manager = ForgePluginManager(builtin_plugins=(), load_entry_points=False, selection=PluginSelection())
    manager.register(Plugin(), name="odd-plugin")
    with pytest.raises(PluginError, match=rf"'odd-plugin' registered pass 'odd' .*{message}"):
        manager.passes()


class _ChecksumExporter:
    """A third-party exporter: a format of its own, written into every artifact."""

    @hookimpl
    def register_exporters(self, register):
        def write(artifact, directory):
            import hashlib

            library = directory / "model_library.so"
            path = directory / "model_library.sha256"
            path.write_text(hashlib.sha256(library.read_bytes()).hexdigest() + "\n")
            return [path]

        register("checksum", write, description="model_library.sha256")


def test_a_third_party_exporter_writes_into_every_artifact(fresh_plugins, tmp_path):
    import hashlib

    get_plugin_manager().register(_ChecksumExporter(), "checksum-exporter")
    forge.from_onnx(conv_bn_net()).compile(output_path=tmp_path / "a", opt_level=0, export_metadata=True)
    library = (tmp_path / "a" / "model_library.so").read_bytes()
    assert (tmp_path / "a" / "model_library.sha256").read_text().strip() == hashlib.sha256(library).hexdigest()
    assert (tmp_path / "a" / "model_metadata.json").is_file()
