"""CORS as TEI's tower-http `CorsLayer` answers it, outside every route and the API key.

Every OPTIONS request is a preflight, answered here with 200 and no body: the allowed methods
and headers, and the origin where it is allowed (tower-http checks neither the method nor the
headers asked for; the browser does). The headers allowed are the ones the preflight asks for
(openai's JavaScript SDK sends its own `x-stainless-*` headers beside the API key), else the
configured list. Every other answer gets the origin header where the
origin is allowed and `vary` on the three request headers CORS reads. Any origin allowed means
`access-control-allow-origin: *` on every answer, as TEI's default; a list means the request's
own origin where it is in the list, and nothing otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from litestar.enums import ScopeType

from tei_serve.http.empty_answer import send_empty

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

METHODS = b"GET,POST"
VARY = b"origin, access-control-request-method, access-control-request-headers"


# What a header-name list may hold (RFC 9110 tokens, commas, spaces): anything else asked for
# is not echoed back, so no byte a client sends can split or forge a response header.
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_HEADER_LIST = re.compile(_TOKEN + rb"(?:[ \t]*,[ \t]*" + _TOKEN + rb")*")


def _mirrored(asked: bytes | None) -> bytes | None:
    if asked is None:
        return None
    asked = asked.strip()
    return asked.lower() if _HEADER_LIST.fullmatch(asked) else None


class Cors:
    """ASGI wrapper answering preflights and labelling answers (see the module doc).
    `origins`: the allowed origins, `*` among them meaning any; `headers`: the request
    headers a browser app may send."""

    def __init__(self, app: ASGIApp, origins: Sequence[str], headers: Sequence[str]) -> None:
        self.app = app
        self.any_origin = "*" in origins
        self.origins = frozenset(o.encode("latin-1") for o in origins)
        self.allow_headers = ",".join(headers).encode("latin-1")

    def allowed_origin(self, origin: bytes | None) -> bytes | None:
        """The `access-control-allow-origin` value for a request's `origin`, if any."""
        if self.any_origin:
            return b"*"
        return origin if origin is not None and origin in self.origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        origin = next((v for k, v in scope["headers"] if k.lower() == b"origin"), None)
        allowed = self.allowed_origin(origin)
        labels = [(b"vary", VARY)]
        if allowed is not None:
            labels.append((b"access-control-allow-origin", allowed))
        if scope["method"] == "OPTIONS":
            asked = next(
                (v for k, v in scope["headers"] if k.lower() == b"access-control-request-headers"),
                None,
            )
            await send_empty(send, 200, [
                *labels,
                (b"access-control-allow-methods", METHODS),
                (b"access-control-allow-headers", _mirrored(asked) or self.allow_headers),
            ])  # fmt: skip
            return

        async def labelling_send(message: Message) -> None:
            if message["type"] == "http.response.start":  # no route sets CORS headers itself
                message = {**message, "headers": [*message.get("headers", []), *labels]}
            await send(message)

        await self.app(scope, receive, labelling_send)
