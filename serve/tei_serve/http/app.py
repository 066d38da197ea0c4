"""The Litestar app over the served `Models`: routes, CORS, the error handler, the lifespan.

The app is wrapped in `ExactPaths` (axum's exact path matching), that in `Cors` (TEI's CORS
layer, outside routes and key) and that in `DrainUnread`, so every answer, whichever layer
gives it, comes after the request body has been read (see `tei_serve.http.body`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar

from tei_serve.auth import ApiKey
from tei_serve.http.body import DrainUnread
from tei_serve.http.cors import Cors
from tei_serve.http.errors import KeyedPaths, make_exception_handler
from tei_serve.http.exact_paths import ExactPaths
from tei_serve.http.routes import build_routes
from tei_serve.metrics_port import MetricsPort, MetricsPortError
from tei_serve.models import Models
from tei_serve.serving import Serving

log = logging.getLogger("tei_serve")


def build_app(front: Serving | Models) -> DrainUnread:
    models = Models.of(front)
    s = models.settings

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        metrics_port = MetricsPort(models.families.render, s.hostname, s.prometheus_port)
        if s.prometheus_port == s.port and s.port != 0:
            # `--port 9000` with the default --prometheus-port: the API port answers /metrics
            # itself, and binding it here first would keep the API from starting at all.
            log.info("Prometheus metrics on /metrics of port %d (--prometheus-port is the "
                     "same port)", s.port)  # fmt: skip
        else:
            try:
                await metrics_port.start()
            except MetricsPortError as e:
                # /metrics on the HTTP port still serves them, and TEI's HTTP server binds no
                # such port: two servers on one host (each its own --port) must both start.
                log.warning("%s; the metrics stay on /metrics of port %d", e, s.port)
        models.start()
        try:
            yield
        finally:
            # The ASGI server has answered every accepted request by now; finish the queues.
            await models.stop()
            await metrics_port.close()

    handlers = build_routes(models)
    keyed = None
    if s.api_key is not None:
        # TEI checks the key before the method: GET /embed without it is 401, not 405.
        guarded = frozenset(path for h in handlers if h.guards for path in h.paths)
        keyed = KeyedPaths(ApiKey(s.api_key), guarded)
    app = Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: make_exception_handler(models.families, keyed)},  # type: ignore[dict-item]
        # Bodies are read by `read_body` alone, which enforces --payload-limit.
        request_max_body_size=None,
        openapi_config=None,
        lifespan=[lifespan],
        logging_config=None,
    )
    origins = list(s.cors_allow_origin) if s.cors_allow_origin else ["*"]
    # TEI allows content-type alone; a browser app also needs to send its --api-key and,
    # with several models, the `x-model` header that picks one.
    cors = Cors(ExactPaths(app), origins, headers=["content-type", "authorization", "x-model"])
    return DrainUnread(cors)
