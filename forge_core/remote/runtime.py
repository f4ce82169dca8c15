"""``Runtime.remote``: run a compiled artifact on a board reached through TVM's RPC tracker.

The library is checked here (its checksum, the metadata beside it), sent to
a free device of the key, loaded there by TVM's runtime, and driven from
here: inputs go over, outputs come back. Timings are taken on the board, by
TVM's ``time_evaluator`` on the board's clock, so the network is not in
them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine  # TVM's runtime library: no compiler needed

from forge_core.errors import ForgeError, OptionError, PathNotFoundError, RemoteDeviceError
from forge_core.remote.server import PROFILE_FUNCTION
from forge_core.remote.tracker import DEFAULT_TIMEOUT, TrackerAddress, last_line, open_session
from forge_core.runtime import metadata as schema
from forge_core.runtime.engine import LoadedArtifact, cross_check_metadata_file
from forge_core.runtime.library_file import elf_machine
from forge_core.runtime.outputs import outputs_to_numpy
from forge_core.runtime.profiling import FunctionTime
from forge_core.runtime.signature import TensorSpec, check_inputs, random_inputs

logger = logging.getLogger("forge.remote")


class RemoteRuntime(LoadedArtifact):
    """A compiled library running on a remote device; made by :meth:`forge.Runtime.remote`.

    Args:
        library_path: The ``model_library.so`` file, or the directory
            ``compile()`` wrote, built for the board's CPU.
        tracker: The RPC tracker, ``"host:port"``.
        key: The device key the board's RPC server registered under.
        timeout: Seconds to wait for the tracker to answer
            (:class:`~forge_core.errors.TrackerUnreachableError` after).
            Waiting for a busy device of the key is not bounded.
        session_timeout: Seconds after which the board's server ends the
            session (0: never).
        priority: The tracker's priority for this request.

    The session holds the device until :meth:`close` (or the end of a
    ``with`` block): other clients of the key wait for it meanwhile.
    Calls from several threads are served one at a time.

    Encrypted artifacts do not run remotely: TVM's RPC server loads plain
    libraries only and its channel is not encrypted, so running one would
    send the decrypted model over the network. Run an encrypted artifact on
    the board with Forge's runtime instead.
    """

    def __init__(self, library_path: str | os.PathLike[str], tracker: str, key: str, *,
                 timeout: float = DEFAULT_TIMEOUT, session_timeout: float = 0, priority: int = 1) -> None:
        from forge_core.security.encrypted_library import is_encrypted

        path = schema.library_path(library_path)
        if not path.is_file():
            raise PathNotFoundError(f"No compiled library at {str(path)!r}")
        data = path.read_bytes()
        if is_encrypted(data):
            raise ForgeError(
                f"{str(path)!r} is encrypted, and encrypted artifacts do not run through RPC: TVM's RPC server "
                "loads plain libraries only, over an unencrypted channel. Copy the artifact and its key to the "
                "board and run it there with forge.Runtime (or `forge run`), or compile it without encryption "
                "to measure it remotely."
            )
        document = schema.library_document(data, repr(str(path)))
        cross_check_metadata_file(path, data, document)
        device_type = str(document.get("device_type", "cpu"))
        if device_type not in ("cpu", "cuda"):
            raise ForgeError(f"{str(path)!r} targets device {device_type!r}, which Forge cannot drive remotely")
        self._path = path
        self._metadata = document
        self._metadata["library"] = {"file": str(path), "sha256": None}
        self._inputs = [TensorSpec.from_json(spec) for spec in document["inputs"]]
        self._outputs = [TensorSpec.from_json(spec) for spec in document["outputs"]]
        self.tracker = TrackerAddress.parse(tracker, "tracker")
        self.key = key
        self._lock = threading.Lock()
        self._session = open_session(self.tracker, key, timeout=timeout, session_timeout=session_timeout,
                                     priority=priority)
        try:
            self._device = self._session.device(device_type, 0)
            remote_name = f"forge-{document['uuid']}.so"
            self._session.upload(bytearray(data), remote_name)
            try:
                self._library = self._session.load_module(remote_name)
            except Exception as exc:  # noqa: BLE001 - TVM reports a dlopen failure as its own error
                built_for = elf_machine(data) or "an unknown machine"
                raise RemoteDeviceError(
                    f"the device of key {key!r} could not load {str(path)!r}, built for {built_for}: "
                    f"{last_line(exc)}. Compile for the board's target (forge tags lists them)."
                ) from None
            self._vm = VirtualMachine(self._library, self._device)
            self._vm._get_function_arity("main")  # no ``main``: fails here, not later
        except BaseException:
            self.close()
            raise
        logger.info("%s runs on a device of key %r through %s", path, key, self.tracker)

    # -- running ------------------------------------------------------------

    def _remote_args(self, arrays: tuple[Any, ...]) -> tuple[str, list[Any]]:
        """The inputs checked against the signature and copied to the device, and the function that runs
        them (a shape bucket's, or ``main``)."""
        checked = check_inputs(self._inputs, arrays)
        args = [tvm.runtime.tensor(np.ascontiguousarray(a), self._device) for a in checked]
        return self._entry_function(checked), args

    def _set_inputs(self, arrays: tuple[Any, ...]) -> str:
        entry, args = self._remote_args(arrays)
        self._vm.set_input(entry, *args)
        return entry

    def infer(self, *arrays: Any) -> list[np.ndarray]:
        """Run the model on the board on numpy arrays (positionally); its outputs, brought back as numpy arrays."""
        with self._lock, _lost_session(self):
            entry = self._set_inputs(arrays)
            self._vm.invoke_stateful(entry)
            return outputs_to_numpy(self._vm.get_outputs(entry))

    __call__ = infer

    def latencies(self, *arrays: Any, repeat: int = 100, number: int = 1) -> np.ndarray:
        """The latency of the model (``main``, or the shape bucket the inputs fit) in milliseconds, ``repeat`` times, timed on the board's clock.

        Each value is the mean of ``number`` runs; one run before them is not
        counted. Inputs as for :meth:`infer` (random ones when none are given).
        """
        if repeat < 1 or number < 1:
            raise OptionError(f"repeat and number must be at least 1, given {repeat} and {number}")
        with self._lock, _lost_session(self):
            entry = self._set_inputs(arrays or tuple(self.example_inputs()))
            timer = self._vm.time_evaluator("invoke_stateful", self._device, number=number, repeat=repeat)
            result = timer(entry)
        return np.asarray(result.results, dtype=np.float64) * 1000.0

    def profile(self, *arrays: Any, repeat: int = 10) -> list[FunctionTime]:
        """Time every function the model calls, on the board, over ``repeat`` runs; slowest first.

        Needs Forge's server on the board (``forge rpc-server``): TVM's RPC
        carries no callback, so the timing has to run there. With TVM's own
        server, :class:`~forge_core.errors.RemoteDeviceError` says so;
        :meth:`latencies` works with either.
        """
        schedules = self._metadata.get("schedules") or {}
        with self._lock, _lost_session(self):
            try:
                function = self._session.get_function(PROFILE_FUNCTION)
            except Exception:  # noqa: BLE001 - TVM raises its own error for a missing function
                raise RemoteDeviceError(
                    f"the device of key {self.key!r} runs TVM's RPC server without Forge's profiler; start it "
                    f"with `forge rpc-server --tracker {self.tracker} --key {self.key}` for a per-function "
                    "profile (latencies() and `forge run` time the whole model with either server)"
                ) from None
            _, args = self._remote_args(arrays or tuple(self.example_inputs()))  # the server profiles ``main``
            rows = json.loads(str(function(self._library, repeat, *args)))
        rules = dict(schedules.get("rules", {}))
        fallbacks = set(schedules.get("fallbacks", ()))
        return [FunctionTime(row["name"], row["calls"], row["total_ms"], row["share"], rules.get(row["name"]),
                             row["name"] in fallbacks) for row in rows]

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs matching the signature (dynamic dimensions set to 1)."""
        return random_inputs(self._inputs, seed)

    def close(self) -> None:
        """End the session: the device is free for other clients."""
        session = self.__dict__.pop("_session", None)
        for name in ("_vm", "_library"):
            self.__dict__.pop(name, None)
        del session  # TVM closes the connection with the session's last reference

    def __enter__(self) -> RemoteRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<forge RemoteRuntime {str(self._path)!r} uuid={self.uuid} key={self.key!r} "
                f"tracker={self.tracker}>")


class _lost_session:
    """Turns TVM's error for a session that broke (the board went away) into a :class:`RemoteDeviceError`."""

    def __init__(self, runtime: RemoteRuntime) -> None:
        self.runtime = runtime

    def __enter__(self) -> None:
        if "_session" not in self.runtime.__dict__:
            raise RemoteDeviceError(f"{self.runtime!r} is closed")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, ForgeError | ValueError | KeyboardInterrupt):
            return False
        if isinstance(exc, tvm.error.TVMError | OSError | RuntimeError):
            raise RemoteDeviceError(
                f"the session on the device of key {self.runtime.key!r} (tracker {self.runtime.tracker}) "
                f"failed: {last_line(exc)}"
            ) from exc
        return False

