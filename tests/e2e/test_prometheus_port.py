"""--prometheus-port in HTTP mode: the te_* metrics on their own port, /metrics kept."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import httpx
import pytest

from support.loopback_server import Running
from support.processes import free_port
from tei_runtime.manifest import Task


def test_metrics_on_the_prometheus_port_match_slash_metrics(
    serve: Callable[..., Running],
) -> None:
    port = free_port()
    r = serve(Task.EMBED, prometheus_port=port)
    assert r.client.post("/embed", json={"inputs": "hello world"}).status_code == 200
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert scraped.status_code == 200
    assert 'te_request_success{method="single"} 1' in scraped.text
    assert "te_embed_duration_count 1.0" in scraped.text
    assert scraped.text == r.client.get("/metrics").text


def test_a_taken_prometheus_port_is_a_warning_in_http_mode(
    serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    """TEI's HTTP server binds no Prometheus port, so two of them (each its own --port) start
    on one host; here the second keeps its metrics on /metrics and says so."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        taken = holder.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="tei_serve"):
            r = serve(Task.EMBED, prometheus_port=taken)
        assert r.client.post("/embed", json={"inputs": "hello"}).status_code == 200
        assert 'te_request_success{method="single"} 1' in r.client.get("/metrics").text
        assert any(f":{taken}" in m and "/metrics" in m for m in caplog.messages)
    finally:
        holder.close()


def test_the_api_port_as_prometheus_port_starts_with_metrics_on_it(
    serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    """`--port 9000` leaves --prometheus-port at its default, 9000: the API must still get its
    port (the metrics listener, started first, used to take it)."""
    port = free_port()
    with caplog.at_level(logging.INFO, logger="tei_serve"):
        r = serve(Task.EMBED, port=port, prometheus_port=port)
    assert r.url.endswith(f":{port}")
    assert r.client.post("/embed", json={"inputs": "hello"}).status_code == 200
    assert 'te_request_success{method="single"} 1' in r.client.get("/metrics").text
    assert any(f"/metrics of port {port}" in m for m in caplog.messages)
