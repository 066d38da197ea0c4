"""--prometheus-port: the metrics listener on the event loop, over a real loopback socket."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tei_serve.metrics_port import MetricsPort, MetricsPortError


def test_serves_render_on_any_get_and_refuses_other_methods() -> None:
    renders = iter([b"te_request_count 1\n", b"te_request_count 2\n"])

    async def main() -> None:
        port = MetricsPort(lambda: next(renders), "127.0.0.1", 0)
        await port.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port.port}") as client:
                first = await client.get("/metrics")
                second = await client.get("/")
                post = await client.post("/metrics", content=b"x")
        finally:
            await port.close()
        assert first.status_code == 200 and first.content == b"te_request_count 1\n"
        assert first.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert second.content == b"te_request_count 2\n"
        assert post.status_code == 405

    asyncio.run(main())


def test_a_taken_port_is_an_error_naming_the_way_out() -> None:
    async def main() -> None:
        first = MetricsPort(lambda: b"", "127.0.0.1", 0)
        await first.start()
        try:
            second = MetricsPort(lambda: b"", "127.0.0.1", first.port)
            with pytest.raises(MetricsPortError, match="--prometheus-port 0"):
                await second.start()
        finally:
            await first.close()

    asyncio.run(main())


def test_a_connection_that_sends_nothing_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    from tei_serve import metrics_port

    monkeypatch.setattr(metrics_port, "HEAD_TIMEOUT_SECONDS", 0.2)

    async def main() -> None:
        port = MetricsPort(lambda: b"", "127.0.0.1", 0)
        await port.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
            # The server closes it: the read ends with EOF well before the test's own limit.
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        finally:
            await port.close()

    asyncio.run(main())
