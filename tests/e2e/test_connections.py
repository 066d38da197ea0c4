"""HTTP connections as TEI keeps them: an idle keep-alive connection is not closed after a
few seconds (TEI's hyper never closes one), so a pooled client's next request is answered; an
HTTP/1.0 request with `Connection: keep-alive` keeps its connection (`ab -k`), one without it
is closed after its answer."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from support.loopback_server import Running
from tei_runtime.manifest import Task


def _request(version: bytes = b"1.1", headers: bytes = b"", body: bytes = b'{"inputs": "hello"}'
             ) -> bytes:  # fmt: skip
    return (
        b"POST /embed HTTP/" + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
        + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body
    )


_REQUEST = _request()


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head


def test_an_idle_keep_alive_connection_still_answers(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(_REQUEST)
        assert _answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6.5)  # past uvicorn's 5 s default
        sock.sendall(_REQUEST)
        assert _answer(sock).startswith(b"HTTP/1.1 200")


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF within the socket's timeout)."""
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_an_http10_keep_alive_connection_stays_open(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    asking = _request(b"1.0", b"Connection: Keep-Alive\r\n")
    refused = _request(b"1.0", b"Connection: keep-alive\r\n", body=b'{"inputs": ""}')
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        for request, status in ((asking, b"200"), (refused, b"400"), (asking, b"200")):
            sock.sendall(request)
            head = _answer(sock)
            assert head.startswith(b"HTTP/1.1 " + status), head
            assert b"\r\nconnection: keep-alive" in head.lower()
        sock.settimeout(1.0)
        assert not _closed(sock)


def test_an_http10_connection_without_keep_alive_is_closed(
    serve: Callable[..., Running],
) -> None:
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(_request(b"1.0"))
        head = _answer(sock)
        assert head.startswith(b"HTTP/1.1 200")
        assert b"keep-alive" not in head.lower()
        assert _closed(sock)


def test_an_http10_answer_that_must_close_says_so_once(serve: Callable[..., Running]) -> None:
    """An HTTP/1.0 keep-alive request whose body is not read (it waits for `100 Continue`,
    over the limit) is answered `connection: close` alone, and closed."""
    r = serve(Task.EMBED, payload_limit=1000)
    url = urlsplit(r.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /embed HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: keep-alive\r\nExpect: 100-continue\r\n"
                     b"Content-Length: 10000000\r\n\r\n")  # fmt: skip
        head = _answer(sock).lower()
        assert head.startswith(b"http/1.1 413")
        assert [line for line in head.split(b"\r\n") if line.startswith(b"connection:")] == [
            b"connection: close"]
        assert _closed(sock)
