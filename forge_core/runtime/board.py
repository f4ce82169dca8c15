"""``python3 -m forge_runtime``: running a bundle on the machine it was built for (``forge bundle``).

A bundle is a directory with the model (``model/``), Forge's runtime, TVM's
runtime library and its Python bindings (``lib/``), and the package
``forge_runtime`` that puts ``lib/`` on the path and runs the model::

    cd BUNDLE && python3 -m forge_runtime --input x.npy --output y.npy [--repeat 20]

or, from a program in the bundle's directory, ``from forge_runtime import Runtime``
then ``Runtime()`` for the bundled model. It needs Python 3 and numpy, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BUNDLE_FILE = "bundle.json"


def prepare(root: Path) -> dict:
    """Put the bundle's ``lib/`` first on the path and select TVM's runtime library; the bundle's description."""
    description = json.loads((root / BUNDLE_FILE).read_text())
    lib = str(root / "lib")
    if lib not in sys.path:
        sys.path.insert(0, lib)
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")  # the bundle has no compiler library
    return description


def open_model(root: Path, password: str | None = None):  # noqa: ANN201 - forge_core.runtime.Runtime
    """The bundled model's :class:`forge_core.runtime.Runtime` (a password for an encrypted one)."""
    description = prepare(root)
    from forge_core.runtime import Runtime

    model = root / description["model"]
    key = model / description["key_file"] if description.get("key_file") else None
    if key is not None and password is None:
        password = os.environ.get(description.get("password_env", "FORGE_PASSWORD"))
        if password is None:
            raise SystemExit(f"the model is encrypted: give its password (--password-env, or set "
                             f"{description.get('password_env', 'FORGE_PASSWORD')})")
    return Runtime(model, key, password)


def main(root: Path, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m forge_runtime", description="Run the bundled model.")
    parser.add_argument("--input", action="append", default=[], help="an input as .npy, in input order")
    parser.add_argument("--output", action="append", default=[], help="where to save each output (.npy)")
    parser.add_argument("--repeat", type=int, default=0, help="time this many runs after the first")
    parser.add_argument("--password-env", default=None, help="the variable that holds an encrypted model's password")
    args = parser.parse_args(argv)
    description = prepare(root)
    import numpy as np

    password = os.environ.get(args.password_env) if args.password_env else None
    runtime = open_model(root, password)
    inputs = [np.load(path) for path in args.input]
    if len(inputs) != len(runtime.input_names):
        raise SystemExit(f"the model takes {len(runtime.input_names)} inputs ({', '.join(runtime.input_names)}), "
                         f"given {len(inputs)} (--input x.npy, once each, in that order)")
    outputs = runtime.infer(*inputs)
    for index, value in enumerate(outputs):
        print(f"output {index}: {value.dtype}{list(value.shape)}")
        if index < len(args.output):
            np.save(args.output[index], value)
    if args.repeat > 0:
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            runtime.infer(*inputs)
            times.append(time.perf_counter() - started)
        times.sort()
        print(f"{args.repeat} runs: median {times[len(times) // 2] * 1e3:.3f} ms")
    from forge_core.tvm_import import tvm_package_directory

    print(f"platform {description['platform']}; TVM runtime from {tvm_package_directory()}")
    return 0
