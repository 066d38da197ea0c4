"""Admission permits and input parsing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from tei_runtime import errors as rt_errors
from tei_runtime.data import Encoding
from tei_serve import admission
from tei_serve.admission import Permits, waiting_for_permits
from tei_serve.errors import BodyError, EmptyError, OverloadedError, TokenizerError
from tei_serve.http.protocol import parse_ids, parse_inputs, parse_predict_inputs
from tei_serve.metrics import MetricFamilies
from tei_serve.model import Input


def test_permits_all_or_nothing_and_released() -> None:
    async def scenario() -> None:
        p = Permits(4)
        async with p.acquire(3):
            assert p.available == 1
            with pytest.raises(OverloadedError):
                async with p.acquire(2):
                    pass
            assert p.available == 1
            async with p.acquire(1):
                assert p.available == 0
        assert p.available == 4

    asyncio.run(scenario())


def test_permits_released_on_error() -> None:
    async def scenario() -> None:
        p = Permits(2)
        with pytest.raises(RuntimeError):
            async with p.acquire(2):
                raise RuntimeError
        assert p.available == 2

    asyncio.run(scenario())


def test_waiters_are_served_in_order_and_before_callers_that_do_not_wait() -> None:
    async def scenario() -> None:
        p = Permits(3)
        order: list[str] = []
        release = asyncio.Event()

        async def hold(name: str, n: int, *, wait: bool) -> None:
            async with p.acquire(n, wait=wait):
                order.append(name)
                await release.wait()

        first = asyncio.create_task(hold("first", 3, wait=False))
        await asyncio.sleep(0)
        big = asyncio.create_task(hold("big", 2, wait=True))
        small = asyncio.create_task(hold("small", 1, wait=True))
        await asyncio.sleep(0)
        assert p.waiting == 2
        with pytest.raises(OverloadedError):  # waiters go first: no jumping the queue
            async with p.acquire(1):
                pass
        release.set()
        await asyncio.gather(first, big, small)
        assert order == ["first", "big", "small"]
        assert p.available == 3 and p.waiting == 0

    asyncio.run(scenario())


def test_a_waiter_that_leaves_lets_the_next_one_in_and_keeps_nothing() -> None:
    async def scenario() -> None:
        p = Permits(2)
        async with p.acquire(1):
            leaver = asyncio.create_task(p.acquire(2, wait=True).__aenter__())
            await asyncio.sleep(0)
            got_one = asyncio.Event()

            async def one() -> None:
                async with p.acquire(1, wait=True):
                    got_one.set()

            behind = asyncio.create_task(one())
            await asyncio.sleep(0)
            assert p.waiting == 2 and not got_one.is_set()
            leaver.cancel()
            await asyncio.wait_for(behind, 1)
            assert got_one.is_set()
        assert p.available == 2 and p.waiting == 0

    asyncio.run(scenario())


def test_more_permits_than_exist_fail_at_once_or_take_all_when_waiting() -> None:
    """A gRPC Rerank of more texts than permits runs (TEI waits a permit per text)."""

    async def scenario() -> None:
        p = Permits(2)
        with pytest.raises(OverloadedError):
            async with p.acquire(3):
                pass
        assert p.available == 2
        held: list[int] = []

        async def rerank_of_three() -> None:
            async with p.acquire(3, wait=True):
                held.append(p.available)

        async with p.acquire(1):
            big = asyncio.create_task(rerank_of_three())
            await asyncio.sleep(0)
            assert p.waiting == 1 and not held
        await asyncio.wait_for(big, 1)
        assert held == [0] and p.available == 2 and p.waiting == 0

    asyncio.run(scenario())


def test_waiting_for_permits_marks_only_its_own_work() -> None:
    async def scenario() -> None:
        p = Permits(1)
        async with p.acquire(1):

            async def admit() -> None:
                async with p.acquire(1, wait=admission._WAIT_FOR_PERMITS.get()):
                    pass

            with pytest.raises(OverloadedError):
                await admit()
            waiter = asyncio.create_task(waiting_for_permits(admit()))
            await asyncio.sleep(0)
            assert p.waiting == 1 and not admission._WAIT_FOR_PERMITS.get()
        await asyncio.wait_for(waiter, 1)

    asyncio.run(scenario())


def test_inputs_union() -> None:
    assert parse_inputs("a") == (["a"], False)
    assert parse_inputs(["a", "b"]) == (["a", "b"], True)
    assert parse_inputs([101, 2023, 102]) == ([[101, 2023, 102]], False)
    assert parse_inputs([[1, 2], "x"]) == ([[1, 2], "x"], True)
    # TEI reads `[]` as one input of no token ids; the core refuses it as empty
    assert parse_inputs([]) == ([[]], False)
    with pytest.raises(BodyError):
        parse_inputs({"a": 1})
    with pytest.raises(BodyError):
        parse_inputs([1.5])


def test_predict_pair_is_one_input() -> None:
    assert parse_predict_inputs("s") == (["s"], False)
    assert parse_predict_inputs(["a", "b"]) == ([("a", "b")], False)
    assert parse_predict_inputs([["a"], ["q", "d"]]) == (["a", ("q", "d")], True)
    with pytest.raises(BodyError):
        parse_predict_inputs(["a", "b", "c"])
    with pytest.raises(BodyError):
        parse_predict_inputs([["a", "b", "c"]])


def test_decode_ids() -> None:
    assert parse_ids([1, 2]) == [[1, 2]]
    assert parse_ids([[1], [2, 3]]) == [[1], [2, 3]]
    with pytest.raises(EmptyError):
        parse_ids([])


class _ThreadRecordingModel:
    """Tokenizes to one token per character and notes which thread did it."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode(self, inputs: Sequence[Input], **_: object) -> list[Encoding]:
        self.threads.append(threading.current_thread().name)
        texts = [i if isinstance(i, str) else "" for i in inputs]
        if any("!" in t for t in texts):
            raise rt_errors.TokenizerError("no exclamations")
        return [Encoding(ids=tuple(range(len(t))), type_ids=(0,) * len(t),
                         offsets=((0, 0),) * len(t)) for t in texts]  # fmt: skip


def test_tiny_requests_tokenize_on_the_loop_and_the_rest_on_the_pool() -> None:
    model = _ThreadRecordingModel()
    pool = ThreadPoolExecutor(1, thread_name_prefix="tok-pool")
    adm = admission.Admission(
        model,  # type: ignore[arg-type]  # only encode is used by tokenize
        None,  # type: ignore[arg-type]
        MetricFamilies(64).view("m"), max_concurrent_requests=8, pool=pool,
    )  # fmt: skip
    tiny = ["x" * 100, "y" * (admission.INLINE_CHARS - 100)]
    big = ["x" * 100, "y" * (admission.INLINE_CHARS - 99)]

    async def scenario() -> tuple[str, list[str]]:
        loop_thread = threading.current_thread().name
        for inputs in (tiny, big):
            meta = admission.Tally(start=0.0)
            encs = await adm.tokenize(inputs, truncate=True, truncation_direction="right",
                                      prompt_name=None, meta=meta)  # fmt: skip
            assert [len(e) for e in encs] == [len(t) for t in inputs]
            assert meta.chars == sum(map(len, inputs))
        for inputs in (["!"], ["!" * (admission.INLINE_CHARS + 1)]):  # errors map the same
            with pytest.raises(TokenizerError, match="no exclamations"):
                await adm.tokenize(inputs, truncate=True, truncation_direction="right",
                                   prompt_name=None, meta=admission.Tally(start=0.0))  # fmt: skip
        for pair in (("a" * 128, "b" * 128), ("a" * 128, "b" * 129)):  # a pair counts both
            meta = admission.Tally(start=0.0)
            await adm.tokenize([pair], truncate=True, truncation_direction="right",
                               prompt_name=None, meta=meta)  # fmt: skip
            assert meta.chars == len(pair[0]) + len(pair[1])
        return loop_thread, model.threads

    try:
        loop_thread, threads = asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert threads[0] == loop_thread and threads[2] == loop_thread
    assert threads[1].startswith("tok-pool") and threads[3].startswith("tok-pool")
    assert threads[4] == loop_thread and threads[5].startswith("tok-pool")


def test_tokenization_time_is_per_input_as_tei_reports_it() -> None:
    """TEI's x-tokenization-time (and its histogram) is the average over a batch's inputs."""
    model = _ThreadRecordingModel()
    adm = admission.Admission(
        model,  # type: ignore[arg-type]  # only encode is used by tokenize
        None,  # type: ignore[arg-type]
        MetricFamilies(64).view("m"), max_concurrent_requests=8,
        pool=ThreadPoolExecutor(1),
    )  # fmt: skip
    ticks = iter([10.0, 10.8])  # the call took 0.8 s
    adm.clock = lambda: next(ticks)
    meta = admission.Tally(start=0.0)
    asyncio.run(adm.tokenize(["a", "b", "c", "d"], truncate=True, truncation_direction="right",
                             prompt_name=None, meta=meta))  # fmt: skip
    assert meta.tokenization == pytest.approx(0.2)
