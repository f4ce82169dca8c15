"""Built-in plugin: Forge's target tags.

Tags are registered through ``register_target_tags`` exactly as a third-party
tag set would be. Categories: ``cuda`` (NVIDIA GPUs and Jetson boards, taken
from TVM's own tag registry), ``x86`` (Intel and AMD CPU families, AWS C5),
``arm`` (Arm cores, Raspberry Pi and other boards, AWS Graviton), ``android``
(Android phones' CPUs), ``riscv`` (TVM's RISC-V boards).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from forge_core.hookspecs import hookimpl
from forge_core.targets.parsing import plain_config

_AARCH64 = "-mtriple=aarch64-linux-gnu"
_X86 = "-mtriple=x86_64-linux-gnu"

# (tag, docs-style target string, note)
RASPBERRY_PI = [
    ("raspberry-pi/5", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -mattr=+neon -num-cores=4",
     "Raspberry Pi 5: BCM2712, 4x Cortex-A76, 64-bit OS"),
    ("raspberry-pi/4", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon -num-cores=4",
     "Raspberry Pi 4: BCM2711, 4x Cortex-A72, 64-bit OS"),
    ("raspberry-pi/3", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a53 -mattr=+neon -num-cores=4",
     "Raspberry Pi 3: BCM2837, 4x Cortex-A53, 64-bit OS"),
]

ARM_CORES = [
    ("arm/cortex-a53", "cortex-a53", "+neon", "Arm Cortex-A53 (little core, many SBCs)"),
    ("arm/cortex-a55", "cortex-a55", "+neon,+dotprod", "Arm Cortex-A55 (little core, dot product)"),
    ("arm/cortex-a72", "cortex-a72", "+neon", "Arm Cortex-A72"),
    ("arm/cortex-a76", "cortex-a76", "+neon,+dotprod", "Arm Cortex-A76"),
    ("arm/cortex-a78", "cortex-a78", "+neon,+dotprod", "Arm Cortex-A78"),
    ("arm/neoverse-n1", "neoverse-n1", "+neon,+dotprod", "Arm Neoverse N1 server core (Ampere Altra)"),
    ("arm/neoverse-v1", "neoverse-v1", "+neon,+dotprod,+sve,+i8mm", "Arm Neoverse V1 server core (SVE)"),
    ("arm/neoverse-n2", "neoverse-n2", "+neon,+dotprod,+sve2,+i8mm", "Arm Neoverse N2 server core (SVE2)"),
    ("aws/graviton2", "neoverse-n1", "+neon,+dotprod", "AWS Graviton2 (Neoverse N1), e.g. c6g"),
    ("aws/graviton3", "neoverse-v1", "+neon,+dotprod,+sve,+i8mm", "AWS Graviton3 (Neoverse V1), e.g. c7g"),
]

X86_FAMILIES = [
    ("intel/haswell", "haswell", "Intel Haswell (AVX2, FMA), 4th-gen Core / Xeon v3"),
    ("intel/broadwell", "broadwell", "Intel Broadwell (AVX2), 5th-gen Core / Xeon v4"),
    ("intel/skylake", "skylake", "Intel Skylake desktop (AVX2), 6th-gen Core"),
    ("intel/skylake-avx512", "skylake-avx512", "Intel Xeon Scalable 1st gen, Skylake-SP (AVX-512)"),
    ("intel/cascadelake", "cascadelake", "Intel Xeon Scalable 2nd gen, Cascade Lake (AVX-512 VNNI)"),
    ("intel/icelake-server", "icelake-server", "Intel Xeon Scalable 3rd gen, Ice Lake-SP"),
    ("intel/icelake-client", "icelake-client", "Intel 10th-gen Core, Ice Lake"),
    ("intel/tigerlake", "tigerlake", "Intel 11th-gen Core, Tiger Lake"),
    ("intel/alderlake", "alderlake", "Intel 12th-gen Core, Alder Lake (AVX2, AVX-VNNI)"),
    ("intel/sapphirerapids", "sapphirerapids", "Intel Xeon Scalable 4th gen, Sapphire Rapids (AMX)"),
    ("amd/zen2", "znver2", "AMD Zen 2: Ryzen 3000, EPYC Rome"),
    ("amd/zen3", "znver3", "AMD Zen 3: Ryzen 5000, EPYC Milan"),
    ("amd/zen4", "znver4", "AMD Zen 4: Ryzen 7000, EPYC Genoa (AVX-512)"),
    ("amd/zen5", "znver5", "AMD Zen 5: Ryzen 9000, EPYC Turin (AVX-512)"),
]

ANDROID = [
    ("android/cpu", "llvm -mtriple=aarch64-linux-android -mattr=+neon",
     "Android, 64-bit Arm CPU (arm64-v8a); needs the Android NDK"),
    ("android/cpu-dotprod", "llvm -mtriple=aarch64-linux-android -mcpu=cortex-a76 -mattr=+neon,+dotprod",
     "Android, Armv8.2 big cores with dot product (Snapdragon 855 and later); needs the Android NDK"),
    ("android/cpu-armv7", "llvm -mtriple=armv7a-linux-androideabi -mattr=+neon -mfloat-abi=soft",
     "Android, 32-bit Arm CPU (armeabi-v7a); needs the Android NDK"),
]

# TVM's own registry: which of its tag families Forge lists, and under which category.
TVM_TAG_CATEGORIES = {"nvidia": "cuda", "arm": "arm", "raspberry-pi": "arm", "aws/cpu": "x86", "riscv": "riscv"}


def _tvm_note(name: str, config: dict[str, Any]) -> str:
    if config.get("kind") == "cuda":
        host = config.get("host") or {}
        where = f", host {host.get('mcpu')} x{host.get('num-cores', '?')}" if host.get("mcpu") else ""
        return f"NVIDIA {name.split('/', 1)[1]}: CUDA {config.get('arch', '')}{where} (TVM tag)"
    return f"{name.split('/', 1)[1]}: {config.get('mcpu', config.get('kind'))} (TVM tag)"


def _tvm_tags() -> Iterator[tuple[str, dict[str, Any], str]]:
    import tvm

    for name, target in sorted(tvm.target.list_tags().items()):
        name = str(name)
        category = next((cat for prefix, cat in TVM_TAG_CATEGORIES.items() if name.startswith(prefix + "/")), None)
        if category is None:
            continue
        config = plain_config(target)
        if category != "cuda" and config.get("kind") != "llvm":
            continue
        yield name, config, category


@hookimpl
def register_target_tags(register: Callable[..., None]) -> None:
    for name, target, note in RASPBERRY_PI:
        register(name, target, category="arm", note=note)
    for name, cpu, mattr, note in ARM_CORES:
        register(name, f"llvm {_AARCH64} -mcpu={cpu} -mattr={mattr}", category="arm", note=note)
    for name, cpu, note in X86_FAMILIES:
        register(name, f"llvm {_X86} -mcpu={cpu}", category="x86", note=note)
    for name, target, note in ANDROID:
        register(name, target, category="android", note=note)
    for name, config, category in _tvm_tags():
        register(name, config, category=category, note=_tvm_note(name, config))
