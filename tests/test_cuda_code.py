"""CUDA libraries carry machine code (``forge_core.compiler.cuda_code``).

TVM's CUDA code generator kept the kernels as CUDA source, which TVM's runtime
compiled when the library loaded, through a callback of TVM's compiler library
and NVRTC: a GPU machine needed the 260 MB compiler library, and a load took
1.8 to 15.6 s. ``compile()`` now builds the kernels with nvcc into a fatbin
that takes the source's place. Checked here without a GPU: what the library
holds (cuobjdump lists it), what is refused and how; on a GPU,
``benchmarks/gpu_check.py`` runs the libraries with the driver alone.
"""

from __future__ import annotations

import json
import os
import stat

import jsonschema
import pytest

import forge
from forge_core.compiler import cuda_code
from forge_core.runtime import metadata as schema
from model_factory import conv_bn_net

from cuda_checks import check_cuda_library, cuda_compiles

if not os.path.exists("/usr/local/cuda/bin/nvcc") and not os.environ.get("CUDA_HOME"):
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: CUDA libraries cannot be built here", allow_module_level=True)


@pytest.fixture(scope="module")
def model() -> bytes:
    return conv_bn_net()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cuda_code.CACHE_ENV, str(tmp_path / "cache"))


def test_the_library_holds_a_fatbin_for_the_arch_and_says_so(model, tmp_path):
    """Machine code for sm_86 and its PTX (for newer GPUs); the metadata names them and the nvcc that built
    them."""
    forge.from_onnx(model).compile(target="cuda -arch=sm_86", output_path=tmp_path / "a", export_metadata=True)
    kernels = check_cuda_library(tmp_path / "a" / "model_library.so", "sm_86")
    assert any("conv2d" in name for name in kernels), kernels
    document = json.loads((tmp_path / "a" / "model_metadata.json").read_text())
    jsonschema.validate(document, schema.JSON_SCHEMA)
    entry = document["cuda"]
    assert entry["arch"] == "sm_86" and entry["code"] == "fatbin"
    assert entry["contents"] == ["sm_86", "compute_86"] and entry["nvcc"].startswith(("12.", "13."))


def test_a_cuda_target_naming_no_arch_builds_for_the_oldest_arch_and_its_ptx(model, tmp_path):
    """TVM chose sm_50 where no GPU is present, which CUDA 13's nvcc no longer builds: a target naming no arch
    gets sm_75 machine code and PTX that every later GPU's driver compiles."""
    from forge_core.targets.parsing import resolve_target

    assert resolve_target("cuda").attrs["arch"] == cuda_code.DEFAULT_ARCH == "sm_75"
    forge.from_onnx(model).compile(target="cuda", output_path=tmp_path / "a")
    check_cuda_library(tmp_path / "a" / "model_library.so", "sm_75")


def test_an_arch_specific_target_gets_no_ptx(model, tmp_path):
    """``sm_90a`` code runs on sm_90a alone: PTX of it would run nowhere else, so the fatbin has none."""
    assert cuda_code.gencode("sm_90a") == ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert cuda_code.gencode("sm_87") == ["-gencode", "arch=compute_87,code=[sm_87,compute_87]"]
    forge.from_onnx(model).compile(target="nvidia/nvidia-h100", output_path=tmp_path / "a")
    check_cuda_library(tmp_path / "a" / "model_library.so", "sm_90a", ptx=False)


def test_an_encrypted_cuda_artifact_holds_the_fatbin_inside_the_encryption(model, tmp_path, monkeypatch):
    sources = cuda_compiles(monkeypatch)
    forge.from_onnx(model).compile(target="cuda -arch=sm_80", output_path=tmp_path / "a", encrypt_password="pw-1234567890-ok")
    library = (tmp_path / "a" / "model_library.so").read_bytes()
    assert len(sources) == 1
    assert cuda_code.FATBIN_MAGIC not in library and b"__global__" not in library


def test_the_same_kernels_are_compiled_once(model, tmp_path, monkeypatch):
    """Fatbins are cached by source, arch, options and nvcc version: a second build of the same model runs no
    nvcc, and its library is the same."""
    calls = []
    real = cuda_code.subprocess.run

    def counting(command, *args, **kwargs):
        if "--fatbin" in command:
            calls.append(command)
        return real(command, *args, **kwargs)

    monkeypatch.setenv("FORGE_EXPORT_IN_PROCESS", "1")
    monkeypatch.setattr(cuda_code.subprocess, "run", counting)
    ir = forge.from_onnx(model)
    ir.compile(target="cuda -arch=sm_80", output_path=tmp_path / "a", uuid="00000000-0000-4000-8000-000000000001")
    ir.compile(target="cuda -arch=sm_80", output_path=tmp_path / "b", uuid="00000000-0000-4000-8000-000000000001")
    assert len(calls) == 1
    blobs = [cuda_code.cuda_modules(cuda_code.library_blob((tmp_path / d / "model_library.so").read_bytes()))
             for d in "ab"]
    assert blobs[0] == blobs[1]
    assert [p.suffix for p in (tmp_path / "cache" / "cuda").iterdir()] == [".fatbin"]  # no part file left


def test_an_nvcc_that_is_not_there_is_named_before_the_build(model, tmp_path, monkeypatch):
    monkeypatch.setenv(cuda_code.NVCC_ENV, str(tmp_path / "no-nvcc"))
    with pytest.raises(forge.CompilationError, match=r"FORGE_NVCC=.*no-nvcc.* is not an executable nvcc"):
        forge.from_onnx(model).compile(target="cuda -arch=sm_80", output_path=tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_no_nvcc_anywhere_says_how_to_install_one(monkeypatch, tmp_path):
    for variable in (cuda_code.NVCC_ENV, "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(cuda_code, "_wheel_nvccs", lambda: iter(()))
    monkeypatch.setattr(cuda_code, "_STANDARD_NVCC", tmp_path / "cuda" / "bin" / "nvcc")
    with pytest.raises(forge.CompilationError, match=r"needs nvcc.*pip install nvidia-cuda-nvcc"):
        cuda_code.find_nvcc()


def test_an_arch_nvcc_does_not_build_is_refused_with_the_archs_it_does(model, tmp_path):
    with pytest.raises(forge.CompilationError, match=r"does not build for sm_50: it builds for sm_75, sm_80"):
        forge.from_onnx(model).compile(target="cuda -arch=sm_50", output_path=tmp_path / "a")


def test_nvcc_failing_on_the_kernels_names_the_arch_and_nvcc_message(model, tmp_path, monkeypatch):
    """A stand-in nvcc that answers the version queries and fails the compile: the message is nvcc's."""
    real = cuda_code.find_nvcc()
    fake = tmp_path / "nvcc"
    fake.write_text(f'#!/bin/sh\ncase "$1" in --version|--list-gpu-code) exec "{real}" "$@";; esac\n'
                    'echo "kernels.cu(3): error: something nvcc refused" >&2; exit 2\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(cuda_code.NVCC_ENV, str(fake))
    with pytest.raises(forge.CompilationError, match=r"nvcc .* failed on the kernels TVM generated for sm_80"
                                                     r"[\s\S]*something nvcc refused"):
        forge.from_onnx(model).compile(target="cuda -arch=sm_80", output_path=tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_a_blob_that_does_not_parse_is_refused_not_half_rewritten():
    """The serialized tree is rewritten only when it parses to its last byte."""
    def packed(value: bytes) -> bytes:
        return len(value).to_bytes(8, "little") + value

    source = b'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    table = (1).to_bytes(8, "little") + packed(b"k") + packed(b"k") + (0).to_bytes(8, "little") * 3
    cuda = packed(b"cuda") + table + packed(source)
    body = (b"".join(x.to_bytes(8, "little") for x in (3, 0, 1, 1)) + (1).to_bytes(8, "little")
            + (1).to_bytes(8, "little") + packed(b"_lib") + packed(b"cuda") + packed(cuda))
    blob = len(body).to_bytes(8, "little") + body
    seen = []
    rewritten, count = cuda_code.replace_cuda_sources(blob, lambda text: seen.append(text) or b"\x50\xed\x55\xba!")
    assert count == 1 and seen == [source.decode()]
    assert cuda_code.cuda_modules(rewritten) == [("fatbin", b"\x50\xed\x55\xba!")]
    with pytest.raises(ValueError, match="bytes follow the last serialized module"):
        cuda_code.replace_cuda_sources((len(body) + 1).to_bytes(8, "little") + body + b"x", lambda text: b"")
    with pytest.raises(ValueError, match="say"):
        cuda_code.replace_cuda_sources(blob + b"x", lambda text: b"")
