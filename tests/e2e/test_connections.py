"""HTTP connections as TEI keeps them: an idle keep-alive connection is not closed after a
few seconds (TEI's hyper never closes one), so a pooled client's next request is answered."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from support.loopback_server import Running
from tei_runtime.manifest import Task

_REQUEST = (
    b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 19\r\n\r\n" + b'{"inputs": "hello"}'
)


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
