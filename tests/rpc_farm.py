"""A board farm on this machine's loopback: TVM's RPC tracker and RPC servers, as real subprocesses.

``with RPCFarm() as farm: farm.add_server("key"); ...``: the tracker and every
server run in their own process group, and leaving the block kills each
group (a server's session processes with it), so nothing a test starts
outlives it. Used by ``tests/test_remote.py`` and ``benchmarks/rpc_tuning.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from forge_core.errors import ForgeError
from forge_core.remote.tracker import connect


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def sessions(self) -> int:
        """Sessions this server accepted (``forge rpc-server`` logs each one)."""
        return self.text().count("connected from")

    def kill(self) -> None:
        """The whole process group, at once, as a board that loses power or network."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=30)


@dataclass
class RPCFarm:
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    processes: list[Process] = field(default_factory=list)
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="forge-rpc-farm-")))

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"

    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None,
               cwd: Path | None = None) -> Process:
        log = self.logs / f"{name}.log"
        with log.open("w") as handle:
            popen = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}, cwd=cwd)
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def __enter__(self) -> RPCFarm:
        self._start("tracker", [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", self.host,
                                "--port", str(self.port), "--port-end", str(self.port + 1)])
        return self

    def add_server(self, key: str, *, forge: bool = True, wait: bool = True) -> Process:
        """An RPC server registered under ``key``: ``forge rpc-server``, or TVM's own with ``forge=False``."""
        port = free_port()
        if forge:
            args = [sys.executable, "-m", "forge_core.cli", "rpc-server", "--tracker", self.tracker, "--key", key,
                    "--host", self.host, "--port", str(port)]
        else:
            args = [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", self.tracker, "--key", key,
                    "--host", self.host, "--port", str(port), "--port-end", str(port + 1)]
        before = self.count(key, allow_down=True)
        server = self._start(f"{'forge' if forge else 'tvm'}-server-{len(self.processes)}", args)
        if wait:
            self.wait_for(key, before + 1, server)
        return server

    def add_board(self, key: str, command: list[str], *, env: dict[str, str], cwd: Path,
                  seconds: float = 300) -> Process:
        """A board's own server command (an emulated board's Python), run in ``cwd`` with ``env`` alone; it is
        given ``--tracker``, ``--key``, ``--host`` and a free ``--port``, and waited for."""
        port = free_port()
        before = self.count(key, allow_down=True)
        board = self._start(f"board-{len(self.processes)}", [
            *command, "--tracker", self.tracker, "--key", key, "--host", self.host, "--port", str(port),
            "--port-end", str(port + 1)], env=env, cwd=cwd)
        self.wait_for(key, before + 1, board, seconds)
        return board

    def count(self, key: str, allow_down: bool = False) -> int:
        try:
            tracker = connect(self.tracker, 2.0)
        except ForgeError:
            if allow_down:
                return 0
            raise
        try:
            return tracker.devices(key).total
        finally:
            tracker.close()

    def wait_for(self, key: str, total: int, process: Process | None = None, seconds: float = 120) -> None:
        """Until the tracker lists ``total`` servers of ``key``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if process is not None and process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.text()}")
            if self.count(key, allow_down=True) == total:
                return
            time.sleep(0.2)
        raise TimeoutError(f"the tracker did not list {total} servers of {key!r} in {seconds:g} s")

    def __exit__(self, kind: object, *exc: object) -> None:
        for process in reversed(self.processes):
            process.kill()
        if kind is None:  # the logs are kept for a failure to read
            shutil.rmtree(self.logs, ignore_errors=True)
