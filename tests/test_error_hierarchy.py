"""Every error forge_core and the plugins raise is a :class:`forge.ForgeError` (issue 38 item 5).

A ``raise`` of a built-in exception class (``raise ValueError(...)``, ``raise
NotImplementedError``) is refused anywhere under ``forge_core/`` and ``plugins/``;
the ForgeError subclasses of :mod:`forge_core.errors` keep the built-in as a
second base (``OptionError(ForgeError, ValueError)``), so callers' ``except
ValueError`` still catch them. Re-raising what was caught (``raise``, ``raise
exc``) is not a raise of a class and is not concerned; neither are the
exceptions that are protocol rather than errors (``SystemExit``,
``KeyboardInterrupt``, a module ``__getattr__``'s ``AttributeError``, an import
hook's ``ModuleNotFoundError``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BUILTIN_ERRORS = frozenset({
    "Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "LookupError",
    "NotImplementedError", "AssertionError", "OSError", "FileNotFoundError", "ImportError",
})


def builtin_raises(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: raise Name`` for each ``raise Name(...)`` or ``raise Name`` of a built-in error in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(raised, ast.Name) and raised.id in BUILTIN_ERRORS:
            found.append((node.lineno, raised.id))
    return [f"{path.relative_to(root).as_posix()}:{line}: raise {name}" for line, name in sorted(found)]


def _sources() -> list[Path]:
    return sorted(p for folder in ("forge_core", "plugins") for p in (ROOT / folder).rglob("*.py"))


def test_forge_core_and_the_plugins_raise_only_forge_errors():
    files = _sources()
    assert any(p.parts[-2:] == ("forge_core", "errors.py") for p in files)
    assert any("plugins" in p.parts for p in files)
    offending = [entry for path in files for entry in builtin_raises(path)]
    assert not offending, (
        "raise a ForgeError subclass of forge_core.errors (with the built-in as its second base) instead of:\n"
        + "\n".join(offending)
    )


def test_the_check_finds_builtin_raises(tmp_path):
    module = tmp_path / "forge_core" / "bad.py"
    module.parent.mkdir()
    module.write_text(
        "from forge_core.errors import OptionError\n"
        "\n"
        "def f(x):\n"
        "    if x:\n"
        "        raise ValueError(f'bad {x}')\n"
        "    raise NotImplementedError\n"
        "\n"
        "def g(x):\n"
        "    try:\n"
        "        return int(x)\n"
        "    except ValueError as exc:\n"
        "        if x is None:\n"
        "            raise\n"
        "        if x == '':\n"
        "            raise exc\n"
        "        raise OptionError(f'bad {x}') from KeyError(x)\n"
    )
    assert builtin_raises(module, tmp_path) == [
        "forge_core/bad.py:5: raise ValueError",
        "forge_core/bad.py:6: raise NotImplementedError",
    ]


@pytest.mark.parametrize("name, builtin", [
    ("OptionError", ValueError), ("OptionTypeError", TypeError), ("ModelStateError", ValueError),
    ("ModelImportError", ValueError), ("InputError", ValueError), ("UnsupportedFeatureError", NotImplementedError),
    ("GraphLookupError", KeyError), ("MalformedDataError", ValueError), ("ProcessFailedError", RuntimeError),
    ("ExportProcessError", RuntimeError), ("TrackerProtocolError", RuntimeError),
    ("PluginDefinitionError", RuntimeError), ("PathNotFoundError", FileNotFoundError),
    ("MissingDependencyError", ImportError), ("FileAccessError", OSError),
])
def test_forge_errors_keep_their_builtin_base(name, builtin):
    from forge_core import errors

    cls = getattr(errors, name)
    assert issubclass(cls, errors.ForgeError) and issubclass(cls, builtin)


def test_export_process_error_is_a_compilation_error():
    from forge_core.errors import CompilationError, ExportProcessError

    assert issubclass(ExportProcessError, CompilationError)
