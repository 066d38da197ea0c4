"""Loaded by every Python process of the air-gapped tests (PYTHONPATH): an audit hook that
records, then refuses, every DNS lookup and connect that is not to loopback.

Recording proves "zero attempts" (a network namespace alone only proves that no attempt
succeeded; library code may swallow the failure); refusing makes it a guard where no network
namespace can be made. The log is $TEI_NET_AUDIT, one JSON line per attempt.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from pathlib import Path

_LOG = os.environ.get("TEI_NET_AUDIT")
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


def _is_loopback(host: object) -> bool:
    if host is None:
        return True  # getaddrinfo(None, port): the wildcard address for bind
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host in _LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect":
        address = args[1]
        if not isinstance(address, tuple):
            return  # AF_UNIX paths are local by definition
        host = address[0]
    else:
        return
    if _is_loopback(host):
        return
    if _LOG:
        with Path(_LOG).open("a") as f:
            f.write(json.dumps({"event": event, "host": str(host), "argv": sys.argv[:2]}) + "\n")
    raise OSError(f"tei-onnx network guard: {event} to {host!r} refused")


sys.addaudithook(_hook)
