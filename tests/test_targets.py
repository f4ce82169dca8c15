"""Target parsing (docs strings, dicts, JSON, tags) and the tag listings."""

from __future__ import annotations

import json

import pytest
import tvm

import forge
from forge_core.targets import resolve_target, target_to_string

DOCS_PI5 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -mattr=+neon -num-cores=4"


def attrs(target):
    return {k: (list(v) if not isinstance(v, (str, int, bool)) else v) for k, v in target.attrs.items()}


def test_plain_llvm():
    target = resolve_target("llvm")
    assert target.kind.name == "llvm"


def test_docs_cpu_string():
    target = resolve_target("llvm -mcpu=skylake")
    assert target.kind.name == "llvm" and target.attrs["mcpu"] == "skylake"


def test_docs_cuda_string_with_docs_host_string():
    target = resolve_target("cuda -arch=sm_86", host="llvm -mcpu=skylake")
    assert target.kind.name == "cuda" and target.attrs["arch"] == "sm_86"
    assert target.host.kind.name == "llvm" and target.host.attrs["mcpu"] == "skylake"


def test_docs_raspberry_pi_string_is_typed():
    target = resolve_target(DOCS_PI5)
    a = attrs(target)
    assert a["mtriple"] == "aarch64-linux-gnu" and a["mcpu"] == "cortex-a76"
    assert a["mattr"] == ["+neon"] and a["num-cores"] == 4 and isinstance(a["num-cores"], int)


def test_comma_separated_list_and_boolean_flag():
    target = resolve_target("llvm -mcpu=skylake -mattr=+avx2,+fma -fast-math")
    assert list(target.attrs["mattr"]) == ["+avx2", "+fma"]
    assert bool(target.attrs["fast-math"]) is True


def test_dict_json_and_tag_forms_agree():
    as_dict = resolve_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                              "mattr": ["+neon"], "num-cores": 4})
    as_json = resolve_target(json.dumps({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                                         "mattr": ["+neon"], "num-cores": 4}))
    as_string = resolve_target(DOCS_PI5)
    as_tag = resolve_target("raspberry-pi/5")
    for target in (as_json, as_string, as_tag):
        assert {k: v for k, v in attrs(target).items() if k != "tag"} == attrs(as_dict)
    assert as_tag.tag == "raspberry-pi/5"


def test_host_inside_a_dict():
    target = resolve_target({"kind": "cuda", "arch": "sm_80", "host": "llvm -mcpu=skylake"})
    assert target.host.attrs["mcpu"] == "skylake"


def test_tvm_target_passes_through():
    original = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    assert resolve_target(original).attrs["mcpu"] == "znver4"


def test_string_round_trip():
    target = resolve_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon -num-cores=4")
    again = resolve_target(target_to_string(target))
    assert attrs(again) == attrs(target)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("rasberry-pi/5", r"Unknown target or tag 'rasberry-pi/5'\. Did you mean: raspberry-pi/5"),
        ("llvm mcpu=skylake", r"'mcpu=skylake' is not an option"),
        ("llvm -mcpu", r"-mcpu of 'llvm -mcpu' needs a value"),
        ("llvm -num-cores=four", r"-num-cores .* expects an integer, given 'four'"),
        ("llvm -mcpus=skylake", r"Unknown option -mcpus for target kind 'llvm'.*Did you mean: mcpu"),
        ("llvm -mcpu=skylak", r"Unknown CPU -mcpu=skylak.*Did you mean: skylake"),
        ('{"kind": "llvm", ', r"Target JSON .* is malformed"),
        ("", r"The target string is empty"),
        ({"mcpu": "skylake"}, r"has no 'kind'"),
    ],
)
def test_bad_targets_are_named(bad, message):
    with pytest.raises(forge.TargetError, match=message):
        resolve_target(bad)


def test_a_target_of_the_wrong_type():
    with pytest.raises(forge.TargetError, match="not int"):
        resolve_target(42)


def test_raspberry_pi_5_tag_is_exactly_the_docs_string():
    assert ("raspberry-pi/5", DOCS_PI5) in forge.list_arm_tags(verbose=True)
    assert {"raspberry-pi/4", "raspberry-pi/3"} <= set(forge.list_arm_tags())


def test_listings_by_category():
    cuda = forge.list_cuda_tags()
    assert any("jetson" in t for t in cuda) and "nvidia/geforce-rtx-3090" in cuda
    x86 = forge.list_x86_tags()
    assert any(t.startswith("intel/") for t in x86) and any(t.startswith("amd/") for t in x86)
    arm = forge.list_arm_tags()
    assert {"arm/cortex-a76", "arm/neoverse-n1", "aws/graviton3"} <= set(arm)
    android = forge.list_android_tags()
    assert "android/cpu" in android and len(android) >= 2
    everything = forge.list_target_tags()
    assert set(cuda) | set(x86) | set(arm) | set(android) <= set(everything)
    assert everything == sorted(everything)


def test_verbose_listing_gives_parseable_target_strings():
    pairs = forge.list_cuda_tags(verbose=True)
    by_name = dict(pairs)
    orin = by_name["nvidia/jetson-agx-orin-32gb"]
    assert orin.startswith("cuda ") and "-arch=sm_87" in orin and "-host=" in orin
    target = resolve_target(orin)
    assert target.attrs["arch"] == "sm_87" and target.host.attrs["mcpu"] == "cortex-a78"
    for name, text in forge.list_android_tags(verbose=True):
        assert "android" in text, name


def test_a_cuda_compile_says_nothing_per_kernel(capfd, tmp_path):
    """TVM's GPU rules logged "Target cuda missing 'max_shared_memory_per_block'; using 49152 bytes." once per
    kernel (23 lines for one model), and every CUDA compile "Unable to detect CUDA version, default to
    -arch=sm_50" though the target named its arch: the limits are filled in, the arch is the target's."""
    from model_factory import conv_bn_net

    forge.from_onnx(conv_bn_net()).compile(target="cuda -arch=sm_80", output_path=tmp_path / "cuda")
    logged = capfd.readouterr().err
    assert "max_shared_memory_per_block" not in logged and "Unable to detect CUDA version" not in logged, logged
