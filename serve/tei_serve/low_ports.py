"""Binding ports below 1024 as a non-root user, without a sysctl.

The serving images give their python interpreter the file capability
`cap_net_bind_service=+p`: *permitted* only, not effective. A process started from it holds
the capability but cannot use it until it moves it into its effective set, which
`enable_low_port_bind` does before any socket is bound. Permitted-only rather than `+ep`
because the kernel refuses to exec a `+ep` binary when the container's bounding set lacks
the capability (Kubernetes' restricted profile drops ALL): with `+p` the interpreter still
starts there, and only a port below 1024 fails, with a message saying what to change.

Capabilities belong to a thread; threads started afterwards inherit them, so this runs in
the main thread before the model (and onnxruntime's threads) load.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

CAP_NET_BIND_SERVICE = 10
_CAPABILITY_VERSION_3 = 0x20080522  # two 32-bit words per set


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Sets(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _call(name: str, header: _Header, sets: ctypes.Array[_Sets]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(ctypes.byref(header), sets) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def enable_low_port_bind() -> bool:
    """Make CAP_NET_BIND_SERVICE effective if this process is permitted to; True when the
    thread can now bind ports below 1024 (always for root with its default capabilities)."""
    if not sys.platform.startswith("linux"):
        return False
    header = _Header(_CAPABILITY_VERSION_3, 0)
    sets = (_Sets * 2)()
    _call("capget", header, sets)
    bit = 1 << CAP_NET_BIND_SERVICE
    if sets[0].effective & bit:
        return True
    if not sets[0].permitted & bit:
        return False
    sets[0].effective |= bit
    _call("capset", header, sets)
    return True


def unprivileged_port_start() -> int:
    """The lowest port any user may bind in this network namespace (Docker sets 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


def prepare_bind(port: int) -> bool:
    """Whether this process may bind `port` (0: any free one), after raising
    CAP_NET_BIND_SERVICE if needed. A sandbox that refuses capget/capset counts as no."""
    if port == 0 or port >= unprivileged_port_start():
        return True
    try:
        return enable_low_port_bind()
    except OSError:
        return False
