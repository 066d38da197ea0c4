"""Spans as TEI writes them (Rust's Duration format) and a stop that a dead collector cannot
hold past the orchestrator's grace."""

from __future__ import annotations

import logging
import socket

import pytest

from tei_serve import tracing
from tei_serve.tracing import Tracing, rust_duration


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0ns"), (40, "40ns"), (850_000, "850µs"), (1_500, "1.5µs"),
        (1_203_000, "1.203ms"), (12_030_000, "12.03ms"), (1_000_000, "1ms"),
        (1_500_000_000, "1.5s"), (2_000_000_001, "2.000000001s"), (61_000_000_000, "61s"),
    ],
)  # fmt: skip
def test_durations_read_as_rusts_debug_format(ns: int, text: str) -> None:
    assert rust_duration(ns) == text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_stop_with_an_unreachable_collector_drops_the_spans_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The exporter retries an unreachable collector with backoff for ~10 s, and the SDK's
    shutdown waits for it; the stop must not."""
    monkeypatch.setattr(tracing, "FLUSH_SECONDS", 0.3)
    t = Tracing(f"http://127.0.0.1:{_closed_port()}", "flush-test")
    t.record("embed", "/embed", {}, None, 0.001)
    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        t.shutdown()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "tei_serve"]
    assert "did not take the last spans" in warning and "127.0.0.1" in warning
