"""``Runtime``: Forge's runtime engine for a compiled ``model_library.so``."""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import ForgeError
from forge_core.runtime import metadata as schema
from forge_core.runtime.library_file import elf_machine, host_machine, load_library_bytes
from forge_core.runtime.outputs import outputs_to_numpy, to_device
from forge_core.runtime.profiling import FunctionTime, profile_calls
from forge_core.runtime.signature import DYNAMIC_DIM, TensorSpec, check_inputs
from forge_core.threads import configure_threads

_DEVICES = {"cpu": tvm.cpu, "cuda": tvm.cuda}


class Runtime:
    """Load a library that ``IRModule.compile()`` produced, and run it.

    Args:
        library_path: The ``model_library.so`` file, or the directory that
            ``compile()`` wrote (``output_path``).
        key_path: The key file of an encrypted artifact. Encrypted artifacts
            arrive with a later release; passing a key raises
            ``NotImplementedError``.
        password: The password of an encrypted artifact (see ``key_path``).

    Inputs go positionally as numpy arrays, in the order of ``input_names``;
    ``infer`` returns a list of numpy arrays, one per output.
    """

    def __init__(self, library_path: str | os.PathLike[str], key_path: str | os.PathLike[str] | None = None,
                 password: str | None = None) -> None:
        if key_path is not None or password is not None:
            raise NotImplementedError(
                "Encrypted artifacts (key_path, password) arrive with a later Forge release; "
                "this runtime loads unencrypted libraries only."
            )
        path = Path(library_path)
        if path.is_dir():
            path = path / schema.LIBRARY_FILE
        if not path.is_file():
            raise FileNotFoundError(f"No compiled library at {str(path)!r}")
        data = path.read_bytes()
        document = schema.read_embedded(data)
        if document is None:
            raise ForgeError(f"{str(path)!r} is not a Forge library: it carries no Forge metadata")
        built_for, here = elf_machine(data), host_machine()
        if built_for is not None and built_for != here:
            raise ForgeError(
                f"{str(path)!r} is built for {built_for}; this machine is {here}. "
                f"Copy the artifact to a {built_for} machine and run it there."
            )
        device_type = document.get("device_type", "cpu")
        if device_type not in _DEVICES:
            raise ForgeError(f"{str(path)!r} targets device {device_type!r}, which this runtime cannot drive")
        device = _DEVICES[device_type](0)
        if not device.exist:
            raise ForgeError(f"{str(path)!r} is built for {device_type}, and no {device_type} device is present")
        target_cores = (document.get("target") or {}).get("config", {}).get("num-cores")
        self.num_threads = configure_threads(int(target_cores) if target_cores else None)
        self._path = path
        self._metadata = document
        self._metadata["library"] = {"file": str(path), "sha256": hashlib.sha256(data).hexdigest()}
        self._device = device
        self._module = load_library_bytes(data, repr(str(path)))
        self._vm = relax.VirtualMachine(self._module, device)
        self._main = self._vm["main"]
        self._inputs = [TensorSpec.from_json(spec) for spec in document["inputs"]]
        self._outputs = [TensorSpec.from_json(spec) for spec in document["outputs"]]

    # -- running ------------------------------------------------------------

    def infer(self, *arrays: Any) -> list[np.ndarray]:
        """Run the model on numpy arrays (positionally) and return its outputs as numpy arrays."""
        checked = check_inputs(self._inputs, arrays)
        args = [to_device(a, self._device) for a in checked]
        return outputs_to_numpy(self._main(*args))

    __call__ = infer

    def profile(self, *arrays: Any, repeat: int = 10) -> list[FunctionTime]:
        """Time every function the model calls, over ``repeat`` runs; slowest first.

        Inputs as for :meth:`infer` (random ones when none are given). Each
        row names the schedule rule of its kernel and whether it fell back
        (:func:`forge_core.runtime.profiling.fallback_share` sums those).
        """
        checked = check_inputs(self._inputs, arrays or self.example_inputs())
        args = [to_device(a, self._device) for a in checked]
        self._main(*args)
        return profile_calls(self._vm, lambda: self._main(*args), repeat, self._metadata.get("schedules"))

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs matching the signature (dynamic dimensions set to 1)."""
        rng = np.random.default_rng(seed)
        arrays = []
        for spec in self._inputs:
            shape = tuple(1 if d == DYNAMIC_DIM else d for d in (spec.shape or ()))
            if np.issubdtype(np.dtype(spec.dtype), np.floating):
                arrays.append(rng.standard_normal(shape).astype(spec.dtype))
            elif spec.dtype == "bool":
                arrays.append(rng.integers(0, 2, shape).astype(bool))
            else:
                arrays.append(rng.integers(0, 2, shape).astype(spec.dtype))
        return arrays

    def warm_up(self, n: int = 10) -> None:
        """Run the model ``n`` times on random inputs, so later timings are steady."""
        if n < 0:
            raise ValueError(f"warm_up needs a non-negative count, given {n}")
        inputs = self.example_inputs()
        for _ in range(n):
            self.infer(*inputs)

    # -- what the library is ----------------------------------------------------

    def get_metadata(self) -> dict[str, Any]:
        """The artifact's metadata (see ``forge_core.runtime.metadata``), with the library's SHA-256."""
        return copy.deepcopy(self._metadata)

    @property
    def uuid(self) -> str:
        """The artifact's uuid, read from inside the library."""
        return str(self._metadata["uuid"])

    @property
    def device_type(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return str(self._metadata.get("device_type", "cpu"))

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self._inputs]

    @property
    def input_shapes(self) -> list[tuple[int, ...] | None]:
        """Input shapes; ``-1`` marks a dynamic dimension."""
        return [s.shape for s in self._inputs]

    @property
    def input_dtypes(self) -> list[str]:
        return [s.dtype for s in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self._outputs]

    @property
    def output_shapes(self) -> list[tuple[int, ...] | None]:
        """Output shapes; ``-1`` marks a dynamic dimension."""
        return [s.shape for s in self._outputs]

    @property
    def output_dtypes(self) -> list[str]:
        return [s.dtype for s in self._outputs]

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self._inputs)
        return f"<forge Runtime {str(self._path)!r} uuid={self.uuid} device={self.device_type} inputs=[{ins}]>"
