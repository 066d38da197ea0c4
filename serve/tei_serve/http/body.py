"""Reading request bodies: the one path every route takes, and answering before the body ends.

`read_body` is how a route gets its body: JSON content type (415 otherwise), at most
`--payload-limit` bytes held (413 as soon as the announced length or the bytes received pass
it, never more than the limit buffered), a client that leaves mid-body is `ClientGoneError`.
A body sent with `Content-Encoding: gzip` or `deflate` is inflated, to at most the limit too
(413 past it, so a small bomb cannot fill memory); other encodings are 415 (TEI reads no
encoding at all: its answer to a compressed body is a JSON parse error).

`DrainUnread` wraps the whole ASGI app. An answer that comes before the request body has been
read (413, 415, 401, 404, ...) would otherwise be followed by the server closing the socket
with the client's bytes still unread (uvicorn closes when the client asked for
`Connection: close`, as urllib does): the kernel then resets the connection and the client
never sees the answer. So before an answer starts, the rest of the body is read and dropped
(up to `DRAIN_LIMIT` bytes; a larger upload is cut off). The answer closes the connection
instead of waiting for the body when waiting cannot help or could last forever: a client that
sent `Expect: 100-continue` and has not been told to go on (it sends nothing until then), a
body announced larger than `DRAIN_LIMIT`, and one that stops arriving for `DRAIN_SECONDS` (a
client that announces megabytes and sends a few bytes would otherwise hold its answer, and a
connection, as long as it likes).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

from litestar import Request
from litestar.enums import ScopeType

from tei_serve.errors import BodyError, ClientGoneError

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

JSON = "application/json"
# Bytes read and dropped after an early answer; past this the connection may be reset.
DRAIN_LIMIT = 64 * 1024 * 1024
# How long an early answer waits for more of the body to drop before it closes instead.
DRAIN_SECONDS = 5.0


def _body_of(message: Any) -> bytes:
    """The bytes an ASGI `http.request` message carries (none for `http.disconnect`)."""
    body: bytes = message.get("body", b"")
    return body


def is_json(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == JSON or (mime.startswith("application/") and mime.endswith("+json"))


def too_large(limit: int) -> BodyError:
    return BodyError(f"Payload too large: the body is over the limit of {limit} bytes", status=413)


async def read_body(request: Request[Any, Any, Any], limit: int) -> bytes:
    """The JSON body of `request`, at most `limit` bytes of it ever held."""
    if not is_json(request.headers.get("content-type", "")):
        raise BodyError("Expected request with `Content-Type: application/json`", status=415)
    announced = request.headers.get("content-length")
    if announced is not None:
        try:
            length = int(announced)
        except ValueError as e:
            raise BodyError(f"Invalid content-length: {announced!r}", status=400) from e
        if length > limit:
            raise too_large(limit)
    body = bytearray()
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGoneError("client disconnected while sending the body")
        chunk = _body_of(message)
        if len(body) + len(chunk) > limit:
            raise too_large(limit)
        body += chunk
        if not message.get("more_body", False):
            encoding = request.headers.get("content-encoding", "")
            if _encoding_name(encoding) in IDENTITY:
                return bytes(body)
            if len(body) > INFLATE_ON_LOOP_BYTES:
                # Inflating up to --payload-limit (an operator may set it to gigabytes) would
                # hold the event loop; a small body inflates faster than a thread hand-off.
                return await asyncio.to_thread(inflate, bytes(body), encoding, limit)
            return inflate(bytes(body), encoding, limit)


def _encoding_name(encoding: str) -> str:
    return encoding.strip().lower()


IDENTITY = ("", "identity")  # no Content-Encoding, or the body as it is

# A compressed body larger than this is inflated on a worker thread (64 KiB of gzipped JSON
# text inflates to ~0.5 MB in under a millisecond; 2-core AMD EPYC Zen 4).
INFLATE_ON_LOOP_BYTES = 64 * 1024

# zlib's window bits: 16 + 15 reads gzip, 32 + 15 reads zlib or gzip (HTTP's "deflate" is zlib
# data, though some clients send gzip under that name).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
          "deflate": 32 + zlib.MAX_WBITS}  # fmt: skip


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` decoded from its `Content-Encoding`, at most `limit` bytes of it."""
    name = _encoding_name(encoding)
    if name in IDENTITY:
        return body
    wbits = _WBITS.get(name)
    if wbits is None:
        raise BodyError(f"Unsupported Content-Encoding {encoding!r}: send the body as it is, "
                        f"or gzip or deflate it", status=415)  # fmt: skip
    out = bytearray()
    rest = body
    try:
        while rest:  # gzip allows several members one after the other
            inflater = zlib.decompressobj(wbits)
            out += inflater.decompress(rest, limit + 1 - len(out))
            if len(out) > limit or inflater.unconsumed_tail:
                raise too_large(limit)
            if not inflater.eof:
                raise BodyError(f"the {name} body ends before its compressed data does",
                                status=400)  # fmt: skip
            rest = inflater.unused_data
    except zlib.error as e:
        raise BodyError(f"the body is not valid {name} data: {e}", status=400) from e
    return bytes(out)


class DrainUnread:
    """ASGI wrapper: the request body is read to its end before any HTTP answer starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        state = _Unread(scope, receive)

        async def tracking_receive() -> ReceiveMessage:
            message = await receive()
            state.saw(message)
            return message

        async def draining_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not await state.read_out():
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, tracking_receive, draining_send)


class _Unread:
    """Whether a request's body has been read to its end, and reading what is left."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        headers = scope.get("headers", ())
        self._expects_continue = any(
            name == b"expect" and value.lower() == b"100-continue" for name, value in headers
        )
        self._announced = next(
            (int(value) for name, value in headers if name == b"content-length"
             and value.strip().isdigit()), None,
        )  # fmt: skip
        self._receive = receive
        self._received_any = False
        self._done = False

    def saw(self, message: Any) -> None:
        self._received_any = True
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self._done = True

    def awaits_continue(self) -> bool:
        """The client waits for `100 Continue` before sending; reading would invite the body."""
        return self._expects_continue and not self._received_any and not self._done

    async def read_out(self) -> bool:
        """The body read to its end, so that the answer can keep the connection; False when the
        answer has to close it instead."""
        if self.awaits_continue() or self.too_long_to_drain():
            return False
        return await self.drain()

    def too_long_to_drain(self) -> bool:
        """The announced body is more than `drain` would read: reading it cannot help."""
        return not self._done and self._announced is not None and self._announced > DRAIN_LIMIT

    async def drain(self) -> bool:
        """Read and drop the rest of the body; False when it stopped arriving for
        `DRAIN_SECONDS` or passed `DRAIN_LIMIT` first (the connection must close then)."""
        dropped = 0
        while not self._done and dropped <= DRAIN_LIMIT:
            try:
                message = await asyncio.wait_for(self._receive(), DRAIN_SECONDS)
            except TimeoutError:
                return False
            self.saw(message)
            dropped += len(_body_of(message))
        return self._done
