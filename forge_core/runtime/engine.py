"""``Runtime``: Forge's runtime engine for a compiled ``model_library.so``."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm_ffi

from forge_core.errors import (
    ArtifactCorruptedError, CorruptLibraryError, ForgeError, KeyIgnoredWarning, OptionError, PathNotFoundError,
)
from forge_core.runtime import metadata as schema
from forge_core.runtime.devices import ensure_backend
from forge_core.runtime.cpu_features import host_cpu_model, host_machine, missing_features
from forge_core.runtime.library_file import (
    elf_machine,
    load_library_bytes,
    load_library_in_memory,
)
from forge_core.runtime.outputs import outputs_to_numpy, to_device
from forge_core.runtime.profiling import FunctionTime, profile_calls
from forge_core.runtime.signature import SignatureSurface, TensorSpec, check_inputs, explained_run_errors, random_inputs
from forge_core.runtime.vm import VirtualMachine, device_exists
from forge_core.runtime.vm_threads import VMSessions

_DEVICES = ("cpu", "cuda")


def cross_check_metadata_file(library: Path, data: bytes, document: dict[str, Any]) -> None:
    """``model_metadata.json`` beside the library, when present, must describe this very library."""
    side = library.parent / schema.METADATA_FILE
    if not side.is_file():
        return
    try:
        recorded = json.loads(side.read_text(encoding="utf-8"))
        entry = recorded.get("library") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise ArtifactCorruptedError(f"{str(side)!r} beside {str(library)!r} is not a valid metadata JSON "
                                     "document; copy the artifact again, or delete that file") from None
    if entry.get("file") != library.name:
        return  # it describes another file of the directory
    sha256 = hashlib.sha256(data).hexdigest()
    if entry.get("sha256") != sha256:
        raise ArtifactCorruptedError(
            f"{str(library)!r} is not the library {str(side)!r} describes: its SHA-256 is {sha256}, the "
            f"metadata records {entry.get('sha256')}. Copy the artifact directory again as a whole."
        )
    if recorded.get("uuid") != document.get("uuid"):
        raise ArtifactCorruptedError(
            f"{str(side)!r} names uuid {recorded.get('uuid')}, the library {str(library)!r} carries "
            f"{document.get('uuid')}: the two come from different compiles."
        )


def check_cpu_features(library: Path, document: dict[str, Any]) -> None:
    """Refuse a library whose code uses instruction-set extensions this CPU lacks, before anything runs it.

    Without this, the first kernel to execute such an instruction kills the
    process with SIGILL. The extensions come from the metadata's
    ``cpu_features`` (absent from artifacts compiled before Forge recorded
    them: those are not checked).
    """
    recorded = document.get("cpu_features")
    if not recorded or recorded.get("arch") != host_machine():
        return
    missing = missing_features(recorded.get("flags", []))
    if not missing:
        return
    target = (document.get("target") or {}).get("string", "?")
    suggestion = ("'llvm -mcpu=x86-64-v3' for any CPU with AVX2 and FMA" if recorded["arch"] == "x86_64"
                  else "'llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72' for any 64-bit Arm CPU")
    raise ForgeError(
        f"{str(library)!r} is compiled for {target!r}, whose code uses CPU features this CPU "
        f"({host_cpu_model()}) lacks: {', '.join(missing)}. Running it would stop at the first such "
        f"instruction (SIGILL). Recompile it on this machine with target 'llvm' (this CPU), or for a class "
        f"this CPU belongs to, e.g. {suggestion}."
    )


CPU_DEVICE_TYPE = 1  # DLPack's kDLCPU


class LoadedArtifact(SignatureSurface):
    """What a loaded artifact's metadata says, shared by :class:`Runtime` and the remote runtime.

    A subclass sets ``_metadata`` (the embedded document, its ``library`` entry
    ``{"file": path, "sha256": None}``), ``_inputs`` and ``_outputs``.
    """

    _metadata: dict[str, Any]
    _inputs: list[TensorSpec]
    _outputs: list[TensorSpec]

    @functools.cached_property
    def _buckets(self) -> dict[tuple[tuple[int, ...], ...], str]:
        return schema.bucket_functions(self._metadata)

    def _entry_function(self, arrays: Sequence[Any]) -> str:
        """The library function to run on ``arrays``: a shape bucket's when their shapes are its exactly,
        else ``main`` (:mod:`forge_core.compiler.buckets`)."""
        return self._buckets.get(tuple(tuple(a.shape) for a in arrays), "main")

    def get_metadata(self) -> dict[str, Any]:
        """The artifact's metadata (see ``forge_core.runtime.metadata``), with the library file's SHA-256.

        The SHA-256 is of the file at ``library.file``, read on the first call.
        """
        library = self._metadata["library"]
        if library["sha256"] is None:  # on demand (loading checks the library's own checksum, a cheaper one)
            library["sha256"] = hashlib.sha256(Path(library["file"]).read_bytes()).hexdigest()
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
    def initial_state(self) -> dict[str, np.ndarray]:
        """Where a stateful model's state inputs start, by input name (empty for a stateless model): feed them
        to the first call and each ``<name>_next`` output back as the next call's ``<name>``
        (:attr:`forge.IRModule.initial_state`, carried in the artifact's metadata)."""
        return schema.decode_arrays(self._metadata.get("initial_state", {}))

    @property
    def input_specs(self) -> list[TensorSpec]:
        """Name, shape and dtype of each input, as the metadata records them."""
        return list(self._inputs)

    @property
    def output_specs(self) -> list[TensorSpec]:
        """Name, shape and dtype of each output, as the metadata records them."""
        return list(self._outputs)


class Runtime(LoadedArtifact):
    """Load a library that ``IRModule.compile()`` produced, and run it.

    Args:
        library_path: The ``model_library.so`` file, or the directory that
            ``compile()`` wrote (``output_path``).
        key_path: The key file of an encrypted artifact (``modelKey.bin``,
            which ``compile(encrypt_password=...)`` writes beside the
            library). Given for a library that is not encrypted, it is
            ignored with a :class:`~forge_core.errors.KeyIgnoredWarning`.
        password: The password the artifact was encrypted with.

    An encrypted library is decrypted in memory and loaded from an anonymous
    memory file: the plaintext library is never written to a disk. Each way
    it can fail raises its own :class:`~forge_core.errors.DecryptionError`:
    ``MissingKeyError``, ``MissingPasswordError``, ``WrongPasswordError``
    ("wrong password or corrupted key file"), ``CorruptKeyError``,
    ``CorruptLibraryError`` (any modified or missing byte) and
    ``KeyMismatchError`` (the key of another artifact).

    A library whose CPU code uses instruction-set extensions this CPU lacks
    (compiled for ``-mcpu=znver5`` and copied to an AVX2 machine) raises
    :class:`~forge_core.errors.ForgeError` naming them, before anything runs
    (:func:`check_cpu_features`).

    Inputs go positionally as numpy arrays, in the order of ``input_names``;
    ``infer`` returns a list of numpy arrays, one per output.

    Threads: one ``Runtime`` may be shared by any number of threads and
    gives each the results a single thread would. TVM's virtual machine is
    not re-entrant, and TVM starts a worker pool in every thread that runs
    a kernel and never stops it, so the model only runs on two threads: the
    main thread, and Forge's ``forge-inference`` thread, which runs the
    calls of every other thread one at a time, in the order they come
    (:mod:`forge_core.runtime.vm_threads`). Each call uses
    :attr:`num_threads` cores. The weights are shared; each of the two
    threads has its own intermediate buffers.
    """

    def __init__(self, library_path: str | os.PathLike[str], key_path: str | os.PathLike[str] | None = None,
                 password: str | None = None) -> None:
        path = schema.library_path(library_path)
        if not path.is_file():
            raise PathNotFoundError(f"No compiled library at {str(path)!r}")
        if key_path is not None and not Path(key_path).is_file():
            raise PathNotFoundError(f"No key file at {str(key_path)!r}")
        file_bytes = path.read_bytes()
        from forge_core.security.encrypted_library import is_encrypted

        name = repr(str(path))
        encrypted = is_encrypted(file_bytes)
        data = file_bytes
        if encrypted:
            from forge_core.security.opening import open_encrypted

            data = open_encrypted(file_bytes, path, key_path, password)
        try:
            document = schema.library_document(data, name)  # the same checksum, encrypted or not
        except ArtifactCorruptedError:
            if key_path is not None and not encrypted:
                raise CorruptLibraryError(
                    f"{name} is neither an encrypted Forge library nor a plain one: its first bytes are "
                    "damaged, or it is another file. Copy it again from the compile output."
                ) from None
            raise
        cross_check_metadata_file(path, file_bytes, document)
        if not encrypted and (key_path is not None or password is not None):
            given = "a key file" if key_path is not None else "a password"
            warnings.warn(f"{str(path)!r} is not encrypted; {given} was given and is ignored",
                          KeyIgnoredWarning, stacklevel=2)
        embedded = copy.deepcopy(document)
        built_for, here = elf_machine(data), host_machine()
        if built_for is not None and built_for != here:
            raise ForgeError(
                f"{str(path)!r} is built for {built_for}; this machine is {here}. "
                f"Copy the artifact to a {built_for} machine and run it there."
            )
        check_cpu_features(path, document)
        device_type = document.get("device_type", "cpu")
        if device_type not in _DEVICES:
            raise ForgeError(f"{str(path)!r} targets device {device_type!r}, which this runtime cannot drive")
        ensure_backend(device_type, str(path))
        device = tvm_ffi.device(device_type, 0)
        if not device_exists(device):
            raise ForgeError(f"{str(path)!r} is built for {device_type}, and no {device_type} device is present")
        target_cores = (document.get("target") or {}).get("config", {}).get("num-cores")
        self._path = path
        self._metadata = document
        self._metadata["library"] = {"file": str(path), "sha256": None}  # filled by get_metadata()
        self._device = device
        if encrypted:
            def is_this_library(module: Any) -> bool:
                loaded = VirtualMachine(module, device)[schema.METADATA_FUNCTION]()
                return bool(json.loads(str(loaded)) == embedded)

            self._module, descriptor = load_library_in_memory(data, repr(str(path)), is_this_library)
            weakref.finalize(self, os.close, descriptor)
        else:
            self._module = load_library_bytes(data, repr(str(path)))
        del data
        self._sessions = VMSessions(self._module, device, int(target_cores) if target_cores else None)
        self.num_threads = self._sessions.num_threads
        for name in ("main", *self._buckets.values()):  # a missing one fails here, not later
            self._sessions.run(lambda vm, name=name: self._sessions.function(vm, name))
        self._inputs = [TensorSpec.from_json(spec) for spec in document["inputs"]]
        self._outputs = [TensorSpec.from_json(spec) for spec in document["outputs"]]

    @staticmethod
    def remote(library_path: str | os.PathLike[str], tracker: str, key: str, *, timeout: float = 10.0,
               session_timeout: float = 0, priority: int = 1) -> Any:
        """Run the artifact on a remote board, through TVM's RPC tracker.

        The library (built for the board: ``compile(target="raspberry-pi/5")``)
        is checked here, sent to a free device registered under ``key`` and
        loaded there. The returned
        :class:`~forge_core.remote.runtime.RemoteRuntime` has ``infer``,
        ``profile``, ``example_inputs`` and the signature properties of a
        ``Runtime``, and ``latencies()``, timed on the board's clock.

        Args:
            library_path: The ``model_library.so`` file, or its directory.
            tracker: The RPC tracker, ``"host:port"``.
            key: The device key the board's RPC server registered under.
            timeout: Seconds to wait for the tracker to answer.
            session_timeout: Seconds after which the board ends the session (0: never).
            priority: The tracker's priority for the request.

        Raises:
            forge.TrackerUnreachableError: Nothing answers at ``tracker`` within ``timeout``.
            forge.RemoteDeviceError: The tracker has no device of ``key`` (the
                error lists the keys it has), the board cannot load the
                library, or the session is lost.
        """
        from forge_core.remote.runtime import RemoteRuntime

        return RemoteRuntime(library_path, tracker, key, timeout=timeout, session_timeout=session_timeout,
                             priority=priority)

    # -- running ------------------------------------------------------------

    def infer(self, *arrays: Any) -> list[np.ndarray]:
        """Run the model on numpy arrays (positionally) and return its outputs as numpy arrays.

        Safe to call from several threads at once (see the class's note).
        """
        checked = check_inputs(self._inputs, arrays)
        args = [to_device(a, self._device) for a in checked]
        with explained_run_errors(self._inputs, checked):
            return self._sessions.call(self._entry_function(checked), *args, convert=outputs_to_numpy)

    __call__ = infer

    def profile(self, *arrays: Any, repeat: int = 10) -> list[FunctionTime]:
        """Time every function the model calls, over ``repeat`` runs; slowest first.

        Inputs as for :meth:`infer` (random ones when none are given). Each
        row names the schedule rule of its kernel and whether it fell back
        (:func:`forge_core.runtime.profiling.fallback_share` sums those).
        """
        checked = check_inputs(self._inputs, arrays or self.example_inputs())
        args = [to_device(a, self._device) for a in checked]
        schedules = self._metadata.get("schedules")

        entry = self._entry_function(checked)

        sync = None
        if self._device.dlpack_device_type() != CPU_DEVICE_TYPE:  # a GPU: each call timed to its kernel's end
            sync = functools.partial(tvm_ffi.get_global_func("runtime.Device_StreamSync"), self._device, 0)

        def profile(vm: VirtualMachine) -> list[FunctionTime]:
            main = self._sessions.function(vm, entry)
            main(*args)
            return profile_calls(vm, lambda: main(*args), repeat, schedules, sync)

        return self._sessions.run(profile)

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs matching the signature (dynamic dimensions set to 1)."""
        return random_inputs(self._inputs, seed)

    def warm_up(self, n: int = 10, inputs: Sequence[np.ndarray] | None = None) -> None:
        """Run the model ``n`` times on ``inputs`` (random ones matching the signature when None), so later
        timings are steady.

        Give the inputs you will time with a model of dynamic dims: the random
        ones set those dims to 1, which a detector whose sizes must be multiples
        of its stride refuses, and which warms up another size.
        """
        if n < 0:
            raise OptionError(f"warm_up needs a non-negative count, given {n}")
        inputs = list(inputs) if inputs is not None else self.example_inputs()
        for _ in range(n):
            self.infer(*inputs)

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self._inputs)
        return f"<forge Runtime {str(self._path)!r} uuid={self.uuid} device={self.device_type} inputs=[{ins}]>"
