"""The worker runs a batcher batch as pieces under the model's own token budget, in order;
warm-up runs the largest of those pieces once."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from tei_runtime.backend import Output
from tei_runtime.data import Encoding
from tei_runtime.manifest import Task
from tei_runtime.packing import Packing
from tei_serve.cli import warm_up
from tei_serve.model import ServedModel
from tei_serve.settings import Settings
from tei_serve.worker import forward_in_pieces


class Recorder:
    def __init__(self, budget: int, max_rows: int | None = None) -> None:
        self.packing = Packing(budget=budget, max_rows=max_rows)
        self.calls: list[list[int]] = []

    def forward(self, batch: Sequence[Encoding], output: Output) -> np.ndarray[Any, Any]:
        assert output is Output.EMBEDDING
        self.calls.append([len(e) for e in batch])
        return np.asarray([[float(e.ids[0]), float(len(e))] for e in batch], dtype=np.float32)


def _enc(first_id: int, length: int) -> Encoding:
    ids = (first_id,) + (1,) * (length - 1)
    return Encoding(ids=ids, type_ids=(0,) * length, offsets=((0, 0),) * length)


def test_pieces_respect_budget_and_keep_order() -> None:
    lengths = [50, 3, 200, 7, 120, 7, 64, 1]
    encodings = [_enc(i, n) for i, n in enumerate(lengths)]
    model = Recorder(budget=256)
    out = forward_in_pieces(model, Output.EMBEDDING, encodings)
    assert [int(row[0]) for row in out] == list(range(len(lengths)))
    assert [int(row[1]) for row in out] == lengths
    assert len(model.calls) > 1
    for call in model.calls:
        assert max(call) * len(call) <= 256 or len(call) == 1
    assert sorted(n for call in model.calls for n in call) == sorted(lengths)


def test_small_batch_runs_whole_and_rows_cap_applies() -> None:
    encodings = [_enc(i, 4) for i in range(6)]
    whole = Recorder(budget=1024)
    forward_in_pieces(whole, Output.EMBEDDING, encodings)
    assert whole.calls == [[4] * 6]
    capped = Recorder(budget=1024, max_rows=4)
    out = forward_in_pieces(capped, Output.EMBEDDING, encodings)
    assert [len(c) for c in capped.calls] == [4, 2]
    assert [int(row[0]) for row in out] == list(range(6))


class WarmRecorder(Recorder):
    """Enough of a model for `warm_up`: a tokenizer that counts words, truncating."""

    max_input_length = 256
    manifest = SimpleNamespace(task=Task.EMBED)

    def encode(self, texts: Sequence[str], *, truncate: bool) -> list[Encoding]:
        assert truncate
        return [_enc(2, min(len(t.split()) + 2, self.max_input_length)) for t in texts]


@pytest.mark.parametrize(
    ("budget", "max_rows", "max_batch_requests", "expected"),
    [
        (1024, None, None, [[256] * 4]),  # CPU: one of the 16 pieces of 4 x 256
        (1 << 30, None, None, [[256] * 64]),  # GPU: the whole 16384-token batch
        (1 << 30, 8, None, [[256] * 8]),  # TensorRT profile caps the rows
        (1 << 30, None, 3, [[256] * 3]),  # --max-batch-requests caps the batch
    ],
)
def test_warm_up_runs_the_largest_piece_once(
    budget: int, max_rows: int | None, max_batch_requests: int | None, expected: list[list[int]]
) -> None:
    model = WarmRecorder(budget=budget, max_rows=max_rows)
    warm_up(cast(ServedModel, model), Settings(max_batch_requests=max_batch_requests))
    assert model.calls == expected


class Slow(Recorder):
    """Each forward takes `seconds` of wall time."""

    def __init__(self, seconds: float) -> None:
        super().__init__(budget=1024)
        self.seconds = seconds

    def forward(self, batch: Sequence[Encoding], output: Output) -> np.ndarray[Any, Any]:
        import time

        time.sleep(self.seconds)
        return super().forward(batch, output)


def test_model_busy_seconds_count_forwards_on_the_model_thread() -> None:
    """`tei_onnx_model_busy_seconds`: batches and probes, each timed where it runs, so a
    probe queued behind a batch adds only its own forward."""
    import asyncio

    from tei_serve.metrics import Metrics
    from tei_serve.worker import Worker

    async def scenario() -> tuple[float, float]:
        metrics = Metrics()
        worker = Worker(cast(Any, Slow(0.3)), max_batch_tokens=1024, max_batch_requests=None,
                        max_wait=0.0, metrics=metrics)  # fmt: skip
        worker.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        batch = worker.submit(_enc(1, 4), Output.EMBEDDING)
        await asyncio.sleep(0.05)  # the batch is running; the probe waits behind it
        await asyncio.gather(batch, worker.probe(_enc(2, 4), Output.EMBEDDING))
        wall = loop.time() - started
        await worker.stop()
        return metrics.counter_value("tei_onnx_model_busy_seconds"), wall

    busy, wall = asyncio.run(scenario())
    # two forwards of 0.3 s; timed around the await, the probe's wait (~0.25 s) would count
    assert 0.6 <= busy <= min(wall + 0.01, 0.75)


def test_warm_up_never_runs_a_sequence_longer_than_the_budget() -> None:
    """A long-context model on the CPU warms up at the budget's 1024 tokens, not at its
    max_input_length: one 16384-token text through an unfused attention asks tens of GB."""
    model = WarmRecorder(budget=1024)
    model.max_input_length = 32768
    warm_up(cast(ServedModel, model), Settings())
    assert model.calls == [[1024]]


class Refusing(Recorder):
    """Fails every forward with `error`."""

    def __init__(self, error: Exception) -> None:
        super().__init__(budget=1024)
        self.error = error

    def forward(self, batch: Sequence[Encoding], output: Output) -> np.ndarray[Any, Any]:
        raise self.error


@pytest.mark.parametrize(
    ("error", "healthy_after"),
    [
        (None, True),  # the host's memory refused the forward: the model is fine
        (RuntimeError("the session broke"), False),
    ],
)
def test_a_refused_forward_fails_its_requests_and_leaves_health_as_it_was(
    error: Exception | None, healthy_after: bool
) -> None:
    import asyncio

    from tei_runtime.errors import OutOfMemoryError
    from tei_serve.errors import BackendError
    from tei_serve.metrics import Metrics
    from tei_serve.worker import Worker

    raised = error or OutOfMemoryError("this forward needs more memory than the 1.0 GiB ...")

    async def scenario() -> tuple[str, bool]:
        worker = Worker(cast(Any, Refusing(raised)), max_batch_tokens=1024,
                        max_batch_requests=None, max_wait=0.0, metrics=Metrics())  # fmt: skip
        worker.start()
        try:
            with pytest.raises(BackendError) as failed:
                await worker.submit(_enc(1, 4), Output.EMBEDDING)
            return str(failed.value), worker.healthy
        finally:
            await worker.stop()

    message, healthy = asyncio.run(scenario())
    assert message.startswith("Backend error: ") and str(raised) in message
    assert healthy is healthy_after


class LongRefused(Recorder):
    """Refuses (as the host's memory would) any piece holding an input over `limit` tokens."""

    def __init__(self, budget: int, limit: int) -> None:
        super().__init__(budget=budget)
        self.limit = limit

    def forward(self, batch: Sequence[Encoding], output: Output) -> np.ndarray[Any, Any]:
        from tei_runtime.errors import OutOfMemoryError

        if max(len(e) for e in batch) > self.limit:
            raise OutOfMemoryError("this forward needs more memory than the 1.0 GiB ...")
        return super().forward(batch, output)


def test_a_refused_piece_fails_only_the_requests_in_it() -> None:
    """A long input and short ones queued together: the long one's piece is refused, the
    short ones batched with it are answered, and health stays as it was."""
    import asyncio

    from tei_serve.errors import BackendError
    from tei_serve.metrics import Metrics
    from tei_serve.worker import Worker

    async def scenario() -> tuple[list[object], bool, list[list[int]]]:
        model = LongRefused(budget=64, limit=50)
        worker = Worker(cast(Any, model), max_batch_tokens=4096, max_batch_requests=None,
                        max_wait=0.0, metrics=Metrics())  # fmt: skip
        worker.start()
        try:
            # submitted before the worker task runs: one queued batch, two pieces
            futures = [worker.submit(_enc(1, 4), Output.EMBEDDING),
                       worker.submit(_enc(2, 100), Output.EMBEDDING),
                       worker.submit(_enc(3, 6), Output.EMBEDDING)]  # fmt: skip
            got = await asyncio.gather(*futures, return_exceptions=True)
            return list(got), worker.healthy, model.calls
        finally:
            await worker.stop()

    got, healthy, calls = asyncio.run(scenario())
    assert calls == [[4, 6]]  # the long piece raised before it was recorded
    assert isinstance(got[1], BackendError) and "needs more memory" in str(got[1])
    for i, length in ((0, 4), (2, 6)):
        assert not isinstance(got[i], BaseException)
        assert [float(x) for x in cast(Any, got[i]).value] == [float(i + 1), float(length)]
    assert healthy
