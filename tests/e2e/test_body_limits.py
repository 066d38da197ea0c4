"""Bodies over `--payload-limit`, sent by real clients over loopback: each reads TEI's 413 JSON.

The body is many times the limit and larger than the socket buffers, so a server that answers
and closes while the client is still sending resets the connection (the bug these tests pin).
Fixed-length and chunked uploads; a raw socket, urllib (which sends `Connection: close`) and
httpx.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from support.loopback_server import Running
from tei_runtime.manifest import Task

LIMIT = 100_000
UPLOAD = 4_000_000  # 40x the limit, far past the kernel's socket buffers
CHUNK = 64 * 1024


def _json_body(size: int) -> bytes:
    head, tail = b'{"inputs": "', b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def _chunks(body: bytes) -> Iterator[bytes]:
    for i in range(0, len(body), CHUNK):
        yield body[i : i + CHUNK]


def _is_413_json(status: int, body: bytes) -> None:
    assert status == 413, body[:200]
    err = json.loads(body)
    assert err["error_type"] == "Validation"
    assert str(LIMIT) in err["error"]


@pytest.fixture
def limited(serve: Callable[..., Running]) -> Running:
    return serve(Task.EMBED, payload_limit=LIMIT)


def _raw_exchange(url: str, head: bytes, body_parts: Iterator[bytes]) -> tuple[int, bytes]:
    """Send `head` then every body part on a raw socket, then read the answer until the server
    closes (every request here asks for, or is answered with, `Connection: close`)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=30) as s:
        s.sendall(head)
        for part in body_parts:
            s.sendall(part)
        # No half-close: uvicorn drops a connection at EOF; the answer says `connection: close`.
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, payload = rest.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in headers.lower():
        payload = _unchunk(payload)
    return int(status_line.split()[1]), payload


def _unchunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2 :]


def test_raw_socket_fixed_length(limited: Running) -> None:
    body = _json_body(UPLOAD)
    head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
    _is_413_json(*_raw_exchange(limited.url, head, _chunks(body)))


def test_raw_socket_chunked(limited: Running) -> None:
    body = _json_body(UPLOAD)
    head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
    framed = (b"%x\r\n%s\r\n" % (len(c), c) for c in [*_chunks(body), b""])
    _is_413_json(*_raw_exchange(limited.url, head, framed))


def test_raw_socket_expect_continue_is_answered_without_the_body(limited: Running) -> None:
    # A client that waits for `100 Continue` is told 413 at once and never sends the body.
    head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % UPLOAD)
    _is_413_json(*_raw_exchange(limited.url, head, iter(())))


def _urllib_post(url: str, data: bytes | Iterator[bytes], path: str = "/embed",
                 headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, data=data, method="POST",
                                 headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return e.code, bytes(e.read())


def test_urllib_fixed_length(limited: Running) -> None:
    _is_413_json(*_urllib_post(limited.url, _json_body(UPLOAD)))


def test_urllib_chunked(limited: Running) -> None:
    # An iterable body without a length is sent chunked by urllib.
    _is_413_json(*_urllib_post(limited.url, _chunks(_json_body(UPLOAD))))


def test_httpx_fixed_length_and_chunked_keep_the_connection(limited: Running) -> None:
    c = limited.client
    headers = {"content-type": "application/json"}
    r = c.post("/embed", content=_json_body(UPLOAD), headers=headers)
    _is_413_json(r.status_code, r.content)
    r = c.post("/embed", content=_chunks(_json_body(UPLOAD)), headers=headers)
    _is_413_json(r.status_code, r.content)
    # The connection was drained, not broken: the next request on it is answered.
    assert c.post("/embed", json={"inputs": "hello"}).status_code == 200


def test_just_under_the_limit_is_served(limited: Running) -> None:
    status, body = _urllib_post(limited.url, _json_body(LIMIT))
    assert status == 200, body[:200]
    status, body = _urllib_post(limited.url, _chunks(_json_body(LIMIT)))
    assert status == 200, body[:200]


def test_other_early_answers_are_readable_too(serve: Callable[..., Running]) -> None:
    # Answers given before the body is read (401, 415, 404) reach a urllib client as well.
    r = serve(Task.EMBED, payload_limit=LIMIT, api_key="k")
    body = _json_body(UPLOAD)
    assert _urllib_post(r.url, body)[0] == 401
    auth = {"Authorization": "Bearer k"}
    status, answer = _urllib_post(r.url, body, headers={**auth, "Content-Type": "text/plain"})
    assert status == 415 and json.loads(answer)["error_type"] == "Validation"
    assert _urllib_post(r.url, body, path="/nowhere", headers=auth)[0] == 404


def test_body_cut_short_is_not_a_server_error(limited: Running) -> None:
    # A client that announces more than it sends and leaves: no answer is possible, and the
    # server must neither count a backend failure nor stop serving others.
    head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n")
    parts = urlsplit(limited.url)
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=30) as s:
        s.sendall(head + b'{"inputs": "ab')
        s.shutdown(socket.SHUT_WR)
        assert s.recv(65536) == b""  # closed without an answer: there is no one to read it
    metrics = httpx.get(limited.url + "/metrics").text
    assert "te_request_failure" not in metrics or 'err="inference"' not in metrics
    assert limited.client.post("/embed", json={"inputs": "hello"}).status_code == 200


@pytest.mark.parametrize("announced", [99_999_999_999, 3_000_000])
def test_a_body_that_never_comes_still_gets_its_413(limited: Running, announced: int) -> None:
    """A client that announces more than the limit and sends a few bytes is answered without
    the rest: at once where the announced body is more than the server would read and drop,
    after a few seconds of silence otherwise; the connection closes after the answer (before
    this, the server waited for the body as long as the client kept the socket open)."""
    head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % announced)
    _is_413_json(*_raw_exchange(limited.url, head, iter([b'{"inputs": "a'])))
