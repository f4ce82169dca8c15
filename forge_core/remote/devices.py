"""``forge.RemoteDevices``: the boards ``IRModule.tune(rpc=...)`` measures candidates on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from forge_core.errors import InputError
from forge_core.remote.tracker import DEFAULT_TIMEOUT, TrackerAddress


@dataclass(frozen=True)
class RemoteDevices:
    """The boards to measure tuning candidates on: ``ir.tune(rpc=RemoteDevices(...))``.

    A mapping with the same keys works too: ``rpc={"tracker": "host:9190", "key": "rpi5"}``.

    Args:
        tracker: The RPC tracker, ``"host:port"``.
        key: The device key the boards' RPC servers registered under.
        devices: How many candidates are measured at once (one a device);
            None: every device of the key registered when tuning starts.
        timeout: Seconds to wait for the tracker to answer.
        session_timeout: Seconds one candidate's measurement may take on a
            board (uploading, loading and timing it) before it counts as failed.
    """

    tracker: str
    key: str
    devices: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    session_timeout: float = 60.0

    @classmethod
    def of(cls, value: RemoteDevices | Mapping[str, Any]) -> RemoteDevices:
        """``value`` as ``RemoteDevices``; an :class:`InputError` naming what is wrong otherwise."""
        if isinstance(value, RemoteDevices):
            devices = value
        elif isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown or not {"tracker", "key"} <= set(value):
                raise InputError(f"rpc takes the keys {', '.join(sorted(known))} (tracker and key required); "
                                 f"given {', '.join(sorted(value)) or 'none'}")
            devices = cls(**value)
        else:
            raise InputError(f"rpc must be a forge.RemoteDevices or a mapping, given {type(value).__name__}")
        TrackerAddress.parse(devices.tracker, "rpc tracker")
        if not devices.key:
            raise InputError("rpc needs a device key")
        if devices.devices is not None and (isinstance(devices.devices, bool) or not isinstance(devices.devices, int)
                                            or devices.devices < 1):
            raise InputError(f"rpc devices must be a positive integer, given {devices.devices!r}")
        if devices.session_timeout <= 0:
            raise InputError(f"rpc session_timeout must be positive, given {devices.session_timeout!r}")
        return devices
