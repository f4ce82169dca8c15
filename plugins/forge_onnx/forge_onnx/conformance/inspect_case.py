"""Run one suite case through Forge and show everything: the graph, the error with its traceback, the outputs.

    python -m forge_onnx.conformance.inspect_case test_shape_cpu [--public]

``--public`` runs it the way a user's model goes, ``forge.from_onnx(model).get_inference_function()``
(:mod:`forge_onnx.conformance.public_path`), instead of :mod:`forge_onnx.backend`.
"""

from __future__ import annotations

import sys
import traceback
import warnings

import numpy as np
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import _normalize_tensor


def find(name: str) -> object:
    base = name.removesuffix("_cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in ("node", "real", "simple", "pytorch-converted", "pytorch-operator"):
            for case in load_model_tests(kind=kind):
                if case.name == base:
                    return case
    raise SystemExit(f"no case {name!r}")


def main() -> None:
    if "--public" in sys.argv[2:]:
        from forge_onnx.conformance.public_path import PublicPathBackend as backend
    else:
        import forge_onnx.backend as backend

    case = find(sys.argv[1])
    model = case.model
    if model is None:
        raise SystemExit("this case has no inline model (a file-based model case); run it with the suite")
    print("nodes:", [f"{n.op_type}({', '.join(n.input)})" for n in model.graph.node])
    print("inputs:", [i.name for i in model.graph.input], "opset:", [(o.domain, o.version) for o in model.opset_import])
    for inputs, expected in case.data_sets or []:
        inputs = [_normalize_tensor(x) for x in inputs]
        expected = [_normalize_tensor(x) for x in expected]
        print("given:", [(np.asarray(x).dtype, np.shape(x)) for x in inputs])
        try:
            outputs = backend.prepare(model).run(inputs)
        except Exception:  # noqa: BLE001 - show it all
            traceback.print_exc()
            return
        for got, want in zip(outputs, expected):
            want = np.asarray(want)
            same = got.shape == want.shape and np.allclose(got, want, rtol=1e-3, atol=1e-7, equal_nan=True)
            print("got ", got.dtype, got.shape, np.ravel(got)[:8])
            print("want", want.dtype, want.shape, np.ravel(want)[:8], "MATCH" if same else "MISMATCH")


if __name__ == "__main__":
    main()
