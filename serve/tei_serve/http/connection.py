"""uvicorn's httptools protocol, keeping an HTTP/1.0 connection that asks to be kept.

TEI's hyper keeps an HTTP/1.0 connection open when the request says `Connection: keep-alive`
and answers `connection: keep-alive`; uvicorn closes every HTTP/1.0 connection after one
answer. Clients that speak 1.0 (ApacheBench's `ab -k`, some proxies' health checks) then pay a
TCP handshake per request and report no keep-alive at all. This protocol keeps such a
connection where the answer has a `content-length` (an HTTP/1.0 client finds the end of a body
only by its length or by the close).

It leans on two attributes of uvicorn's request cycle (`keep_alive`, `send`): without them it
changes nothing, and tests/e2e/test_connections.py fails; uvicorn is pinned in constraints.txt.

It also bounds how long a client may hold a connection without doing its part, which uvicorn
does not (its only timer is the keep-alive between requests): a request must arrive whole,
headers and body, within `request_read_seconds` of the connection opening or of the request's
first byte (else 408 while its headers are coming in, a close otherwise), and an answer the client
stops reading is dropped once the socket has accepted nothing for `stalled_write_seconds`.
Without that, idle or trickling sockets (slowloris) hold file descriptors until the process
runs out of them, and each client that never reads holds its whole answer in memory. Past
`connection_cap` open connections a new one closes the longest idle ones (keep-alive between
requests is otherwise 620 s). At shutdown a request whose body stopped arriving is answered
503 after `shutdown_read_seconds` instead of holding the exit for the grace period; and when a
connection goes, every request of it still unanswered is marked gone, not only the newest.
"""

from __future__ import annotations

import asyncio
import functools
import resource
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tei_serve.errors import ShuttingDownError
from tei_serve.http.errors import ErrorResponse

_KEEP_ALIVE = (b"connection", b"keep-alive")
_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
    b"connection: close\r\n\r\n"
)
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
)
_STOPPED_BODY = msgspec.json.encode(
    ErrorResponse(error=ShuttingDownError().message, error_type=ShuttingDownError.error_type)
)
_SHUTTING_DOWN = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_STOPPED_BODY), _STOPPED_BODY)
)


@functools.cache
def _default_cap() -> int:
    """80% of the open-file limit: the rest for the model's files, the tokenizer pool, the
    metrics port and the connections being answered. Read at the first connection, after
    tei-serve has raised the limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, int(soft * 0.8)) if soft != resource.RLIM_INFINITY else 1 << 20


def asks_keep_alive(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether an HTTP/1.0 request's headers ask for a persistent connection."""
    for name, value in headers:
        if name.lower() == b"connection":
            tokens = {token.strip().lower() for token in value.split(b",")}
            if b"keep-alive" in tokens and b"close" not in tokens:
                return True
    return False


def has_length(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"content-length" for name, _ in headers)


class KeepAliveHttp10Protocol(HttpToolsProtocol):
    """`HttpToolsProtocol`, and an HTTP/1.0 request with `Connection: keep-alive` keeps its
    connection when its answer has a length (`connection: keep-alive` in that answer); with
    the read and write deadlines above."""

    request_read_seconds = 60.0
    """From the connection (or a request's first byte) to the end of the request's body."""
    stalled_write_seconds = 60.0
    """How long an answer may wait on a client that reads none of it."""
    max_head_bytes = 64 * 1024
    """A request's target and headers together; past it, 431 and the connection closes.
    uvicorn keeps every header byte it is sent (a client streaming headers that never end
    grew the server by a gigabyte in two seconds); hyper, under TEI, stops at ~400 KB."""
    connection_cap: int | None = None
    """Open connections past which a new one closes the longest idle (keep-alive ones between
    requests, and sockets that have sent nothing yet); None: 80% of the process's open-file
    limit. Without it one client holding thousands of idle keep-alive connections (620 s each)
    used every descriptor, and every other client was refused until it let go."""
    shutdown_read_seconds = 5.0
    """At shutdown, how long a request still being read may go without a byte before it is
    answered 503 and closed: a stalled upload held the exit for the whole grace period, then
    got uvicorn's bare 500."""
    max_pipelined = 1024
    """Requests parsed ahead of the one being answered (HTTP/1.1 pipelining); past it the
    connection closes. uvicorn resumed reading after each answer, so a client that sends
    without reading queued requests without end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._in_headers = False
        """A request has begun and its headers are not all in yet."""
        self._head_bytes = 0
        self._refused = False
        """The connection was answered 431 or cut: what else arrives is not parsed."""
        self._stopping = False
        """The server is shutting down while this connection's request is being read."""
        self._idle_since: float | None = None
        """When the connection last had no request in progress (None while it has one)."""
        self._unanswered: list[Any] = []
        """The request cycles whose answers are not complete, the running one and those
        pipelined behind it: uvicorn marks only the newest one parsed as disconnected when
        the connection goes, so the running one's answer would be written to a closed
        transport (an ERROR traceback in the log for every flood cut)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read_deadline()
        self._idle_since = self.loop.time()
        cap = self.connection_cap if self.connection_cap is not None else _default_cap()
        if len(self.connections) > cap:
            self._close_idle(len(self.connections) - cap + max(1, cap // 100))

    def _close_idle(self, count: int) -> None:
        """Close up to `count` idle connections, the longest idle first (never this one)."""
        idle: list[tuple[float, Any]] = []
        for connection in self.connections:
            since = getattr(connection, "_idle_since", None)
            if connection is not self and since is not None:
                idle.append((since, connection))
        idle.sort(key=lambda pair: pair[0])
        for _, connection in idle[:count]:
            transport = getattr(connection, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            if self._stopping and self._read_deadline is not None:
                self._arm_read_deadline(self.shutdown_read_seconds)  # still arriving
            super().data_received(data)

    def on_message_begin(self) -> None:
        self._idle_since = None
        super().on_message_begin()
        self._in_headers = True
        self._head_bytes = 0
        self._arm_read_deadline()

    def on_url(self, url: bytes) -> None:
        if self._counted(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._counted(len(name) + len(value)):
            super().on_header(name, value)

    def _counted(self, size: int) -> bool:
        """Adds `size` head bytes; False (and the 431 sent) once the head is too large."""
        if self._refused:
            return False
        self._head_bytes += size
        if self._head_bytes <= self.max_head_bytes:
            return True
        self._refuse(_HEADERS_TOO_LARGE)
        return False

    def _refuse(self, answer: bytes) -> None:
        self._refused = True
        self._cancel(self._read_deadline)
        self._read_deadline = None
        if not self.transport.is_closing():
            if answer:
                self.transport.write(answer)
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.pipeline and not self.transport.is_closing():
            # uvicorn resumed reading above; more requests are already waiting their turn.
            self.flow.pause_reading()
        elif not self.pipeline and not self._in_headers:
            self._idle_since = self.loop.time()

    def on_body(self, body: bytes) -> None:
        if not self._refused:  # the rest of a refused connection's chunk is parsed, unused
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._cancel(self._read_deadline)
        self._read_deadline = None
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel(self._read_deadline)
        self._cancel(self._write_deadline)
        self._read_deadline = self._write_deadline = None
        for cycle in self._unanswered:
            if not getattr(cycle, "response_complete", True):
                cycle.disconnected = True
                if (event := getattr(cycle, "message_event", None)) is not None:
                    event.set()  # a handler reading its body sees the client gone
        self._unanswered.clear()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(
                self.stalled_write_seconds, self._write_stalled
            )

    def resume_writing(self) -> None:
        self._cancel(self._write_deadline)
        self._write_deadline = None
        super().resume_writing()

    def shutdown(self) -> None:
        if self._write_deadline is not None and not self.transport.is_closing():
            # The client reads none of its answer: a graceful close would wait for that
            # buffer to drain (the whole grace period, holding the shutdown). Its work is
            # done or cannot be delivered; drop it now.
            self.transport.abort()
            return
        if self._read_deadline is not None and not self.transport.is_closing():
            # A request is being read: it may finish in the grace period if its bytes keep
            # coming, not if they stopped.
            self._stopping = True
            self._arm_read_deadline(self.shutdown_read_seconds)
        super().shutdown()

    def _arm_read_deadline(self, seconds: float | None = None) -> None:
        self._cancel(self._read_deadline)
        self._read_deadline = self.loop.call_later(
            self.request_read_seconds if seconds is None else seconds, self._read_late
        )

    def _read_late(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        if self._stopping:
            self.transport.write(_SHUTTING_DOWN)  # the server will not wait for the rest
        elif self._in_headers:
            self.transport.write(_REQUEST_TIMEOUT)
        # A connection that never sent a byte is closed as an idle one is (a 408 there could
        # be read as the answer to a request sent meanwhile); mid-body, the handler sees the
        # client as gone (its body read ends, its work is dropped).
        self.transport.close()

    def _write_stalled(self) -> None:
        self._write_deadline = None
        if not self.transport.is_closing():
            self.transport.abort()  # drops the buffered answer; close() would wait to send it

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._refused:
            return
        if len(self.pipeline) >= self.max_pipelined:
            self._refuse(b"")  # the requests answered so far stay answered; the rest is cut
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and hasattr(cycle, "disconnected"):
            self._unanswered = [c for c in self._unanswered if not c.response_complete]
            self._unanswered.append(cycle)
        # The cycle is this request's only if the parent made one (an upgrade returns early);
        # a uvicorn whose cycle lacks what this relies on keeps its own HTTP/1.0 behaviour.
        if (
            cycle is None
            or getattr(cycle, "scope", None) is not self.scope
            or not hasattr(cycle, "keep_alive")
            or not callable(getattr(cycle, "send", None))
            or self.scope.get("http_version") != "1.0"
            or not asks_keep_alive(self.headers)
        ):
            return
        send = cycle.send

        async def send_keeping(message: Any) -> None:
            # Runs before uvicorn writes the status line: the answer's own headers decide.
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                # An answer that names its connection (`close` after an unread body) keeps it.
                if has_length(headers) and not any(k.lower() == b"connection" for k, _ in headers):
                    cycle.keep_alive = True
                    message = {**message, "headers": [*headers, _KEEP_ALIVE]}
            await send(message)

        # The ASGI task is scheduled, not started: it reads `cycle.send` when it runs.
        cycle.send = send_keeping  # type: ignore[method-assign]
