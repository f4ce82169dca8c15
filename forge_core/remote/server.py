"""``forge rpc-server``: TVM's RPC server, with Forge's per-function profiler registered in it.

A board needs only TVM's runtime and its RPC server to run a Forge artifact
remotely and to measure tuning candidates: ``python -m tvm.exec.rpc_server
--tracker HOST:PORT --key KEY``. Forge's own server is that same server
(``tvm.rpc.Server``) with one function more, ``forge.remote.profile``: it
times every function of the model's ``main`` on the board, which
:meth:`forge_core.remote.runtime.RemoteRuntime.profile` calls. TVM's RPC
carries no callback from the client, so per-function timing has to run on
the board's side.

Like TVM's server, it gives whoever reaches it the right to load and run
any library: run it on a trusted network only.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from dataclasses import asdict
from typing import Any

from forge_core.remote.tracker import TrackerAddress

logger = logging.getLogger("forge.remote")

PROFILE_FUNCTION = "forge.remote.profile"
"""The global function ``forge rpc-server`` registers: ``(module, repeat, *inputs) -> JSON rows``."""


def _profile(module: Any, repeat: int, *inputs: Any) -> str:
    """Time every call of ``main`` of the library ``module``, on this machine; the rows as JSON."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from forge_core.runtime.profiling import profile_calls

    vm = VirtualMachine(module, tvm.cpu())
    main = vm["main"]
    main(*inputs)  # the first call allocates the memory pool: not timed
    rows = profile_calls(vm, lambda: main(*inputs), int(repeat))
    return json.dumps([asdict(row) for row in rows])


def register_functions() -> None:
    """TVM's ``server_init_callback``, run in the server's process: Forge's functions, and a log of sessions.

    Each session the server accepts is logged on standard error (``connected from ...``, ``finish
    serving ...``), so a board's operator sees who uses it.
    """
    import sys

    import tvm

    tvm.register_global_func(PROFILE_FUNCTION, _profile, override=True)
    server_log = logging.getLogger("RPCServer")
    if not server_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("forge rpc-server: %(message)s"))
        server_log.addHandler(handler)
        server_log.setLevel(logging.INFO)
        server_log.propagate = False


def serve(tracker: str | None, key: str, host: str = "0.0.0.0", port: int = 9090, port_end: int = 9199,
          custom_addr: str | None = None) -> None:
    """Run an RPC server until interrupted; registered with ``tracker`` under ``key`` when one is given."""
    from tvm import rpc

    address = TrackerAddress.parse(tracker, "--tracker") if tracker else None
    if address is not None and not key:
        from forge_core.errors import InputError

        raise InputError("a server registered with a tracker needs --key: the device key clients ask for")
    server = rpc.Server(
        host, port, max(port_end, port + 1), key=key, tracker_addr=(address.host, address.port) if address else None,
        custom_addr=custom_addr, server_init_callback=register_functions,
    )
    where = f"registered with {address} as {key!r}" if address else "without a tracker"
    logger.info("RPC server on %s:%d, %s", host, server.port, where)
    print(f"forge rpc-server: listening on {host}:{server.port}, {where}; Ctrl-C stops it", flush=True)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set() and server.proc.is_alive():
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.terminate()
