"""ONNX's backend test suite through Forge: every case on the checked-in passing list must still pass.

The list (plugins/forge_onnx/forge_onnx/conformance/passing_cases.txt) only
grows: a listed case that fails is a regression. Cases that newly pass are
found by ``python -m forge_onnx.conformance --backends forge`` (it prints how
the list would change) and added with ``--write-passing``.
"""

from __future__ import annotations

import pytest

from forge_onnx.conformance import PASSING_LIST
from forge_onnx.conformance.__main__ import read_passing
from forge_onnx.conformance.cases import all_cases
from forge_onnx.conformance.runner import run_cases


def test_the_passing_list_exists_and_is_substantial():
    assert PASSING_LIST.is_file()
    assert len(read_passing()) > 1000


@pytest.mark.timeout(3000)  # one test of about 500 s (2 cores); pyproject's default is 900
def test_the_whole_suite_keeps_every_listed_case_passing(monkeypatch):
    # Every case's outputs are compared with ONNX's reference outputs, so a schedule that computes wrong
    # fails its case without verification mode, which would double each compile (DenseNet-121: 57 -> 127 s)
    # and make this, the suite's longest test, twice as long.
    monkeypatch.delenv("FORGE_VERIFY", raising=False)
    cases = all_cases()
    listed = read_passing()
    assert listed <= set(cases), sorted(listed - set(cases))[:10]
    # The listed cases only: the others fail (455 cases, 53 s of 2 cores); which of them newly pass is what
    # `python -m forge_onnx.conformance --backends forge` reports when the list is updated.
    results = run_cases("forge", sorted(listed), jobs=2)
    passing = {case for case, result in results.items() if result.status == "pass"}
    regressed = {case: f"{results[case].status}: {results[case].error}" for case in sorted(listed - passing)}
    assert not regressed, regressed


def test_the_public_path_runs_cases_with_every_input_left_an_input():
    """``forge-public``: forge.from_onnx(model).get_inference_function(), as a user's model runs. A
    ConstantOfShape whose shape is a graph input (read at run time) passes there too."""
    results = run_cases("forge-public", ["test_abs_cpu", "test_constantofshape_int_zeros_cpu"], jobs=1)
    assert {case: r.status for case, r in results.items()} == {
        "test_abs_cpu": "pass", "test_constantofshape_int_zeros_cpu": "pass"}, results
