"""`inflate`: gzip and deflate request bodies decoded, never past the payload limit."""

from __future__ import annotations

import gzip
import zlib

import pytest

from tei_serve.errors import BodyError
from tei_serve.http.body import inflate

BODY = b'{"inputs": ["hello world"]}'


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "GZIP "])
def test_gzip(encoding: str) -> None:
    assert inflate(gzip.compress(BODY), encoding, 1000) == BODY


def test_deflate_reads_zlib_data_and_gzip_sent_under_that_name() -> None:
    assert inflate(zlib.compress(BODY), "deflate", 1000) == BODY
    assert inflate(gzip.compress(BODY), "deflate", 1000) == BODY


def test_no_encoding_or_identity_is_the_body_itself() -> None:
    assert inflate(b"not compressed", "", 10) == b"not compressed"
    assert inflate(b"not compressed", "identity", 10) == b"not compressed"


def test_several_gzip_members_are_one_body() -> None:
    assert inflate(gzip.compress(BODY[:10]) + gzip.compress(BODY[10:]), "gzip", 1000) == BODY


@pytest.mark.parametrize(("body", "limit"), [
    (gzip.compress(b"[" * 10_000_000), 1000),  # ~10 kB that would inflate to 10 MB
    (gzip.compress(BODY), len(BODY) - 1),
])  # fmt: skip
def test_never_inflated_past_the_limit(body: bytes, limit: int) -> None:
    with pytest.raises(BodyError) as info:
        inflate(body, "gzip", limit)
    assert info.value.http_status == 413


def test_exactly_the_limit_fits_across_members() -> None:
    two = gzip.compress(BODY[:10]) + gzip.compress(BODY[10:])
    assert inflate(two, "gzip", len(BODY)) == BODY
    with pytest.raises(BodyError):
        inflate(two, "gzip", len(BODY) - 1)


@pytest.mark.parametrize(("body", "text"), [
    (b"plain text, not gzip", "not valid gzip data"),
    (gzip.compress(BODY)[:-12], "ends before its compressed data does"),
])  # fmt: skip
def test_broken_data_is_400(body: bytes, text: str) -> None:
    with pytest.raises(BodyError, match=text) as info:
        inflate(body, "gzip", 1000)
    assert info.value.http_status == 400


def test_other_encodings_are_415() -> None:
    with pytest.raises(BodyError, match="Unsupported Content-Encoding 'br'") as info:
        inflate(b"...", "br", 1000)
    assert info.value.http_status == 415
