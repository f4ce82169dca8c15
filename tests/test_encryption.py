"""Encrypted artifacts: compile(encrypt_password=...), the runtime's in-memory load, every error, a fuzz
run over the key file and the library, no plaintext on disk, and the command line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import onnxruntime as ort
import pytest
from model_factory import conv_bn_net

import forge
from forge_core import errors
from forge_core.runtime import Runtime
from forge_core.runtime import metadata as schema
from forge_core.security import encrypted_library as fmt

PASSWORD = "correct horse battery staple"
TESTS = Path(__file__).parent
FORGE = str(Path(sys.executable).with_name("forge"))
X = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
UUID = "00000000-0000-4000-8000-00000000e001"


def _onnxruntime(proto, x):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Two encrypted artifacts of two models, a plain one, and their reference outputs from onnxruntime."""
    root = tmp_path_factory.mktemp("enc")
    made = {}
    for name, seed in (("a", 31), ("b", 32)):
        proto = conv_bn_net(seed=seed)
        ir = forge.from_onnx(proto)
        ir.compile(output_path=root / name, encrypt_password=PASSWORD, export_metadata=True,
                   uuid=UUID if name == "a" else None)
        made[name] = (root / name, _onnxruntime(proto, X))
    forge.from_onnx(conv_bn_net(seed=31)).compile(output_path=root / "plain", uuid=UUID)
    made["plain"] = (root / "plain", made["a"][1])
    return made


def _open(directory: Path, key: Path | None = None, password: str | None = PASSWORD) -> Runtime:
    return Runtime(directory, directory / fmt.KEY_FILE if key is None else key, password)


@pytest.mark.parametrize("name", ["plain", "a"])
def test_the_runtime_needs_only_tvm_runtime_library(artifacts, name, tmp_path):
    """On a board there is TVM's runtime library (3 MB) and not its compiler library (260 MB): with
    ``TVM_USE_RUNTIME_LIB=1`` the compiler library is never loaded, and the runtime runs the plain and the
    encrypted artifact to the same numbers as in this process (the runtime used ``relax.VirtualMachine``,
    whose import needs the compiler). It does not import TVM's Python package either (0.23 s of its import
    time): tvm_ffi drives the runtime library."""
    from artifacts import run_in_fresh_process

    directory, want = artifacts[name]
    key = directory / fmt.KEY_FILE if name != "plain" else None
    outputs, report = run_in_fresh_process(directory, [X], tmp_path, key=key,
                                           password=PASSWORD if key else None, runtime_only=True)
    assert report["compiler_loaded"] is False
    assert report["tvm_imported"] is False
    here = Runtime(directory) if key is None else _open(directory)
    np.testing.assert_array_equal(outputs[0], here.infer(X)[0])
    np.testing.assert_allclose(outputs[0], want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------------------------------


def test_round_trip_matches_onnxruntime_and_the_plain_artifact(artifacts):
    out, reference = artifacts["a"]
    assert sorted(p.name for p in out.iterdir()) == ["modelKey.bin", "model_library.so", "model_metadata.json"]
    assert (out / "modelKey.bin").stat().st_mode & 0o777 == 0o600
    runtime = _open(out)
    (got,) = runtime.infer(X)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got, Runtime(artifacts["plain"][0]).infer(X)[0])
    assert runtime.uuid == UUID and runtime.input_names == ["x"] and runtime.output_shapes == [(1, 10)]


def test_the_library_holds_no_plaintext_and_its_metadata_reads_without_a_password(artifacts):
    out, _ = artifacts["a"]
    data = (out / "model_library.so").read_bytes()
    plain = (artifacts["plain"][0] / "model_library.so").read_bytes()
    assert data.startswith(fmt.LIBRARY_MAGIC) and plain[:64] not in data
    assert b"fused_conv2d" in plain and b"fused_conv2d" not in data  # kernel names are in the plaintext only
    document, encrypted = schema.read_artifact(out)
    assert encrypted and document["encrypted"] is True and document["key_file"] == "modelKey.bin"
    assert document["uuid"] == UUID and document["inputs"][0]["shape"] == [1, 3, 16, 16]
    assert "schedules" not in document  # kernel names stay inside
    assert "schedules" in _open(out).get_metadata()
    metadata = json.loads((out / "model_metadata.json").read_text())
    jsonschema.validate(metadata, schema.JSON_SCHEMA)
    assert metadata["encrypted"] is True and metadata["key_file"] == "modelKey.bin"
    assert "schedules" not in metadata
    assert _open(out).get_metadata()["encrypted"] is True  # the embedded document says so too


def test_quantized_model_round_trip(tmp_path):
    proto = conv_bn_net(seed=5)
    ir = forge.from_onnx(proto)
    rng = np.random.default_rng(1)
    ir.calibrate([rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)])
    ir.quantize(per_channel=True)
    expected = ir.get_inference_function()(X)
    ir.compile(output_path=tmp_path / "q", encrypt_password=PASSWORD)
    runtime = _open(tmp_path / "q")
    got = runtime.infer(X)[0]
    assert np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max() + 1e-5
    assert runtime.get_metadata()["precision"] == "int8"
    float_reference = _onnxruntime(proto, X)
    assert np.abs(got - float_reference).max() <= 0.1 * np.abs(float_reference).max()


def test_models_loaded_one_after_another_each_compute_their_own_numbers(artifacts):
    """A released runtime's descriptor number is reused, and dlopen caches by path: the second load must
    not return the first library (measured: it did before the runtime checked what it loaded)."""
    (a, ref_a), (b, ref_b) = artifacts["a"], artifacts["b"]
    for _ in range(2):
        first = _open(a)
        np.testing.assert_allclose(first.infer(X)[0], ref_a, rtol=1e-4, atol=1e-5)
        del first
        second = _open(b)
        np.testing.assert_allclose(second.infer(X)[0], ref_b, rtol=1e-4, atol=1e-5)
        both = _open(a)
        np.testing.assert_allclose(both.infer(X)[0], ref_a, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(second.infer(X)[0], ref_b, rtol=1e-4, atol=1e-5)
        del second, both


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------


def _copy(out: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    target.mkdir()
    for name in ("model_library.so", "modelKey.bin"):
        (target / name).write_bytes((out / name).read_bytes())
    return target


def test_missing_key_and_missing_password(artifacts):
    out, _ = artifacts["a"]
    with pytest.raises(errors.MissingKeyError, match="Model looks encrypted but no key provided.*modelKey.bin"):
        Runtime(out)
    with pytest.raises(errors.MissingKeyError):
        Runtime(out, password=PASSWORD)
    for password in (None, ""):
        with pytest.raises(errors.MissingPasswordError, match="needs its password, and none was given"):
            Runtime(out, out / "modelKey.bin", password)
    with pytest.raises(FileNotFoundError, match="No key file"):
        Runtime(out, out / "nokey.bin", PASSWORD)


def test_wrong_password(artifacts):
    out, _ = artifacts["a"]
    with pytest.raises(errors.WrongPasswordError, match="wrong password or corrupted key file"):
        _open(out, password=PASSWORD + "!")


def _edit_header(data: bytes, magic: bytes, old: bytes, new: bytes) -> bytes:
    """Replace ``old`` by ``new`` in a file's JSON header, keeping the length field right."""
    start = len(magic) + 4
    length = int.from_bytes(data[len(magic):start], "big")
    header = data[start:start + length]
    assert old in header
    header = header.replace(old, new)
    return magic + len(header).to_bytes(4, "big") + header + data[start + length:]


@pytest.mark.parametrize("damage, error, message", [
    (lambda k: k[:-1], errors.CorruptKeyError, "truncated"),
    (lambda k: k[:20], errors.CorruptKeyError, "truncated"),
    (lambda k: b"", errors.CorruptKeyError, "not a Forge key file"),
    (lambda k: k + b"\0", errors.CorruptKeyError, "extended"),
    (lambda k: b"X" + k[1:], errors.CorruptKeyError, "not a Forge key file"),
    (lambda k: _edit_header(k, fmt.KEY_MAGIC, b'"n":32768', b'"n":1073741824'), errors.CorruptKeyError,
     "scrypt parameters n=1073741824"),
    (lambda k: _edit_header(k, fmt.KEY_MAGIC, b'"r":8', b'"r":16,"x":1'), errors.WrongPasswordError,
     "wrong password"),
    (lambda k: k.replace(b'"scrypt"', b'"md5xxx"'), errors.CorruptKeyError, "key derivation"),
    (lambda k: k[:-1] + bytes([k[-1] ^ 1]), errors.WrongPasswordError, "wrong password or corrupted key file"),
    (lambda k: k.replace(b'"format_version":1', b'"format_version":2'), errors.CorruptKeyError,
     "format version 2"),
])
def test_corrupted_key_file(artifacts, tmp_path, damage, error, message):
    copy = _copy(artifacts["a"][0], tmp_path)
    key = copy / "modelKey.bin"
    key.write_bytes(damage(key.read_bytes()))
    with pytest.raises(error, match=message):
        _open(copy)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:-1], "truncated"),
    (lambda d: d[:-1000], "truncated"),
    (lambda d: d[:100], "truncated"),
    (lambda d: d + b"\0" * 16, "extended"),
    (lambda d: d[:-5] + bytes([d[-5] ^ 0x80]) + d[-4:], "fails authentication"),
    (lambda d: d[:len(d) // 2] + bytes([d[len(d) // 2] ^ 1]) + d[len(d) // 2 + 1:], "fails authentication"),
    (lambda d: d.replace(b'"opt_level":3', b'"opt_level":2'), "fails authentication"),  # the readable header
    (lambda d: d.replace(b'"chunk_size":1048576', b'"chunk_size":1048577'), "fails authentication"),
    (lambda d: _edit_header(d, fmt.LIBRARY_MAGIC, b'"opt_level":3', b'"opt_level":3,"extra":1'),
     "fails authentication"),
    (lambda d: _edit_header(d, fmt.LIBRARY_MAGIC, b'"size":', b'"size":1'), "truncated"),
    (lambda d: d.replace(b'"format_version":1', b'"format_version":7'), "format version 7"),
])
def test_tampered_library(artifacts, tmp_path, damage, message):
    copy = _copy(artifacts["a"][0], tmp_path)
    library = copy / "model_library.so"
    changed = damage(library.read_bytes())
    assert changed != library.read_bytes()
    library.write_bytes(changed)
    with pytest.raises(errors.CorruptLibraryError, match=message):
        _open(copy)


def test_chunks_cannot_be_reordered(tmp_path):
    """A library of several chunks: swapping two whole chunks fails (the nonce is the chunk's index)."""
    plaintext = os.urandom(5000)
    library, key = fmt.encrypt_library(plaintext, {"uuid": UUID}, b"pw", chunk_size=1000)
    header = fmt.read_library_header(library)
    data_key = fmt.read_key_file(key).unwrap(b"pw")
    assert fmt.decrypt_library(library, header, data_key) == plaintext
    start, sealed = len(header.prefix), 1000 + 16
    chunks = [library[start + i * sealed:start + (i + 1) * sealed] for i in range(5)]
    swapped = header.prefix + chunks[1] + chunks[0] + b"".join(chunks[2:])
    with pytest.raises(errors.CorruptLibraryError, match="chunk 1 of 5"):
        fmt.decrypt_library(swapped, fmt.read_library_header(swapped), data_key)


def test_key_of_another_model_or_of_another_compile(artifacts, tmp_path):
    (a, _), (b, _) = artifacts["a"], artifacts["b"]
    with pytest.raises(errors.KeyMismatchError, match="belongs to the artifact with uuid"):
        _open(a, key=b / "modelKey.bin")
    forge.from_onnx(conv_bn_net(seed=31)).compile(output_path=tmp_path / "again", uuid=UUID,
                                                   encrypt_password=PASSWORD)
    with pytest.raises(errors.KeyMismatchError, match="another compile of it"):
        _open(a, key=tmp_path / "again" / "modelKey.bin")
    with pytest.raises(errors.CorruptKeyError, match="is an encrypted library, not a key file"):
        _open(a, key=a / "model_library.so")


def test_a_key_given_for_a_plain_library_warns_and_loads(artifacts):
    plain, reference = artifacts["plain"]
    with pytest.warns(errors.KeyIgnoredWarning, match="is not encrypted; a key file was given and is ignored"):
        runtime = Runtime(plain, artifacts["a"][0] / "modelKey.bin", PASSWORD)
    np.testing.assert_allclose(runtime.infer(X)[0], reference, rtol=1e-4, atol=1e-5)


def test_every_decryption_error_shares_one_base():
    for cls in (errors.MissingKeyError, errors.MissingPasswordError, errors.WrongPasswordError,
                errors.CorruptKeyError, errors.CorruptLibraryError, errors.KeyMismatchError):
        assert issubclass(cls, errors.DecryptionError) and issubclass(cls, errors.ForgeError)


# ----------------------------------------------------------------------------------------------------
# Passwords
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("password, message", [("", "is empty"), (b"bytes", "must be a string"), (12345, "string")])
def test_a_bad_password_is_refused_before_any_work(tmp_path, password, message):
    ir = forge.from_onnx(conv_bn_net(seed=1))
    with pytest.raises(ValueError, match=f"encrypt_password .*{message}"):
        ir.compile(output_path=tmp_path / "x", encrypt_password=password)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("password, weak", [("secret", True), ("abcdefghijklmnop", True), ("1234567890123", True),
                                            ("Tr0ub4dor&3x", False), (PASSWORD, False)])
def test_a_weak_password_warns(password, weak):
    from forge_core.security.passwords import check_password

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_password(password) == password.encode()
    assert [w.category for w in caught] == ([errors.WeakPasswordWarning] if weak else [])


def test_a_password_opens_in_either_unicode_normal_form(tmp_path):
    composed = "Motörhead-Ümlaut-Café"
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    forge.from_onnx(conv_bn_net(seed=2)).compile(output_path=tmp_path / "u", encrypt_password=composed)
    assert _open(tmp_path / "u", password=decomposed).infer(X)[0].shape == (1, 10)


# ----------------------------------------------------------------------------------------------------
# Fuzz: 1,000 mutations of the key file and of the library
# ----------------------------------------------------------------------------------------------------

_CLEAR = {"CorruptKeyError", "CorruptLibraryError", "WrongPasswordError", "KeyMismatchError"}


def _mutations(rng: random.Random, file: str, size: int, header: int, count: int) -> list[dict]:
    plans = []
    for _ in range(count):
        kind = rng.choice(["flip", "flip", "flip-header", "truncate", "splice-random", "splice-donor",
                           "delete", "insert"])
        length = rng.choice([1, 2, 4, 16, 64, 1000])
        position = rng.randrange(header) if kind == "flip-header" else rng.randrange(size)
        plans.append({"file": file, "kind": "flip" if kind == "flip-header" else kind, "position": position,
                      "bit": rng.randrange(8), "length": rng.randrange(size) if kind == "truncate" else length,
                      "start": position, "bytes": rng.randbytes(length).hex()})
    return plans


def _run_workers(plan_path: Path, total: int, tmp_path: Path) -> list[dict]:
    """Run the worker over the mutations, restarting after a crash; a crash is reported as its outcome."""
    results: list[dict] = []
    start = 0
    while start < total:
        done = subprocess.run([sys.executable, str(TESTS / "encryption_fuzz.py"), str(plan_path), str(start)],
                              capture_output=True, text=True, timeout=1200, cwd=tmp_path)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        results += lines
        start = (lines[-1]["i"] + 1) if lines else start
        if done.returncode != 0:
            results.append({"i": start, "outcome": "crash", "error": f"rc {done.returncode}: {done.stderr[-500:]}"})
            start += 1
    return results


def test_fuzz_the_key_file_and_the_library(artifacts, tmp_path):
    (a, reference), (b, _) = artifacts["a"], artifacts["b"]
    library, key = (a / "model_library.so").read_bytes(), (a / "modelKey.bin").read_bytes()
    rng = random.Random(20261123)
    mutations = (_mutations(rng, "key", len(key), len(fmt.read_key_file(key).prefix), 500)
                 + _mutations(rng, "library", len(library), len(fmt.read_library_header(library).prefix), 500))
    rng.shuffle(mutations)
    expected = Runtime(artifacts["plain"][0]).infer(X)[0]
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "expected.npy", expected)
    plans = []
    for half in range(2):  # two workers, one a core
        plan = {"library": str(a / "model_library.so"), "key": str(a / "modelKey.bin"), "password": PASSWORD,
                "donor_library": str(b / "model_library.so"), "donor_key": str(b / "modelKey.bin"),
                "input": str(tmp_path / "x.npy"), "expected": str(tmp_path / "expected.npy"),
                "scratch": str(tmp_path / f"scratch{half}"), "mutations": mutations[half::2]}
        (tmp_path / f"plan{half}.json").write_text(json.dumps(plan))
        plans.append((tmp_path / f"plan{half}.json", len(plan["mutations"])))
    with ThreadPoolExecutor(2) as pool:
        results = [r for part in pool.map(lambda p: _run_workers(p[0], p[1], tmp_path), plans) for r in part]
    assert len(results) == 1000
    defects = [r for r in results
               if not (r["outcome"] in _CLEAR or (r["outcome"] == "loaded" and r["equal"] and r["intact"]))]
    assert not defects, json.dumps(defects[:5], indent=1)
    outcomes = {r["outcome"] for r in results}
    assert {"CorruptKeyError", "CorruptLibraryError", "WrongPasswordError"} <= outcomes, outcomes
    assert np.allclose(expected, reference, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# No plaintext on disk
# ----------------------------------------------------------------------------------------------------


def _watch(tmp_path: Path, name: str, library: Path, key: Path | None, elf_header: bytes) -> dict:
    tmpdir, workdir = tmp_path / f"{name}-tmp", tmp_path / f"{name}-cwd"
    tmpdir.mkdir()
    workdir.mkdir()
    plan = {"library": str(library), "key": str(key) if key else None, "password": PASSWORD if key else None,
            "elf_header": elf_header.hex(), "watch": [str(tmpdir), str(workdir), str(library.parent)]}
    (tmp_path / f"{name}.json").write_text(json.dumps(plan))
    done = subprocess.run([sys.executable, str(TESTS / "plaintext_watch.py"), str(tmp_path / f"{name}.json")],
                          capture_output=True, text=True, timeout=600, cwd=workdir,
                          env={**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(TESTS)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tmp"] == str(tmpdir) and report["cwd"] == str(workdir)
    return report


def test_no_plaintext_touches_the_disk_during_a_load(artifacts, tmp_path):
    a, plain = artifacts["a"][0], artifacts["plain"][0]
    elf_header = (plain / "model_library.so").read_bytes()[:64]
    assert elf_header.startswith(b"\x7fELF")
    # The control: the plain library's private copy is seen (the watch works).
    control = _watch(tmp_path, "plain", plain / "model_library.so", None, elf_header)
    assert any("forge-lib-" in event["path"] for event in control["events"]), control
    encrypted = _watch(tmp_path, "encrypted", a / "model_library.so", a / "modelKey.bin",
                       _decrypted_header(a))
    assert encrypted["events"] == [] and encrypted["holding"] == [], encrypted


def _decrypted_header(out: Path) -> bytes:
    data = (out / "model_library.so").read_bytes()
    header = fmt.read_library_header(data)
    data_key = fmt.read_key_file((out / "modelKey.bin").read_bytes()).unwrap(PASSWORD.encode())
    plaintext = fmt.decrypt_library(data, header, data_key)
    assert plaintext.startswith(b"\x7fELF")
    return plaintext[:64]


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


def _cli(*args: object, password_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_") or k == "FORGE_NUM_THREADS"}
    env.update(password_env or {})
    return subprocess.run([FORGE, *map(str, args)], capture_output=True, text=True, timeout=600, env=env,
                          stdin=subprocess.DEVNULL)


def test_command_line_compile_info_and_run(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_bn_net(seed=7).SerializeToString())
    out = tmp_path / "enc"
    done = _cli("compile", model, "-o", out, "--encrypt", password_env={"FORGE_ENCRYPT_PASSWORD": PASSWORD})
    assert done.returncode == 0, done.stderr
    assert "modelKey.bin" in done.stdout
    info = _cli("info", out)
    assert info.returncode == 0, info.stderr
    assert "yes, key file modelKey.bin" in info.stdout and "x: float32[1x3x16x16]" in info.stdout
    assert "--key verifies them" in info.stdout
    need = _cli("info", out, "--key", out / "modelKey.bin")
    assert need.returncode == 1 and "set FORGE_DECRYPT_PASSWORD" in need.stderr
    verified = _cli("info", out, "--key", out / "modelKey.bin", password_env={"FORGE_DECRYPT_PASSWORD": PASSWORD})
    assert verified.returncode == 0 and "opens the library" in verified.stdout, verified.stderr
    np.save(tmp_path / "x.npy", X)
    run = _cli("run", out, "--key", out / "modelKey.bin", "--input", tmp_path / "x.npy", "--save-outputs",
               tmp_path / "y", "--repeat", "2", password_env={"FORGE_DECRYPT_PASSWORD": PASSWORD})
    assert run.returncode == 0, run.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y" / "output_0.npy"), _onnxruntime(conv_bn_net(seed=7), X),
                               rtol=1e-4, atol=1e-5)
    no_key = _cli("run", out)
    assert no_key.returncode == 1 and "Model looks encrypted but no key provided" in no_key.stderr
    wrong = _cli("run", out, "--key", out / "modelKey.bin", password_env={"FORGE_DECRYPT_PASSWORD": "nope"})
    assert wrong.returncode == 1 and "wrong password or corrupted key file" in wrong.stderr
    usage = _cli("run", out, "--key", out / "modelKey.bin", "--password", PASSWORD)
    assert usage.returncode == 2 and "unrecognized arguments: --password" in usage.stderr
