"""The Litestar app over one `Serving`: routes, CORS, the error handler, the lifespan.

The app is wrapped in `DrainUnread`, so every answer, whichever route or error gives it,
comes after the request body has been read (see `tei_serve.http.body`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.cors import CORSConfig

from tei_serve.http.body import DrainUnread
from tei_serve.http.errors import make_exception_handler
from tei_serve.http.routes import build_routes
from tei_serve.metrics_port import MetricsPort
from tei_serve.serving import Serving


def build_app(serving: Serving) -> DrainUnread:
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
    app = Litestar(
        route_handlers=build_routes(serving),
        exception_handlers={Exception: make_exception_handler(serving.metrics)},  # type: ignore[dict-item]
        cors_config=cors,
        # Bodies are read by `read_body` alone, which enforces --payload-limit.
        request_max_body_size=None,
        openapi_config=None,
        lifespan=[lifespan],
        logging_config=None,
    )
    return DrainUnread(app)
