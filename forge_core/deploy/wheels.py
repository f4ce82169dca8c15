"""The wheels a bundle's runtime comes from: pinned, downloaded once, their SHA-256 checked.

TVM's runtime library for a board comes from the ``apache-tvm`` wheel of the
board's platform, its Python bindings from ``apache-tvm-ffi`` for the board's
Python; an encrypted artifact adds ``cryptography``. Each wheel is fetched
with pip (``pip download --no-deps --only-binary=:all:``, from the indexes
pip is configured for) into ``$FORGE_CACHE_DIR/wheels`` (default
``~/.cache/forge/wheels``) and accepted only when its SHA-256 is the one
pinned here. The versions are the ones Forge is installed with
(``constraints.txt``).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from forge_core import files
from forge_core.errors import ForgeError

PLATFORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "linux-x86_64": ("x86_64", ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")),
    "linux-aarch64": ("aarch64", ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64")),
}
"""A bundle's platform: its ELF machine and pip's platform tags for it."""

PYTHONS = ("3.11", "3.12")

PINNED: dict[str, dict[str, str]] = {
    "apache-tvm==0.27.0.post1": {
        "apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl":
            "4acfdb7653e4e1ba7a707bdf2833db72eb8fda7d04d99141f2a4e1da43171fb7",
        "apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl":
            "f503fc903b6e16fda5daacac6698ecb8bc38937f57da7aa29f6c7ab169d08657",
    },
    "apache-tvm-ffi==0.1.14.post1": {
        "apache_tvm_ffi-0.1.14.post1-cp311-cp311-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl":
            "c7a759781d4fbf2b99fa12f2741f250b882b06acc2747bb02831d491d1ac7d3c",
        "apache_tvm_ffi-0.1.14.post1-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
            "4b01a5a3fa07ed3315d5ef1e05d3542dae57a119ef7e77c54bc062414e242f65",
        "apache_tvm_ffi-0.1.14.post1-cp312-cp312-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl":
            "3fd2255a2e363a40c51ec1eeedb1110a2c74e443f95ae351ee5a81b5ff6808cf",
        "apache_tvm_ffi-0.1.14.post1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
            "eb759c039866b541ec2cb07d498082f8ba6ded74d58d9196180a5932f365c077",
    },
    "typing-extensions==4.16.0": {
        "typing_extensions-4.16.0-py3-none-any.whl":
            "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8",
    },
    "cryptography==50.0.2": {
        "cryptography-50.0.2-cp311-abi3-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
            "79def8d059362e7831389ed3be0ecdf58a89386e1271e35dd9f5af84e81bffd0",
        "cryptography-50.0.2-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl":
            "630ebfea3bf689d075f82316324ff7433dc447fe6bc1bfc76524b74b4a9567d2",
    },
    "cffi==2.1.1": {
        "cffi-2.1.1-cp311-cp311-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
            "3311ed60d36f83378794e1009ac6258bafbf81f7888b4caa7b35a521e3f95813",
        "cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl":
            "34e261f78cb6ceaaa36f42f2613f4380d94d9c759a9c73c769ee6e0247364632",
        "cffi-2.1.1-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
            "68e62fe11f30d5ca8289242866f0a5291402d8529ca2178ab8afc5c9694ae890",
        "cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl":
            "c1453022f490d2459a11819d83ad1d586e9ff65a12ac3e705ffebd46d3685dcf",
    },
    "cloudpickle==3.1.2": {
        "cloudpickle-3.1.2-py3-none-any.whl": "9acb47f6afd73f60dc1df93bb801b472f05ff42fa6c84167d25cb206be1fbf4a",
    },
    "pycparser==3.12": {
        "pycparser-3.12-py3-none-any.whl": "a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e",
    },
}
"""Each requirement, and the SHA-256 of each of its files that a bundle may take."""

# cloudpickle: TVM's RPC server (the bundle's ``forge_runtime.rpc_server``) starts its session workers with it.
RUNTIME = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "typing-extensions==4.16.0",
           "cloudpickle==3.1.2")
ENCRYPTION = ("cryptography==50.0.2", "cffi==2.1.1", "pycparser==3.12")


def cache_dir() -> Path:
    return files.cache_dir("wheels")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fits(filename: str, platform: str, python: str) -> bool:
    machine = PLATFORMS[platform][0]
    tag = "cp" + python.replace(".", "")
    parts = filename[:-4].split("-")
    python_tag, abi_tag, platform_tag = parts[-3], parts[-2], parts[-1]
    platform_ok = platform_tag == "any" or platform_tag.endswith(machine)
    python_ok = python_tag in ("py3", tag) or (abi_tag == "abi3" and python_tag <= tag)
    return platform_ok and python_ok


def wheel(requirement: str, platform: str, python: str) -> Path:
    """The cached wheel of ``requirement`` for ``platform`` and ``python``, downloaded when missing."""
    pinned = {name: digest for name, digest in PINNED[requirement].items() if _fits(name, platform, python)}
    if not pinned:
        raise ForgeError(f"Forge pins no {requirement} wheel for {platform} and Python {python}; bundles are "
                         f"built for Python {', '.join(PYTHONS)} on {', '.join(PLATFORMS)}")
    cache = cache_dir()
    for name, digest in pinned.items():
        cached = cache / name
        if cached.is_file() and _sha256(cached) == digest:
            return cached
    tags = [arg for tag in PLATFORMS[platform][1] for arg in ("--platform", tag)]
    with tempfile.TemporaryDirectory(prefix="forge-wheel-") as work:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--python-version", python, *tags, requirement, "-d", work]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ForgeError(f"pip could not download {requirement} for {platform} (Python {python}): "
                             f"{done.stderr.strip()[-800:]}")
        for found in Path(work).glob("*.whl"):
            if found.name in pinned:
                if _sha256(found) != pinned[found.name]:
                    raise ForgeError(f"{found.name}: its SHA-256 is not the pinned one; refusing it (a corrupt "
                                     "download, or a changed file on the index)")
                return files.write_file(cache / found.name, found.read_bytes())
        raise ForgeError(f"pip downloaded {[p.name for p in Path(work).glob('*.whl')]} for {requirement}, not one "
                         f"of the pinned files {sorted(pinned)}")
