"""uvicorn's httptools protocol, keeping an HTTP/1.0 connection that asks to be kept.

TEI's hyper keeps an HTTP/1.0 connection open when the request says `Connection: keep-alive`
and answers `connection: keep-alive`; uvicorn closes every HTTP/1.0 connection after one
answer. Clients that speak 1.0 (ApacheBench's `ab -k`, some proxies' health checks) then pay a
TCP handshake per request and report no keep-alive at all. This protocol keeps such a
connection where the answer has a `content-length` (an HTTP/1.0 client finds the end of a body
only by its length or by the close).

It leans on two attributes of uvicorn's request cycle (`keep_alive`, `send`): without them it
changes nothing, and tests/e2e/test_connections.py fails; uvicorn is pinned in constraints.txt.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_KEEP_ALIVE = (b"connection", b"keep-alive")


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
    connection when its answer has a length (`connection: keep-alive` in that answer)."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
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
