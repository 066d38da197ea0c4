"""The Litestar app over one `Serving`: routes, CORS, the error handler, the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.cors import CORSConfig

from tei_serve.http.errors import make_exception_handler
from tei_serve.http.routes import build_routes
from tei_serve.metrics_port import MetricsPort
from tei_serve.serving import Serving


def build_app(serving: Serving) -> Litestar:
    s = serving.settings

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        metrics_port = MetricsPort(serving.metrics.render, s.hostname, s.prometheus_port)
        await metrics_port.start()
        serving.start()
        try:
            yield
        finally:
            # The ASGI server has answered every accepted request by now; finish the queue.
            await serving.stop()
            await metrics_port.close()

    origins = list(s.cors_allow_origin) if s.cors_allow_origin else ["*"]
    cors = CORSConfig(
        allow_origins=["*"] if "*" in origins else origins,
        allow_methods=["GET", "POST"],
        allow_headers=["content-type"],
    )
    return Litestar(
        route_handlers=build_routes(serving),
        exception_handlers={Exception: make_exception_handler(serving.metrics)},  # type: ignore[dict-item]
        cors_config=cors,
        request_max_body_size=s.payload_limit,
        openapi_config=None,
        lifespan=[lifespan],
        logging_config=None,
    )
