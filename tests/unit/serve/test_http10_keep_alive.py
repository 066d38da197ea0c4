"""Which HTTP/1.0 requests ask to keep their connection (tei_serve.http.connection)."""

from __future__ import annotations

import pytest

from tei_serve.http.connection import asks_keep_alive, has_length


@pytest.mark.parametrize(
    ("headers", "keeps"),
    [
        ([(b"connection", b"keep-alive")], True),
        ([(b"Connection", b"Keep-Alive")], True),
        ([(b"connection", b"TE, keep-alive")], True),
        ([(b"connection", b"keep-alive, close")], False),
        ([(b"connection", b"close")], False),
        ([(b"keep-alive", b"timeout=5")], False),
        ([], False),
    ],
)
def test_asks_keep_alive(headers: list[tuple[bytes, bytes]], keeps: bool) -> None:
    assert asks_keep_alive(headers) is keeps


def test_has_length() -> None:
    assert has_length([(b"content-type", b"text/plain"), (b"Content-Length", b"0")])
    assert not has_length([(b"transfer-encoding", b"chunked")])
