"""The import rules: forge_core and the plugins never import the ``forge`` facade, plugins never import each
other, and the runtime side imports nothing of the compiler."""

from __future__ import annotations

import ast
from pathlib import Path

import forge_core

CORE = Path(forge_core.__file__).parent


def _facade_imports(path: Path, root: Path = CORE.parent) -> list[str]:
    """``file:line: statement`` for each import of ``forge`` or ``forge.*`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        else:
            continue
        for name in names:
            if name == "forge" or name.startswith("forge."):
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_forge_core_does_not_import_the_forge_facade():
    files = sorted(CORE.rglob("*.py"))
    assert files
    offending = [entry for path in files for entry in _facade_imports(path)]
    assert not offending, "forge_core imports the forge facade:\n" + "\n".join(offending)


PLUGINS = CORE.parent / "plugins"
PLUGIN_PACKAGES = ("forge_onnx", "forge_torch", "forge_tf", "forge_tensorrt")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.append((node.lineno, node.module))
    return found


def test_plugins_import_neither_the_facade_nor_each_other():
    offending = []
    for package in PLUGIN_PACKAGES:
        files = sorted((PLUGINS / package / package).rglob("*.py"))
        assert files, package
        others = [p for p in PLUGIN_PACKAGES if p != package]
        for path in files:
            offending += _facade_imports(path, PLUGINS)
            for line, module in _imported_modules(path):
                if module.split(".")[0] in others:
                    offending.append(f"{path.relative_to(PLUGINS).as_posix()}:{line}: imports {module}")
    assert not offending, "a plugin imports the facade or another plugin:\n" + "\n".join(offending)


def test_the_check_finds_a_facade_import(tmp_path):
    module = tmp_path / "forge_core" / "bad.py"
    module.parent.mkdir()
    module.write_text("import os\n\ndef f():\n    from forge.x import y\n    import forge\n")
    assert _facade_imports(module, tmp_path) == [
        "forge_core/bad.py:4: from forge.x import y",
        "forge_core/bad.py:5: import forge",
    ]


_COMPILER_SIDE = ("forge_core.compiler", "forge_core.ir", "forge_core.schedules", "forge_core.quantization",
                  "forge_core.graph", "forge_core.transforms", "forge_core.builtin", "forge_core.tuning",
                  "forge_core.loaders", "forge_core.cli")


def test_the_runtime_and_security_import_nothing_of_the_compiler():
    """The light runtime (and the decryption it uses, and ``forge rpc-server`` on a board) ships without the
    compiler side."""
    offending = [f"{path.relative_to(CORE.parent)}:{line}: {name}"
                 for package in ("runtime", "security", "remote") for path in sorted((CORE / package).rglob("*.py"))
                 for line, name in _imports(path) if name.startswith(_COMPILER_SIDE)]
    assert not offending, "\n".join(offending)


_TVM_RUNTIME_SIDE = ("tvm.runtime", "tvm.rpc", "tvm.base", "tvm.libinfo", "tvm.error")


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for each import in ``path``; ``from tvm import relax`` gives ``tvm.relax``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "tvm":
            found += [(node.lineno, f"tvm.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return found


def _tvm_compiler_imports(path: Path, root: Path = CORE.parent) -> list[str]:
    """``file:line: module`` for each import of a TVM module beyond its runtime library's (``tvm.relax``,
    ``tvm.target``...)."""
    return [f"{path.relative_to(root).as_posix()}:{line}: {name}" for line, name in _imports(path)
            if name.startswith("tvm.") and not name.startswith(_TVM_RUNTIME_SIDE)]


def test_the_runtime_imports_only_tvm_runtime_library(tmp_path):
    """A board has TVM's runtime library and not its compiler library; ``from tvm import relax`` loads the
    latter (the runtime used ``relax.VirtualMachine``). The runtime run on the runtime library alone:
    tests/test_encryption.py."""
    files = [*sorted((CORE / "runtime").rglob("*.py")), *sorted((CORE / "security").rglob("*.py")),
             CORE / "remote" / "runtime.py", CORE / "remote" / "server.py"]
    offending = [entry for path in files for entry in _tvm_compiler_imports(path)]
    assert not offending, "\n".join(offending)
    probe = tmp_path / "probe.py"
    probe.write_text("import tvm\nfrom tvm import relax\nfrom tvm.runtime.vm import VirtualMachine\n"
                     "import tvm.target\n")
    assert _tvm_compiler_imports(probe, tmp_path) == ["probe.py:2: tvm.relax", "probe.py:4: tvm.target"]



def test_the_runtime_imports_no_tvm_package_and_the_compiler_no_torch():
    """In a fresh process: ``forge_core.runtime`` leaves TVM's Python package unimported (tvm_ffi drives the
    runtime library); the compiler side's ``import tvm``, wherever it first happens, leaves torch unimported
    (tvm_ffi and tvm import it whenever it is installed: a second and hundreds of MB), and torch then imports
    as usual."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import forge_core.runtime\n"
        "assert 'tvm' not in sys.modules and 'tvm_ffi' in sys.modules, sorted(sys.modules)\n"
        "from forge_core.compiler.compile import compile_to_function\n"
        "from tvm import relax\n"
        "assert 'tvm' in sys.modules and 'torch' not in sys.modules\n"
        "import torch\n"
        "print('ok', torch.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok torch", done.stderr[-2000:]

def test_only_the_loaders_import_the_ir_module_class_inside_forge_core():
    """The compiler, quantization, tuning and graph API take a module as ``forge_core.ir.parts.ModuleParts``:
    ``ir/module.py`` imports them (lazily), and an import back would close a circle through it."""
    importers = sorted(
        path.relative_to(CORE).as_posix()
        for path in CORE.rglob("*.py")
        if path.name != "module.py" or path.parent.name != "ir"
        if any(module == "forge_core.ir.module" for _, module in _imported_modules(path))
    )
    assert importers == ["loaders.py"], importers
