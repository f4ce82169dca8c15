"""Worker of the encryption fuzz test: ``python encryption_fuzz.py PLAN.json START``.

The plan names an encrypted artifact (library, key, password), an input and
the expected output, a scratch directory, and a list of mutations of the key
file or of the library. From mutation START on, each one is written to the
scratch directory (ciphertext only), loaded with the runtime, and reported
as one JSON line, flushed at once::

    {"i": index, "outcome": "CorruptLibraryError"}     a clear Forge error (its class)
    {"i": index, "outcome": "loaded", "equal": true}   loaded (the mutation left the file intact)
    {"i": index, "outcome": "other", "error": "..."}   any other exception: a defect

A crash ends the process; the parent sees the return code and the last line,
records the crash against the next mutation and starts a new worker after it.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

from forge_core.errors import DecryptionError
from forge_core.runtime import Runtime


def mutate(data: bytes, mutation: dict, donor: bytes) -> bytes:
    kind = mutation["kind"]
    if kind == "flip":
        position = mutation["position"] % len(data)
        changed = bytearray(data)
        changed[position] ^= 1 << mutation["bit"]
        return bytes(changed)
    if kind == "truncate":
        return data[:mutation["length"] % len(data)]
    start = mutation["start"] % len(data)
    end = min(len(data), start + mutation["length"])
    if kind == "splice-random":
        return data[:start] + bytes.fromhex(mutation["bytes"]) + data[end:]
    if kind == "splice-donor":  # the same range of another artifact's file of the same kind
        return data[:start] + donor[start:end] + data[end:]
    if kind == "delete":
        return data[:start] + data[end:]
    if kind == "insert":
        return data[:start] + bytes.fromhex(mutation["bytes"]) + data[start:]
    raise ValueError(kind)


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    start = int(sys.argv[2])
    library = Path(plan["library"]).read_bytes()
    key = Path(plan["key"]).read_bytes()
    donors = {"library": Path(plan["donor_library"]).read_bytes(), "key": Path(plan["donor_key"]).read_bytes()}
    x = np.load(plan["input"])
    expected = np.load(plan["expected"])
    scratch = Path(plan["scratch"])
    scratch.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    for index in range(start, len(plan["mutations"])):
        mutation = plan["mutations"][index]
        target = mutation["file"]
        original = library if target == "library" else key
        changed = mutate(original, mutation, donors[target])
        lib_path, key_path = scratch / "model_library.so", scratch / "modelKey.bin"
        lib_path.write_bytes(changed if target == "library" else library)
        key_path.write_bytes(changed if target == "key" else key)
        report: dict = {"i": index}
        try:
            runtime = Runtime(lib_path, key_path, plan["password"])
            (got,) = runtime.infer(x)
            report |= {"outcome": "loaded", "equal": bool(np.array_equal(got, expected)),
                       "intact": changed == original}
        except DecryptionError as exc:
            report |= {"outcome": type(exc).__name__, "message": str(exc)[:200]}
        except Exception as exc:  # noqa: BLE001 - the point: anything else is reported as a defect
            report |= {"outcome": "other", "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
