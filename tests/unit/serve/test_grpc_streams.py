"""answer_in_order: the gRPC streams' concurrency, order, window, failure and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tei_serve.grpc.streams import answer_in_order


async def _requests(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


class Gated:
    """Answers that finish only when the test releases them, in whatever order it likes."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.running = 0
        self.most_running = 0
        self.started: list[int] = []
        self.cancelled: list[int] = []
        self.arrived = asyncio.Event()

    def gate(self, i: int) -> asyncio.Event:
        return self.gates.setdefault(i, asyncio.Event())

    async def answer(self, i: int) -> int:
        self.started.append(i)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        self.arrived.set()
        try:
            await self.gate(i).wait()
        except asyncio.CancelledError:
            self.cancelled.append(i)
            raise
        finally:
            self.running -= 1
        if i < 0:
            raise ValueError(f"bad request {i}")
        return i * 10


async def _until(g: Gated, count: int) -> None:
    while len(g.started) < count:
        g.arrived.clear()
        await g.arrived.wait()


def test_answers_in_request_order_while_they_run_concurrently() -> None:
    async def main() -> list[int]:
        g = Gated()
        out = answer_in_order(_requests(5), g.answer, window=8)
        first = asyncio.ensure_future(anext(out))
        await _until(g, 5)  # all five run at once: the batcher can see them together
        for i in reversed(range(5)):  # finish them last to first
            g.gate(i).set()
        return [await first] + [r async for r in out]

    assert asyncio.run(main()) == [0, 10, 20, 30, 40]


def test_window_bounds_what_is_in_flight() -> None:
    async def main() -> tuple[int, list[int]]:
        g = Gated()
        out = answer_in_order(_requests(10), g.answer, window=3)
        first = asyncio.ensure_future(anext(out))
        await _until(g, 3)
        for _ in range(3):  # let the loop run: the reader must not start a fourth
            await asyncio.sleep(0)
        assert g.started == [0, 1, 2]
        for i in range(10):
            g.gate(i).set()
        results = [await first] + [r async for r in out]
        return g.most_running, results

    most, results = asyncio.run(main())
    assert most == 3
    assert results == [i * 10 for i in range(10)]


def test_answers_the_client_has_not_read_hold_no_place_in_the_window() -> None:
    """The window bounds the messages being answered, not the answers waiting to be read: a
    client that writes everything before reading must not stop the reading (as TEI's
    unbounded answer channel does not)."""

    async def main() -> tuple[list[int], list[int]]:
        g = Gated()
        for i in range(10):
            g.gate(i).set()  # every answer is done as soon as it starts
        out = answer_in_order(_requests(10), g.answer, window=2)
        first = await anext(out)  # then nothing is read for a while
        for _ in range(200):
            if len(g.started) == 10:
                break
            await asyncio.sleep(0)
        started = list(g.started)
        return started, [first] + [r async for r in out]

    started, results = asyncio.run(main())
    assert started == list(range(10))
    assert results == [i * 10 for i in range(10)]


def test_first_failure_ends_the_stream_and_cancels_the_rest() -> None:
    async def requests() -> AsyncIterator[int]:
        for i in (0, -1, 2, 3):
            yield i

    async def main() -> Gated:
        g = Gated()
        out = answer_in_order(requests(), g.answer, window=8)
        first = asyncio.ensure_future(anext(out))
        await _until(g, 4)
        g.gate(0).set()
        assert await first == 0
        g.gate(-1).set()
        with pytest.raises(ValueError, match="bad request -1"):
            await anext(out)
        await asyncio.sleep(0)
        return g

    g = asyncio.run(main())
    assert sorted(g.cancelled) == [2, 3]


def test_closing_the_stream_cancels_everything_in_flight() -> None:
    async def main() -> Gated:
        g = Gated()
        out = answer_in_order(_requests(6), g.answer, window=8)
        first = asyncio.ensure_future(anext(out))
        await _until(g, 6)
        first.cancel()  # the client went away while the handler waited on its answers
        with pytest.raises(asyncio.CancelledError):
            await first
        await out.aclose()
        await asyncio.sleep(0)
        return g

    g = asyncio.run(main())
    assert sorted(g.cancelled) == [0, 1, 2, 3, 4, 5]
    assert g.running == 0


def test_a_read_error_is_raised_after_the_answers_before_it() -> None:
    async def requests() -> AsyncIterator[int]:
        yield 1
        raise ConnectionError("stream broke")

    async def main() -> list[int]:
        async def answer(i: int) -> int:
            return i

        got = []
        with pytest.raises(ConnectionError):
            async for r in answer_in_order(requests(), answer, window=4):
                got.append(r)
        return got

    assert asyncio.run(main()) == [1]


def test_window_must_be_positive() -> None:
    async def main() -> None:
        async def answer(i: int) -> int:
            return i

        with pytest.raises(ValueError):
            await anext(answer_in_order(_requests(1), answer, window=0))

    asyncio.run(main())


def test_stream_window_is_teis_env_capped_by_the_permits() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from tei_serve.grpc.services import stream_window
    from tei_serve.settings import Settings

    def serving(permits: int) -> Any:
        return cast(Any, SimpleNamespace(settings=Settings(max_concurrent_requests=permits)))

    assert stream_window(serving(512), env={}) == 512
    assert stream_window(serving(4096), env={}) == 1024  # TEI's default
    assert stream_window(serving(4096), env={"GRPC_MAX_PARALLEL_STREAM_REQUESTS": "64"}) == 64
    assert stream_window(serving(8), env={"GRPC_MAX_PARALLEL_STREAM_REQUESTS": "64"}) == 8
    assert stream_window(serving(4096), env={"GRPC_MAX_PARALLEL_STREAM_REQUESTS": "0"}) == 1024


def test_predict_pair_inputs() -> None:
    from tei_serve.errors import ValidationError
    from tei_serve.grpc.services import predict_input

    assert predict_input(["a"]) == "a"
    assert predict_input(["q", "p"]) == ("q", "p")
    for bad in ([], ["a", "b", "c"]):
        with pytest.raises(ValidationError, match="single or two elements"):
            predict_input(bad)


def test_what_grpc_reads_of_a_message_fits_its_32_bit_option() -> None:
    """Twice the message limit, within grpc's int option: a --payload-limit of 2e9 made the
    server fail to start with an OverflowError."""
    from tei_serve.grpc.services import TEI_MESSAGE_LIMIT, transport_limit

    assert transport_limit(2_000_000) == 2 * TEI_MESSAGE_LIMIT
    assert transport_limit(100_000_000) == 200_000_000
    assert transport_limit(2_000_000_000) == 2**31 - 1
