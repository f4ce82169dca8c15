"""The differential fuzzer (schedule_fuzz.py), bounded for CI: seeded packs of random operator cases.

Each pack compiles six random cases (convolutions 1-3D and transposed with every
epilogue, matrix products, pooling, reductions, softmax and layer norm,
broadcasting elementwise, transpose, concat, resize) under one set of compile
options, in verification mode, and compares every output with onnxruntime.
Consecutive packs walk through opt_level 0-4 x set_channel_layout
(default, first, last) x set_float16. A longer run:
``.venv/bin/python tests/schedule_fuzz.py --minutes 30 --seed 7``.
"""

from __future__ import annotations

import pytest
from schedule_fuzz import FAMILIES, OPTIONS, make_pack, run_pack

SEED = 2026
PACKS = 30  # one per option set: 180 cases
ARTIFACT_EVERY = 5  # every fifth pack goes through compile() and the runtime, the others compile in memory


@pytest.mark.parametrize("index", range(PACKS), ids=lambda i: make_pack(SEED, i).label)
def test_fuzz_pack_matches_onnxruntime(index, tmp_path):
    pack = make_pack(SEED, index)
    failures = run_pack(pack, tmp_path / "artifact" if index % ARTIFACT_EVERY == 0 else None)
    assert not failures, "\n".join(
        f"{f.case}: {f.detail}\n  reproduce: .venv/bin/python tests/schedule_fuzz.py --seed {SEED} --pack {index}"
        for f in failures)


DYNAMIC_PACKS = 6  # opt_level 0-4, each layout, fp16 and not


@pytest.mark.parametrize("index", range(DYNAMIC_PACKS), ids=lambda i: make_pack(SEED, i, dynamic_batch=True).label)
def test_dynamic_batch_pack_matches_onnxruntime_at_two_batches(index, tmp_path):
    """Every case's batched inputs take a dynamic first dim: kernels whose items are independent are scheduled as
    one static item in a loop over the batch (schedules/batch_loop.py, verified at a batch of 3), the others take
    the symbolic path; the artifact runs at the cases' batches and at batches 2 longer."""
    pack = make_pack(SEED, index, dynamic_batch=True)
    failures = run_pack(pack, tmp_path / "artifact" if index == 0 else None)
    assert not failures, "\n".join(
        f"{f.case}: {f.detail}\n  reproduce: .venv/bin/python tests/schedule_fuzz.py --dynamic-batch --seed {SEED} "
        f"--pack {index}" for f in failures)


def test_the_packs_cover_every_option_set_and_family():
    packs = [make_pack(SEED, i) for i in range(PACKS)]
    assert {tuple(sorted(p.options.items())) for p in packs} == {tuple(sorted(o.items())) for o in OPTIONS}
    assert {c.family for p in packs for c in p.cases} == set(FAMILIES)
