"""HTTP connections as TEI keeps them: an idle keep-alive connection is not closed after a
few seconds (TEI's hyper never closes one), so a pooled client's next request is answered; an
HTTP/1.0 request with `Connection: keep-alive` keeps its connection (`ab -k`), one without it
is closed after its answer."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from support.loopback_server import Running
from tei_runtime.manifest import Task
from tei_serve.http.connection import KeepAliveHttp10Protocol


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


def _deadlines(monkeypatch: pytest.MonkeyPatch, read: float, write: float) -> None:
    monkeypatch.setattr(KeepAliveHttp10Protocol, "request_read_seconds", read)
    monkeypatch.setattr(KeepAliveHttp10Protocol, "stalled_write_seconds", write)


def test_slow_and_silent_connections_are_closed(
    serve: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request must arrive whole within the read deadline: a socket that never sends is
    closed (no answer: it asked nothing), one trickling its headers gets 408, one trickling
    its body is closed; a request sent in time on the same kind of socket is answered, and
    so is the next one after an idle keep-alive pause longer than the deadline."""
    _deadlines(monkeypatch, read=1.0, write=60.0)
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    address = (url.hostname, url.port)
    with socket.create_connection(address, timeout=10) as silent, \
            socket.create_connection(address, timeout=10) as headers, \
            socket.create_connection(address, timeout=10) as body, \
            socket.create_connection(address, timeout=10) as prompt:  # fmt: skip
        headers.sendall(_REQUEST[:20])
        body.sendall(_REQUEST[:-5])
        prompt.sendall(_REQUEST)
        assert _answer(prompt).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # idle between requests: the keep-alive timer's, not this deadline
        prompt.sendall(_REQUEST)
        assert _answer(prompt).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert silent.recv(100) == b""
        assert headers.recv(100).startswith(b"HTTP/1.1 408 Request Timeout")
        assert _closed(headers)
        assert body.recv(100) == b""
        assert time.monotonic() - started < 5
    # nothing of the abandoned body's request is left holding a permit
    assert r.client.post("/embed", json={"inputs": "hello"}).status_code == 200


def test_an_answer_nobody_reads_is_dropped(
    serve: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that stops reading: once its socket accepts nothing for the write deadline,
    the connection is cut and its buffered answer freed."""
    _deadlines(monkeypatch, read=60.0, write=1.0)
    stalled: list[bool] = []
    real = KeepAliveHttp10Protocol._write_stalled

    def recording(self: KeepAliveHttp10Protocol) -> None:
        real(self)
        stalled.append(self.transport.is_closing())

    monkeypatch.setattr(KeepAliveHttp10Protocol, "_write_stalled", recording)
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    texts = ["a " * 3500] * 32  # some MB of tokens and offsets
    big = _request(body=json.dumps({"inputs": texts}).encode()).replace(b"/embed", b"/tokenize")
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(big * 4)  # answers pile up unread, past the socket buffers
        deadline = time.monotonic() + 30
        while not stalled and time.monotonic() < deadline:
            time.sleep(0.1)
        # Cut (what the kernel already holds still trickles out; the process holds none).
        assert stalled == [True], "the stalled answer was never cut"
    assert r.client.post("/embed", json={"inputs": "hello"}).status_code == 200


def test_headers_that_never_end_get_431_and_the_connection_closes(
    serve: Callable[..., Running],
) -> None:
    """A client streaming header lines without end: uvicorn kept every byte (a gigabyte in
    two seconds). Past 64 KiB of request line and headers: 431, closed, nothing more read."""
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    limit = KeepAliveHttp10Protocol.max_head_bytes
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Pad: " + b"a" * 8000 + b"\r\n"
        try:
            for _ in range(2 * limit // len(line) + 2):
                sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed under us: what is asserted next
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    # headers just under the limit are served as ever
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (limit - 200)
                     + b"\r\n\r\n")  # fmt: skip
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_pipelined_requests_past_the_limit_close_the_connection(
    serve: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that pipelines without reading: reading stays paused while requests wait
    their turn (uvicorn resumed it after every answer, queueing without end), and one chunk
    holding more than `max_pipelined` requests closes the connection (what was not answered
    by then is not), and the server serves on."""
    monkeypatch.setattr(KeepAliveHttp10Protocol, "max_pipelined", 8)
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        answered = received.count(b"HTTP/1.1 200")  # the loop ended: the server closed
        assert answered <= 8, answered
    assert r.client.get("/health").status_code == 200


def test_an_answer_finished_after_its_pipelined_connection_was_cut_is_dropped_quietly(
    serve: Callable[..., Running], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The request being answered when a flood cuts its connection is not the newest one
    parsed, which is all uvicorn marks as gone: its answer was written to the closed
    transport, and every flood logged an ERROR traceback."""
    monkeypatch.setattr(KeepAliveHttp10Protocol, "max_pipelined", 8)
    r = serve(Task.EMBED)
    model = r.serving.model
    model.gate.clear()
    url = urlsplit(r.url)
    body = b'{"inputs": "held"}'
    request = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    with caplog.at_level(logging.INFO), socket.create_connection(
        (url.hostname, url.port), timeout=30
    ) as sock:
        sock.sendall(request)
        assert model.running.wait(10)  # the first request is in the model
        sock.sendall(request * 200)
        with contextlib.suppress(ConnectionResetError):  # an RST: the flood lay unread
            assert sock.recv(65536) == b""  # cut, unanswered
        model.gate.set()
        assert r.client.post("/embed", json={"inputs": "after"}).status_code == 200
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert errors == [], [rec.getMessage() for rec in errors]


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.3)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_past_the_connection_cap_a_new_connection_closes_the_longest_idle(
    serve: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client holding thousands of idle keep-alive connections used every descriptor and
    locked every other client out; past the cap the longest idle go, never a busy one."""
    monkeypatch.setattr(KeepAliveHttp10Protocol, "connection_cap", 10)
    r = serve(Task.EMBED)
    url = urlsplit(r.url)
    address = (url.hostname, url.port)
    busy = socket.create_connection(address, timeout=30)  # the oldest, mid-request
    busy.sendall(b"GET /health HTTP/1.1\r\nHo")
    idle: list[socket.socket] = []
    try:
        for _ in range(14):
            sock = socket.create_connection(address, timeout=30)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            idle.append(sock)
            time.sleep(0.02)  # a distinct idle time each
        closed = [i for i, sock in enumerate(idle) if _closed_by_server(sock)]
        assert closed == list(range(len(closed))) and closed, closed  # the longest idle
        assert len(idle) - len(closed) + 1 <= 10
        busy.sendall(b"st: x\r\n\r\n")
        assert busy.recv(65536).startswith(b"HTTP/1.1 200")  # never closed
        assert r.client.get("/health").status_code == 200
    finally:
        for sock in (busy, *idle):
            sock.close()
