"""`ApiKey`: exactly `Bearer <key>`, compared with `hmac.compare_digest`, never printed."""

from __future__ import annotations

import hmac

import pytest

from tei_serve import auth
from tei_serve.auth import ApiKey


def test_accepts_exactly_the_bearer_value() -> None:
    key = ApiKey("s3cret")
    assert key.accepts(b"Bearer s3cret")
    for wrong in (b"", b"s3cret", b"Bearer s3cre", b"Bearer s3cret ", b"bearer s3cret",
                  b"Bearer s3cretX", b"Bearer S3CRET"):
        assert not key.accepts(wrong), wrong


def test_non_ascii_key_is_compared_as_utf8_bytes() -> None:
    assert ApiKey("clé").accepts("Bearer clé".encode())


def test_comparison_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert not ApiKey("k").accepts(b"Bearer x")
    assert seen == [(b"Bearer x", b"Bearer k")]


def test_repr_hides_the_key() -> None:
    assert "s3cret" not in repr(ApiKey("s3cret"))
