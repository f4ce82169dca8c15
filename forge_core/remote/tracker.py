"""Boards behind TVM's RPC tracker: reaching the tracker, the devices of a key, a session on one.

Forge writes no networking of its own. The tracker, the RPC servers on the
boards and the session protocol are TVM's (``tvm.rpc``). This module adds
two things TVM's client leaves out, measured on TVM 0.27:

- **A bounded wait for the tracker.** ``tvm.rpc.connect_tracker`` retries a
  refused connection for 60 s, and waits on an address that never answers
  (a board that is off, a firewall dropping packets) for the system's TCP
  timeout, about two minutes on Linux. Forge connects with a timeout of its
  own, :data:`DEFAULT_TIMEOUT` seconds unless told otherwise
  (``--rpc-timeout``), and raises :class:`~forge_core.errors.TrackerUnreachableError`.
- **A key without devices fails at once.** The tracker queues a request for
  a key that no server registered and never answers it. Forge reads the
  tracker's summary first and names the keys it has.

Waiting for a *busy* device is not bounded: the tracker answers when one of
the key's devices is free, which is what queuing on a shared board farm means.
"""

from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any

from tvm import rpc
from tvm.rpc import base

from forge_core.errors import InputError, RemoteDeviceError, TrackerProtocolError, TrackerUnreachableError

logger = logging.getLogger("forge.remote")

DEFAULT_TIMEOUT = 10.0
"""Seconds Forge waits for the tracker to answer before it raises ``TrackerUnreachableError``."""

DEFAULT_PORT = 9190
"""The port ``python -m tvm.exec.rpc_tracker`` listens on by default."""


@dataclass(frozen=True)
class TrackerAddress:
    """Where the tracker listens: ``host:port``."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str | tuple[str, int] | TrackerAddress, option: str = "tracker") -> TrackerAddress:
        """``"host:port"`` (or ``(host, port)``) as an address; an :class:`InputError` naming ``option`` otherwise."""
        if isinstance(text, TrackerAddress):
            return text
        if isinstance(text, tuple) and len(text) == 2:
            host, port_text = text[0], str(text[1])
        elif isinstance(text, str) and text.rpartition(":")[0]:
            host, _, port_text = text.rpartition(":")
            host = host.strip("[]")  # an IPv6 address in brackets
        else:
            raise InputError(f"{option} must be HOST:PORT (for example 192.168.1.10:{DEFAULT_PORT}), given {text!r}")
        try:
            port = int(port_text)
        except ValueError:
            port = -1
        if not host or not 0 < port < 65536:
            raise InputError(f"{option} must be HOST:PORT with a port from 1 to 65535, given {text!r}")
        return cls(str(host), port)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class DeviceCount:
    """The devices of one key, as the tracker counts them."""

    key: str
    total: int
    """RPC servers registered under the key."""
    free: int
    """Of those, how many no session holds now."""
    pending: int
    """Requests for the key waiting for a free device."""


class TrackerClient(rpc.TrackerSession):
    """TVM's tracker session, connected within ``timeout`` seconds.

    Every exchange with the tracker (the summary, a request) then waits at
    most ``timeout`` for the tracker to answer, except :meth:`request`, which
    waits for a free device as long as that takes.
    """

    def __init__(self, address: TrackerAddress, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.address = address
        self.timeout = float(timeout)
        try:
            super().__init__((address.host, address.port))
        except (OSError, RuntimeError, struct.error) as exc:
            raise _unreachable(address, self.timeout, exc) from None

    def _connect(self) -> None:  # TVM's, with a timeout on the connect and the handshake
        sock = socket.create_connection((self.address.host, self.address.port), timeout=self.timeout)
        try:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            answer = base.recvall(sock, 4)
        except BaseException:
            sock.close()
            raise
        if struct.unpack("<i", answer)[0] != base.RPC_TRACKER_MAGIC:
            sock.close()
            raise TrackerProtocolError("it answered, but not as a TVM RPC tracker")
        self._sock = sock

    def summary(self) -> dict[str, Any]:
        """The tracker's summary: its servers (``server_info``) and each key's queue (``queue_info``)."""
        try:
            return dict(super().summary())
        except (OSError, RuntimeError, ValueError) as exc:
            raise _unreachable(self.address, self.timeout, exc) from None

    def devices(self, key: str) -> DeviceCount:
        """How many devices of ``key`` the tracker has, and how many are free."""
        summary = self.summary()
        total = sum(1 for server in summary.get("server_info", ()) if _server_key(server) == key)
        queue = summary.get("queue_info", {}).get(key, {})
        return DeviceCount(key, total, int(queue.get("free", 0)), int(queue.get("pending", 0)))

    def keys(self) -> list[str]:
        """Every device key with at least one registered server."""
        return sorted({_server_key(server) for server in self.summary().get("server_info", ())})

    def require(self, key: str) -> DeviceCount:
        """The devices of ``key``; a :class:`RemoteDeviceError` naming the keys there are when it has none."""
        count = self.devices(key)
        if count.total == 0:
            others = self.keys()
            there = f"the keys it has: {', '.join(others)}" if others else "no device is registered at all"
            raise RemoteDeviceError(
                f"the RPC tracker at {self.address} has no device of key {key!r} ({there}). On the board, "
                f"start a server with `forge rpc-server --tracker {self.address} --key {key}` (or "
                f"`python -m tvm.exec.rpc_server --tracker {self.address} --key {key}`)."
            )
        return count

    def open(self, key: str, *, session_timeout: float = 0, priority: int = 1) -> rpc.RPCSession:
        """A session on a free device of ``key``; waits for one while all are busy.

        ``session_timeout`` (seconds, 0 for none) lets the server end a session that lasts longer.
        """
        count = self.require(key)
        if count.free == 0:
            logger.debug("waiting for a free device of key %r (%d registered, all busy)", key, count.total)
        assert self._sock is not None
        self._sock.settimeout(None)  # the tracker answers when a device is free
        try:
            return self.request(key, priority=priority, session_timeout=session_timeout, max_retry=3)
        except (OSError, RuntimeError) as exc:
            raise RemoteDeviceError(
                f"no session on a device of key {key!r} through the tracker at {self.address}: {last_line(exc)}"
            ) from None
        finally:
            if self._sock is not None:
                self._sock.settimeout(self.timeout)


def connect(address: str | TrackerAddress, timeout: float = DEFAULT_TIMEOUT) -> TrackerClient:
    """The tracker at ``address`` (``"host:port"``), reached within ``timeout`` seconds."""
    if not timeout or timeout <= 0:
        raise InputError(f"the tracker timeout must be a positive number of seconds, given {timeout!r}")
    return TrackerClient(TrackerAddress.parse(address), timeout)


def open_session(address: str | TrackerAddress, key: str, *, timeout: float = DEFAULT_TIMEOUT,
                 session_timeout: float = 0, priority: int = 1) -> rpc.RPCSession:
    """A session on a free device of ``key`` registered with the tracker at ``address``."""
    tracker = connect(address, timeout)
    try:
        return tracker.open(key, session_timeout=session_timeout, priority=priority)
    finally:
        tracker.close()


def _server_key(server: dict[str, Any]) -> str:
    return str(server.get("key", "")).split(":", 1)[-1]  # "server:rpi5" -> "rpi5"


def last_line(exc: BaseException) -> str:
    """The last non-empty line of an error's message (TVM's errors end with the reason), or its type."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _unreachable(address: TrackerAddress, timeout: float, exc: BaseException) -> TrackerUnreachableError:
    if isinstance(exc, TimeoutError | socket.timeout):
        why = f"no answer within {timeout:g} s"
    elif isinstance(exc, ConnectionRefusedError):
        why = "connection refused: nothing listens there"
    elif isinstance(exc, socket.gaierror):
        why = f"the host name does not resolve ({exc.strerror})"
    else:
        why = last_line(exc)
    return TrackerUnreachableError(
        f"cannot reach the RPC tracker at {address}: {why}. Start one with `python -m tvm.exec.rpc_tracker "
        f"--host 0.0.0.0 --port {address.port}`, or check the address; Forge waits {timeout:g} s for it "
        "(--rpc-timeout, or timeout=)."
    )
