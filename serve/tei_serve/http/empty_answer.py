"""An answer with a status and headers but no body, sent straight to the ASGI server by the
wrappers that answer before the app does (CORS preflights, paths axum would not route)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Send


async def send_empty(send: Send, status: int, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    start: HTTPResponseStartEvent = {
        "type": "http.response.start", "status": status,
        "headers": [*headers, (b"content-length", b"0")],
    }  # fmt: skip
    body: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"", "more_body": False}
    await send(start)
    await send(body)
