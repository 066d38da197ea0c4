"""Answer a stream of requests concurrently, in order, with a bounded window.

A gRPC stream's messages are each one request to the serving core. Awaiting them one by one
would run them one batch each; starting every message as it arrives lets the batcher pack
the messages of one stream (and of other callers) together. At most `window` messages are
being answered at a time: once that many are, the next message is not read until one of them
is done, so HTTP/2 flow control pushes back on the client instead of 10,000 messages becoming
10,000 tasks. A finished answer frees its place before the client reads it, as TEI's stream
answers go to an unbounded channel: a client that writes every message before it reads any
(grpc-go's and grpc.aio's usual pattern) would otherwise stop the server's reading once a
window of answers waits unread, while it waits itself for its writes to go through.

Answers come out in the order the requests came in. The first failure ends the stream with
that error (as a failed message ends TEI's stream); the messages still in flight are then
cancelled, as they are when the client cancels the call: their queue entries are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class _End:
    """The request stream ended (`error` None) or could not be read."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


async def answer_in_order(
    requests: AsyncIterator[Req],
    answer: Callable[[Req], Awaitable[Resp]],
    *,
    window: int,
) -> AsyncIterator[Resp]:
    """Yield `await answer(r)` for each request `r`, in order, at most `window` being answered
    at a time (answered ones wait for the client without holding a place)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    slots = asyncio.Semaphore(window)
    started: asyncio.Queue[asyncio.Future[Resp] | _End] = asyncio.Queue()

    async def read() -> None:
        try:
            async for request in requests:
                await slots.acquire()
                answering = asyncio.ensure_future(answer(request))
                answering.add_done_callback(lambda _: slots.release())
                started.put_nowait(answering)
        except Exception as e:  # the transport's read error, answered after what came before
            started.put_nowait(_End(e))
        else:
            started.put_nowait(_End())

    reader = asyncio.ensure_future(read())
    try:
        while True:
            item = await started.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield await item
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        while not started.empty():
            left = started.get_nowait()
            if not isinstance(left, _End):
                left.cancel()
                left.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Resp]) -> None:
    """Mark a dropped answer's failure as seen: the stream already ended with the first one."""
    if not future.cancelled():
        future.exception()
