"""Paths matched as TEI's axum router matches them: exactly.

Litestar finds `/embed` for `/embed/` and `//embed` too (it drops a trailing slash and empty
segments before routing); axum has no such rewrite, so TEI answers those 404. A client written
against us would otherwise work here and break on TEI. The one exception is `/docs/`, where
TEI's Swagger UI page lives (its `/docs` redirects there); and `/v1/models/<id>` and
`/models/<id>` (ours, not TEI's) take any id, an absolute path's leading slash included
(`/v1/models//data/model`), percent-escaped or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from litestar.enums import ScopeType

from tei_serve.http.empty_answer import send_empty

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Receive, Scope, Send

SLASHED_PAGES = frozenset({"/docs/"})
MODEL_BY_ID = ("/v1/models/", "/models/")


def routable(path: str, raw: str | None = None) -> bool:
    """Whether axum could route `path`: no empty segment, no trailing slash (but `/`), and
    no percent-escape in the `raw` path as sent (axum matches the undecoded path, so
    `/%65mbed` is not `/embed` there)."""
    if any(path.startswith(p) and len(path) > len(p) for p in MODEL_BY_ID):
        return True
    if raw is not None and raw != path:
        return False
    if path in SLASHED_PAGES or path == "/":
        return True
    return "//" not in path and not path.endswith("/")


def raw_path(scope: Scope) -> str | None:
    """The path as the client sent it (ASGI's `raw_path`, without the query), if known."""
    raw = scope.get("raw_path")
    if not raw:
        return None
    return bytes(raw).split(b"?", 1)[0].decode("latin-1")


class ExactPaths:
    """ASGI wrapper answering a bare 404 (status alone, as axum's router) for a path that only
    routes after Litestar's normalisation."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or routable(scope["path"], raw_path(scope)):
            await self.app(scope, receive, send)
            return
        await send_empty(send, 404)
