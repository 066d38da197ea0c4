"""IPv6's wildcard bound the way TEI binds it: one socket that takes IPv4 clients too.

TEI (tokio) binds `[::]` with the system's default, which on Linux (bindv6only=0) accepts
IPv4 as mapped addresses, so `--hostname ::` serves 127.0.0.1 as well. asyncio sets
IPV6_V6ONLY on every IPv6 socket it binds, so the same flag through uvicorn or
`asyncio.start_server` would refuse IPv4 clients. Every other hostname binds as asyncio
binds it, which is what TEI does for it too.
"""

from __future__ import annotations

import ipaddress
import socket


def is_ipv6_wildcard(host: str) -> bool:
    try:
        return ipaddress.IPv6Address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def dual_stack_listener(host: str, port: int, *, backlog: int) -> socket.socket | None:
    """A listening socket on `[::]:port` that IPv4 clients reach too; None for any other
    host, or where the system has no dual-stack sockets (the caller binds as usual).
    Raises OSError where the port cannot be bound."""
    if not is_ipv6_wildcard(host) or not socket.has_dualstack_ipv6():
        return None
    listener = socket.create_server(
        ("::", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True
    )
    listener.setblocking(False)
    return listener
