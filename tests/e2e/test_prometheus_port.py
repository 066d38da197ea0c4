"""--prometheus-port in HTTP mode: the te_* metrics on their own port, /metrics kept."""

from __future__ import annotations

from collections.abc import Callable

import httpx

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
