"""Artifact integrity: every library carries a checksum the runtime verifies before anything maps it.

A truncated library used to kill the process with SIGBUS inside ``Runtime(...)``, and a library with one
byte flipped loaded and ran without a word. Each damaged library here runs in a fresh process, so a crash
would show as one (its return code), not take the test run with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from model_factory import conv_bn_net

import forge
from forge_core.runtime import Runtime
from forge_core.runtime.library_file import CHECKSUM_MAGIC, content_digest, seal, verify

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    for name, seed in (("a", 41), ("b", 42)):
        forge.from_onnx(conv_bn_net(seed=seed)).compile(output_path=root / name, export_metadata=True)
    return root


def _load_in_fresh_process(library: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from forge_core.runtime import Runtime; from forge_core.errors import ForgeError\n"
            "try:\n    r = Runtime(sys.argv[1]); r.infer(*r.example_inputs()); print('loaded')\n"
            "except ForgeError as exc:\n    print(type(exc).__name__ + ': ' + str(exc)); sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True, text=True, timeout=300)


def _damaged(artifacts: Path, tmp_path: Path, damage) -> Path:
    directory = tmp_path / "damaged"
    shutil.copytree(artifacts / "a", directory)
    library = directory / "model_library.so"
    original = library.read_bytes()
    changed = damage(original, (artifacts / "b" / "model_library.so").read_bytes())
    assert changed != original
    library.write_bytes(changed)
    (directory / "model_metadata.json").unlink()  # the library's own checksum is what is tested here
    return library


def _splice(data: bytes, other: bytes) -> bytes:
    """``data`` with 4,000 bytes of ``other`` where the two differ (the weights; the code is the same)."""
    start = next(i for i in range(0, min(len(data), len(other)) - 4000, 64) if data[i:i + 64] != other[i:i + 64])
    return data[:start] + other[start:start + 4000] + data[start + 4000:]


@pytest.mark.parametrize("damage, message", [
    # Half a library: whether the half still holds the embedded metadata depends on the library's layout, and
    # the error says "no checksum at its end: it is truncated" or "not a Forge library, or a truncated one".
    (lambda d, other: d[:len(d) // 2], "truncated"),
    (lambda d, other: d[:-1], "carries no Forge checksum"),
    (lambda d, other: d[:len(d) // 2] + bytes([d[len(d) // 2] ^ 1]) + d[len(d) // 2 + 1:],
     "was modified or corrupted: the checksum of its"),
    (lambda d, other: _splice(d, other), "was modified or corrupted"),  # a range of another model's library
    (lambda d, other: d[:1000] + d[2000:], "truncated: its checksum covers"),  # a range lost, trailer intact
    (lambda d, other: d[:-56] + b"\0" * 64 + d[-56:], "extended"),
    (lambda d, other: d[:-40] + bytes(32) + d[-8:], "was modified or corrupted"),  # the recorded digest itself
])
def test_a_damaged_library_is_refused_before_it_is_mapped(artifacts, tmp_path, damage, message):
    library = _damaged(artifacts, tmp_path, damage)
    done = _load_in_fresh_process(library)
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr[-2000:])  # no SIGBUS (-7)
    assert done.stdout.startswith("ArtifactCorruptedError: ") and message in done.stdout, done.stdout
    assert str(library) in done.stdout


def test_an_intact_library_loads_and_its_sha256_is_the_files(artifacts):
    runtime = Runtime(artifacts / "a")
    data = (artifacts / "a" / "model_library.so").read_bytes()
    assert data[-56:-40] == CHECKSUM_MAGIC and data.startswith(b"\x7fELF")
    assert data[-40:-8] == content_digest(data[:-56])
    meta = runtime.get_metadata()
    assert meta["library"]["sha256"] == json.loads((artifacts / "a" / "model_metadata.json").read_text())[
        "library"]["sha256"]
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(runtime.infer(x)[0], forge.from_onnx(conv_bn_net(seed=41)).get_inference_function()(x),
                               rtol=1e-5, atol=1e-5)


def test_the_metadata_json_is_cross_checked(artifacts, tmp_path):
    directory = tmp_path / "mixed"
    shutil.copytree(artifacts / "a", directory)
    shutil.copy(artifacts / "b" / "model_library.so", directory / "model_library.so")  # a valid library, not its own
    with pytest.raises(forge.ArtifactCorruptedError, match="is not the library .*model_metadata.json' describes"):
        Runtime(directory)
    (directory / "model_metadata.json").write_text("{not json")
    with pytest.raises(forge.ArtifactCorruptedError, match="is not a valid metadata JSON document"):
        Runtime(directory)
    (directory / "model_metadata.json").unlink()
    assert Runtime(directory).uuid == Runtime(artifacts / "b").uuid


def test_seal_and_verify_and_one_error_base_for_both_paths():
    content = np.random.default_rng(1).bytes(20_000_000)  # three 8 MiB chunks
    sealed = seal(content)

    verify(sealed, "x")
    assert sealed[-40:-8] == content_digest(content) and len(content_digest(content)) == 32
    assert issubclass(forge.CorruptLibraryError, forge.ArtifactCorruptedError)  # encrypted: AES-GCM says so
    with pytest.raises(forge.ArtifactCorruptedError, match="no Forge checksum"):
        verify(content, "x")


def test_forge_info_and_run_refuse_a_truncated_library(artifacts, tmp_path):
    library = _damaged(artifacts, tmp_path, lambda d, other: d[:len(d) // 3])
    forge_cli = str(Path(sys.executable).with_name("forge"))
    for command in ("info", "run"):
        done = subprocess.run([forge_cli, command, str(library.parent)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and "forge: error:" in done.stderr and "truncated" in done.stderr, done.stderr
