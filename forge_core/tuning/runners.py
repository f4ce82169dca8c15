"""Where tuning candidates are built and measured: here, or on boards behind TVM's RPC tracker.

Locally, MetaSchedule's ``LocalRunner`` times each candidate on this
machine. Remotely, candidates are still built here (cross-compiled and
linked for the board by the same toolchain ``compile()`` uses), and
MetaSchedule's ``RPCRunner`` measures them on the devices of one key, one
candidate a device at a time, all devices in parallel. Forge gives the
runner its own session factory (:func:`create_session`), so that every
candidate's wait for the tracker is bounded as ``forge run``'s is.

**Faults.** A device that disconnects while measuring makes that
candidate's result an error; MetaSchedule marks the candidate failed and
goes on, and the next candidates go to the devices still registered. A
client-side timeout (the session timeout plus a margin) ends a measurement
whose device stopped answering without closing the connection.
"""

from __future__ import annotations

import functools
from typing import Any

from tvm.s_tir import meta_schedule as ms

from forge_core.remote.devices import RemoteDevices
from forge_core.remote.tracker import TrackerAddress, connect, open_session

EVALUATOR = dict(number=3, repeat=1, min_repeat_ms=20)
"""How each candidate is timed, here or on a board: 3 runs, at least 20 ms in all."""


def create_session(timeout: float, config: ms.runner.RPCConfig) -> Any:
    """MetaSchedule's session factory, run in the runner's workers: a session within Forge's bounded wait."""
    address = TrackerAddress(str(config.tracker_host), int(config.tracker_port))
    return open_session(address, str(config.tracker_key), timeout=timeout,
                        session_timeout=config.session_timeout_sec, priority=config.session_priority)


def device_count(devices: RemoteDevices) -> int:
    """How many candidates to measure at once: as asked, or every device of the key the tracker has now."""
    tracker = connect(devices.tracker, devices.timeout)
    try:
        count = tracker.require(devices.key)
    finally:
        tracker.close()
    return devices.devices or count.total


def make_runner(remote: RemoteDevices | None, workers: int = 1) -> Any:
    """MetaSchedule's runner: ``LocalRunner``, or ``RPCRunner`` over ``workers`` devices of ``remote``'s key."""
    evaluator = ms.runner.EvaluatorConfig(**EVALUATOR)
    if remote is None:
        return ms.runner.LocalRunner(evaluator_config=evaluator)
    address = TrackerAddress.parse(remote.tracker)
    config = ms.runner.RPCConfig(tracker_host=address.host, tracker_port=address.port, tracker_key=remote.key,
                                 session_priority=1, session_timeout_sec=int(remote.session_timeout))
    runner = ms.runner.RPCRunner(
        rpc_config=config, evaluator_config=evaluator, max_workers=workers,
        f_create_session=functools.partial(create_session, remote.timeout),
    )
    from tvm.support.popen_pool import PopenPoolExecutor

    # TVM's pool waits on a device for ever; this one gives up after the session's timeout and a margin.
    runner.pool = PopenPoolExecutor(max_workers=workers, timeout=remote.session_timeout + remote.timeout + 10)
    return runner
