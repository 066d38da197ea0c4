"""`--prometheus-port`: the te_* metrics on a port of their own, in HTTP and gRPC mode alike.

TEI's gRPC build serves its Prometheus exporter on this port (default 9000); a scraper asks
`GET /metrics` (any path answers, as TEI's exporter does). The listener is a few lines of
asyncio on the server's own event loop: one request per connection, no keep-alive, the body
rendered by `Metrics.render`, so the numbers are exactly those of `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tei_serve.dual_stack import dual_stack_listener
from tei_serve.metrics import CONTENT_TYPE

log = logging.getLogger("tei_serve")

_MAX_HEAD = 16 * 1024
"""A scrape request is one short line and a few headers; anything longer is not one."""

HEAD_TIMEOUT_SECONDS = 10.0
"""A connection that has not sent its request head by then is closed: one that sends nothing
would otherwise hold its socket (and the open-file budget) for as long as it likes."""


class MetricsPortError(OSError):
    """The Prometheus port could not be bound."""


class MetricsPort:
    """Serve `render()` over plain HTTP/1.1 on `host:port` until `close()`."""

    def __init__(self, render: Callable[[], bytes], host: str, port: int) -> None:
        self._render = render
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (the free one picked when asked for port 0)."""
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        try:
            listener = dual_stack_listener(self._host, self._port, backlog=100)
            if listener is None:
                self._server = await asyncio.start_server(self._answer, self._host, self._port)
            else:
                self._server = await asyncio.start_server(self._answer, sock=listener)
        except OSError as e:
            raise MetricsPortError(
                f"cannot serve Prometheus metrics on {self._host}:{self._port}: {e.strerror} "
                "(--prometheus-port 0 picks a free port)"
            ) from e
        log.info("Prometheus metrics on %s:%d", self._host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                TimeoutError):  # fmt: skip
            writer.close()
            return
        method = head.split(b" ", 1)[0]
        if len(head) > _MAX_HEAD or method not in (b"GET", b"HEAD"):
            status, body = b"405 Method Not Allowed", b""
        else:
            status, body = b"200 OK", self._render()
        writer.write(
            b"HTTP/1.1 " + status + b"\r\n"
            b"Content-Type: " + CONTENT_TYPE.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n"
            b"Connection: close\r\n\r\n" + (body if method == b"GET" else b"")
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
