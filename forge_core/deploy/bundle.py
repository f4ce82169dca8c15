"""``forge bundle``: an artifact and the runtime that runs it, for a machine with Python 3 and numpy alone.

The directory holds::

    bundle.json          platform, Python, the model's files, sizes
    model/               model_library.so, its metadata, and modelKey.bin when encrypted
    lib/                 Forge's runtime (forge_core: runtime, security, errors), TVM's Python package with
                         its runtime library alone (libtvm_runtime.so; libtvm_runtime_cuda.so for a CUDA
                         artifact), tvm_ffi, typing_extensions; cryptography when the artifact is encrypted
    forge_runtime/       python3 -m forge_runtime --input x.npy --output y.npy (forge_core.runtime.board)

TVM's files come from the pinned ``apache-tvm`` wheel of the platform
(:mod:`forge_core.deploy.wheels`). The bundle is written to a staging
directory and moved into place when complete: nothing half-written.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from forge_core.deploy import wheels
from forge_core.errors import ForgeError, OptionError

# The compiler's Python (Relax, schedules, operator library) and sources: a runtime never imports them.
_TVM_SKIPPED = {"3rdparty", "src", "include", "web", "cmake", "testing", "relax", "s_tir", "topi", "contrib",
                "__pycache__"}
_FFI_SKIPPED = {"include", "cmake", "share", "3rdparty", "src", "cython", "__pycache__"}
_CORE_FILES = ("__init__.py", "py.typed", "errors.py", "threads.py", "tvm_import.py")
_CORE_PACKAGES = ("runtime", "security")
_PACKAGE_INIT = '''"""The bundled model's runtime: ``python3 -m forge_runtime`` or ``from forge_runtime import load``."""

import sys as _sys
from pathlib import Path as _Path

ROOT = _Path(__file__).resolve().parent.parent
if str(ROOT / "lib") not in _sys.path:
    _sys.path.insert(0, str(ROOT / "lib"))
from forge_core.runtime.board import open_model as _open_model, prepare as _prepare  # noqa: E402

_prepare(ROOT)
from forge_core.runtime import Runtime  # noqa: E402,F401


def load(password=None):
    """The bundled model's Runtime (its password for an encrypted one)."""
    return _open_model(ROOT, password)
'''
_PACKAGE_MAIN = '''import sys

from forge_runtime import ROOT
from forge_core.runtime.board import main

sys.exit(main(ROOT))
'''
_PACKAGE_RPC_SERVER = '''"""The board as a device of TVM's RPC tracker: ``python3 -m forge_runtime.rpc_server --tracker HOST:PORT
--key KEY`` (TVM's ``rpc_server`` options). Forge's ``run --rpc-tracker`` and tuning then reach it."""

import os
import runpy
import sys

from forge_runtime import ROOT

# TVM's server runs each session in a worker process of this Python: it needs the bundle's libraries too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "lib"), os.environ.get("PYTHONPATH")]))
sys.argv[0] = "forge_runtime.rpc_server"
runpy.run_module("tvm.exec.rpc_server", run_name="__main__", alter_sys=True)
'''


def _artifact_machine(document: dict, library: bytes, encrypted: bool) -> str | None:
    from forge_core.runtime.library_file import elf_machine

    if not encrypted:
        return elf_machine(library)
    features = document.get("cpu_features") or {}
    if features.get("arch"):
        return str(features["arch"])
    cpu = document.get("host") or document.get("target") or {}
    triple = str((cpu.get("config") or {}).get("mtriple") or "")
    return "aarch64" if triple.startswith(("aarch64", "arm64")) else "x86_64" if triple.startswith("x86_64") else None


def _extract(archive: Path, destination: Path, top: str, skipped: set[str],
             keep: Callable[[PurePosixPath], bool] = lambda path: True) -> None:
    with zipfile.ZipFile(archive) as wheel:
        for member in wheel.infolist():
            path = PurePosixPath(member.filename)
            if path.parts[0] != top or member.is_dir() or (len(path.parts) > 2 and path.parts[1] in skipped) \
                    or "__pycache__" in path.parts or path.suffix == ".pyc" or not keep(path):
                continue
            target = destination / Path(*path.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with wheel.open(member) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink)
            if path.suffix == ".so" or ".so." in path.name:
                target.chmod(0o755)


def _libraries(wanted: set[str]) -> Callable[[PurePosixPath], bool]:
    def keep(path: PurePosixPath) -> bool:
        return not (len(path.parts) > 2 and path.parts[1] == "lib") or path.name in wanted

    return keep


def _tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bundle(artifact: str | Path, platform: str = "linux-aarch64", output_path: str | Path = "bundle", *,
           python: str = "3.11", force_overwrite: bool = False) -> Path:
    """Write a directory that runs ``artifact`` on ``platform`` with Python ``python`` and numpy alone.

    Args:
        artifact: The directory ``compile()`` wrote (or its library file).
        platform: ``"linux-aarch64"`` (Raspberry Pi, Jetson, Arm servers) or ``"linux-x86_64"``.
        output_path: The bundle's directory.
        python: The board's Python, ``"3.11"`` (Debian 12, Raspberry Pi OS) or ``"3.12"``.
        force_overwrite: Replace a non-empty ``output_path``.

    Returns:
        The bundle's directory. On the board: ``cd DIR && python3 -m forge_runtime --input x.npy``.

    Raises:
        ForgeError: The platform does not match the library's machine, or a pinned wheel cannot be had.
        ValueError: An unknown platform or Python, or ``output_path`` is not empty.
    """
    from forge_core.compiler.staging import check_output_path
    from forge_core.files import StagedDirectory
    from forge_core.runtime import metadata as schema

    if platform not in wheels.PLATFORMS:
        raise OptionError(f"platform must be one of {', '.join(wheels.PLATFORMS)}, given {platform!r}")
    if python not in wheels.PYTHONS:
        raise OptionError(f"python must be one of {', '.join(wheels.PYTHONS)}, given {python!r}")
    library_path = schema.library_path(artifact)
    document, encrypted = schema.read_artifact(library_path)
    directory = library_path.parent
    machine = _artifact_machine(document, library_path.read_bytes(), encrypted)
    wanted = wheels.PLATFORMS[platform][0]
    if machine != wanted:
        raise ForgeError(f"{str(library_path)!r} is built for {machine or 'an unknown machine'}, and the bundle's "
                         f"platform {platform} runs {wanted}: compile for that platform (a raspberry-pi/ or arm/ "
                         f"tag for linux-aarch64), or bundle for linux-{machine}")
    device = str(document.get("device_type", "cpu"))
    output = Path(output_path)
    check_output_path(output, force_overwrite)
    requirements = wheels.RUNTIME + (wheels.ENCRYPTION if encrypted else ())
    archives = {req.split("==")[0]: wheels.wheel(req, platform, python) for req in requirements}

    stage = StagedDirectory(output, replace=True)
    with stage as root:
        model = root / "model"
        model.mkdir()
        files = [schema.LIBRARY_FILE] + [name for name in ("model_metadata.json", document.get("key_file"))
                                         if name and (directory / name).is_file()]
        for name in files:
            shutil.copyfile(directory / name, model / name)
        lib = root / "lib"
        runtime_libraries = {"libtvm_runtime.so"} | ({"libtvm_runtime_cuda.so"} if device == "cuda" else set())
        _extract(archives["apache-tvm"], lib, "tvm", _TVM_SKIPPED, _libraries(runtime_libraries))
        _extract(archives["apache-tvm-ffi"], lib, "tvm_ffi", _FFI_SKIPPED, _libraries({"libtvm_ffi.so", "libtvm_ffi_testing.so"}))  # core links both
        _extract(archives["typing-extensions"], lib, "typing_extensions.py", set())
        _extract(archives["cloudpickle"], lib, "cloudpickle", {"__pycache__"})
        if encrypted:
            _extract(archives["cryptography"], lib, "cryptography", {"__pycache__"})
            _extract(archives["cffi"], lib, "cffi", {"__pycache__"})
            with zipfile.ZipFile(archives["cffi"]) as wheel:  # the compiled backend sits beside the package
                for name in wheel.namelist():
                    if name.startswith("_cffi_backend"):
                        _extract(archives["cffi"], lib, name, set())
            _extract(archives["pycparser"], lib, "pycparser", {"__pycache__"})
        core = Path(__file__).resolve().parent.parent
        (lib / "forge_core").mkdir()
        for name in _CORE_FILES:
            shutil.copyfile(core / name, lib / "forge_core" / name)
        for package in _CORE_PACKAGES:
            shutil.copytree(core / package, lib / "forge_core" / package, ignore=shutil.ignore_patterns("__pycache__"))
        launcher = root / "forge_runtime"
        launcher.mkdir()
        (launcher / "__init__.py").write_text(_PACKAGE_INIT)
        (launcher / "__main__.py").write_text(_PACKAGE_MAIN)
        (launcher / "rpc_server.py").write_text(_PACKAGE_RPC_SERVER)
        description = {
            "platform": platform, "python": python, "device": device, "model": "model",
            "files": files, "encrypted": encrypted,
            **({"key_file": document.get("key_file"), "password_env": "FORGE_PASSWORD"} if encrypted else {}),
            "uuid": document.get("uuid"), "tvm_version": document.get("tvm_version"),
            "runtime_bytes": _tree_size(lib) + _tree_size(launcher), "model_bytes": _tree_size(model),
            "wheels": sorted(path.name for path in archives.values()),
        }
        (root / "bundle.json").write_text(json.dumps(description, indent=1) + "\n")
        stage.commit()
    return output
