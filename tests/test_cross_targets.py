"""Libraries for other machines: aarch64 boards, Android, CUDA GPUs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from cuda_checks import check_cuda_library
from model_factory import conv_bn_net

import forge
from forge_core.runtime.library_file import elf_machine

needs_cross_gcc = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="aarch64-linux-gnu-gcc is not installed (./scripts/setup installs Debian's gcc-aarch64-linux-gnu)",
)


@pytest.fixture(scope="module")
def ir():
    return forge.from_onnx(conv_bn_net(seed=6))


@needs_cross_gcc
@pytest.mark.parametrize("target", ["raspberry-pi/5", "raspberry-pi/4", "arm/neoverse-n1",
                                    "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a55 -mattr=+neon,+dotprod"])
def test_aarch64_targets_give_an_aarch64_elf(ir, tmp_path, target):
    out = tmp_path / "pi"
    ir.compile(target=target, output_path=out, export_metadata=True)
    library = (out / "model_library.so").read_bytes()
    assert elf_machine(library) == "aarch64"
    if shutil.which("file"):
        described = subprocess.run(["file", str(out / "model_library.so")], capture_output=True, text=True).stdout
        assert "ELF 64-bit LSB shared object, ARM aarch64" in described
    meta = json.loads((out / "model_metadata.json").read_text())
    assert meta["target"]["config"]["mtriple"] == "aarch64-linux-gnu"


@needs_cross_gcc
def test_an_aarch64_library_is_refused_on_this_machine_with_a_clear_error(ir, tmp_path):
    out = tmp_path / "pi"
    ir.compile(target="raspberry-pi/5", output_path=out)
    if os.uname().machine == "aarch64":
        pytest.skip("this machine is aarch64: the library loads here")
    with pytest.raises(forge.ForgeError, match="built for aarch64; this machine is x86_64"):
        forge.Runtime(out)


@pytest.mark.parametrize("tag", ["android/cpu", "android/cpu-dotprod"])
def test_android_without_an_ndk_names_what_to_install(ir, tmp_path, monkeypatch, tag):
    for var in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "TVM_NDK_CC"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "android"
    with pytest.raises(forge.CompilationError, match="needs the Android NDK.*set ANDROID_NDK_HOME"):
        ir.compile(target=tag, output_path=out)
    assert not out.exists() and os.listdir(tmp_path) == []


def test_android_ndk_home_without_the_compiler_is_named(ir, tmp_path, monkeypatch):
    monkeypatch.setenv("ANDROID_NDK_HOME", str(tmp_path / "ndk"))
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    with pytest.raises(forge.CompilationError, match="has no compiler aarch64-linux-android28-clang\\+\\+"):
        ir.compile(target="android/cpu", output_path=tmp_path / "android")


@pytest.fixture(scope="module")
def artifact(ir, tmp_path_factory):
    """A CUDA artifact with an explicit host, in the docs' strings."""
    out = tmp_path_factory.mktemp("cuda") / "artifact"
    ir.compile(target="cuda -arch=sm_86", host="llvm -mcpu=skylake", output_path=out, export_metadata=True)
    return out


class TestCuda:
    def test_the_artifact_carries_device_code(self, artifact):
        library = (artifact / "model_library.so").read_bytes()
        assert elf_machine(library) == "x86_64"
        # the kernels as machine code for the arch (nvcc, at compile time), not as source
        assert len(check_cuda_library(artifact / "model_library.so", "sm_86")) >= 3
        meta = json.loads((artifact / "model_metadata.json").read_text())
        assert meta["device_type"] == "cuda"
        assert meta["target"]["config"]["arch"] == "sm_86" and meta["host"]["config"]["mcpu"] == "skylake"

    def test_plain_cuda_target_builds_too(self, ir, tmp_path):
        ir.compile(target="cuda", output_path=tmp_path / "c")  # no GPU here: the oldest arch CUDA 13 builds
        assert check_cuda_library(tmp_path / "c" / "model_library.so", "sm_75")

    def test_jetson_tag_builds_for_its_arm_host(self, ir, tmp_path):
        if shutil.which("aarch64-linux-gnu-gcc") is None:
            pytest.skip("aarch64-linux-gnu-gcc is not installed")
        ir.compile(target="nvidia/jetson-agx-orin-32gb", output_path=tmp_path / "j")
        library = (tmp_path / "j" / "model_library.so").read_bytes()
        assert elf_machine(library) == "aarch64"
        assert check_cuda_library(tmp_path / "j" / "model_library.so", "sm_87")

    def test_running_needs_a_gpu(self, ir, artifact):
        if not tvm.cuda(0).exist:
            # without the driver, TVM's CUDA runtime library does not load, and the error names what it needs
            missing = "no cuda device is present|TVM's cuda runtime .* did not load: .*libcuda.so.1"
            with pytest.raises(forge.ForgeError, match=f"built for cuda, and ({missing})"):
                forge.Runtime(artifact)
            pytest.skip("no CUDA GPU on this machine: the artifact was built and checked, not run")
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        np.testing.assert_allclose(forge.Runtime(artifact).infer(x)[0], ir.get_inference_function()(x),
                                   rtol=1e-4, atol=1e-4)
