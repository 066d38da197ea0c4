"""The batching loop: token-budget queue -> Backend (on its own thread) -> futures.

Two tasks share one slot. The producer waits (on an Event, never a timer) until the slot is
free and entries are waiting, takes the next batch from the queue and puts it in the slot:
that is the one prefetched batch, formed while the model runs the current one. The runner
takes the batch from the slot, runs it on the model's single-thread executor and resolves the
entries' futures. A failing batch fails only its own requests (424) and marks the backend
unhealthy until a batch or a health probe succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from tei_runtime.backend import Backend, Output
from tei_runtime.data import Encoding
from tei_runtime.errors import OutOfMemoryError
from tei_runtime.packing import run_packed
from tei_serve.errors import BackendError, ShuttingDownError, UnhealthyError
from tei_serve.metrics import Metrics
from tei_serve.model import Array
from tei_serve.token_queue import Batch, TokenBudgetQueue

log = logging.getLogger("tei_serve")


@dataclass(frozen=True)
class Result:
    value: Array
    queue_time: float
    inference_time: float


@dataclass(frozen=True)
class Job:
    encoding: Encoding
    future: asyncio.Future[Result]


class Worker:
    def __init__(
        self,
        model: Backend,
        *,
        max_batch_tokens: int,
        max_batch_requests: int | None,
        max_wait: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.clock = clock
        self.queue: TokenBudgetQueue[Job] = TokenBudgetQueue(
            max_batch_tokens=max_batch_tokens,
            max_batch_requests=max_batch_requests,
            max_wait=max_wait,
            clock=clock,
        )
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tei-model")
        self._healthy = True
        self.health_listeners: list[Callable[[bool], None]] = []
        """Called, on the event loop, each time a batch or probe changes `healthy`."""
        self._wake = asyncio.Event()
        self._slot: Batch[Job] | None = None
        self._slot_filled = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._slot_free.set()
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self.longest_batch_s = 0.0
        """The longest forward so far: how long the batch running at a shutdown's deadline
        may still take."""
        self._running_since: float | None = None

    @property
    def batch_bound_s(self) -> float:
        """How long a batch may take, as far as is known now: the longest one that ended, or
        the one running, which has taken this long already (the first batch of a server
        stopped early has no ended one to go by)."""
        running = 0.0 if self._running_since is None else self.clock() - self._running_since
        return max(self.longest_batch_s, running)

    @property
    def healthy(self) -> bool:
        """False from a failed batch or probe until one succeeds."""
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        changed = value != self._healthy
        self._healthy = value
        if changed:
            for listener in self.health_listeners:
                listener(value)

    # -- public --------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._produce(), name="tei-batcher"),
            asyncio.create_task(self._run(), name="tei-runner"),
        ]

    def submit(self, encoding: Encoding, output: Output) -> asyncio.Future[Result]:
        if self._closing:
            raise ShuttingDownError()
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.queue.push(
            Job(encoding, future), length=len(encoding), kind=output, is_dropped=future.done
        )
        self.metrics.queue_size.set(len(self.queue))
        self._wake.set()
        return future

    def shed(self, message: str) -> int:
        """Refuse every entry still queued with ShuttingDownError(message), and every new one:
        the shutdown's grace is running out, and an answer now beats a cancelled request.
        The batch already running finishes. Returns how many entries were refused."""
        self._closing = True
        refused = 0
        # The queue, and the batch formed next (its runner skips entries already answered).
        waiting = self.queue.drain() + (list(self._slot.entries) if self._slot else [])
        for entry in waiting:
            if not entry.payload.future.done():
                entry.payload.future.set_exception(ShuttingDownError(message))
                refused += 1
        self.metrics.queue_size.set(0)
        self._wake.set()
        return refused

    async def stop(self) -> None:
        """Finish every accepted entry, then end both tasks."""
        self._closing = True
        self._wake.set()
        if self._tasks:
            await asyncio.gather(*self._tasks)
        self.executor.shutdown(wait=True)

    async def probe(self, encoding: Encoding, output: Output) -> None:
        """One tiny forward on the model thread; clears the unhealthy flag when it works."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self._forward, output, [encoding])
        except Exception as e:
            self.healthy = False
            raise UnhealthyError() from e
        self.healthy = True

    # -- tasks ---------------------------------------------------------------------------

    async def _produce(self) -> None:
        while True:
            await self._slot_free.wait()
            if not len(self.queue):
                if self._closing:
                    break
                self._wake.clear()
                await self._wake.wait()
                continue
            taken = self.queue.next_batch()
            self.metrics.queue_size.set(len(self.queue))
            if taken.dropped:
                # TEI's count: one per queued input whose client left, as the batch forms.
                self.metrics.failure("dropped", by=len(taken.dropped))
            if taken.batch is None:
                continue
            self.metrics.batch_next_size.observe(len(taken.batch))
            # TEI's: the inputs' own tokens (padding only decides where a batch ends).
            self.metrics.batch_next_tokens.observe(sum(e.length for e in taken.batch.entries))
            self._slot = taken.batch
            self._slot_free.clear()
            self._slot_filled.set()
        self._slot = None
        self._slot_free.clear()
        self._slot_filled.set()  # wakes the runner with an empty slot: the end

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slot_filled.wait()
            batch, self._slot = self._slot, None
            self._slot_filled.clear()
            if batch is None:
                return
            self._slot_free.set()
            entries = [e for e in batch.entries if not e.payload.future.done()]
            if skipped := len(batch.entries) - len(entries):
                # Their client left after the batch formed: not computed, counted as dropped
                # too (TEI would still compute them).
                self.metrics.failure("dropped", by=skipped)
            if not entries:
                continue
            started = self._running_since = self.clock()
            try:
                values = await loop.run_in_executor(
                    self.executor, self._forward_apart, cast(Output, batch.kind),
                    [e.payload.encoding for e in entries],
                )
            except Exception as e:
                self._running_since = None
                # A failed batch fails its own requests only; the server lives on.
                log.exception("backend failed on a batch of %d", len(entries))
                self.healthy = False
                err = _backend_error(e)
                for entry in entries:
                    if not entry.payload.future.done():
                        entry.payload.future.set_exception(err)
                continue
            refused = [v for v in values if isinstance(v, OutOfMemoryError)]
            if len(refused) < len(values):
                self.healthy = True
            if refused:
                # Those inputs asked too much of this host; the model itself is fine.
                log.warning("%d of a batch of %d refused: %s", len(refused), len(values),
                            refused[0])  # fmt: skip
            self._running_since = None
            inference = self.clock() - started
            self.longest_batch_s = max(self.longest_batch_s, inference)
            for entry, value in zip(entries, values, strict=True):
                future = entry.payload.future
                if future.done():
                    continue
                if isinstance(value, OutOfMemoryError):
                    future.set_exception(_backend_error(value))
                else:
                    future.set_result(Result(value, started - entry.enqueued_at, inference))

    # -- helpers -------------------------------------------------------------------------


    def _forward(self, output: Output, encodings: Sequence[Encoding]) -> Sequence[Array]:
        """A probe's forward: any refused piece fails it."""
        values = self._forward_apart(output, encodings)
        if refused := next((v for v in values if isinstance(v, OutOfMemoryError)), None):
            raise refused
        return cast(list[Array], values)

    def _forward_apart(
        self, output: Output, encodings: Sequence[Encoding]
    ) -> list[Array | OutOfMemoryError]:
        """A queued batch's forward: a piece the host's memory refuses (one long input, alone
        in its piece) fails its own entries, not the other requests batched with it. Timed
        here, on the model thread: a probe waiting behind a batch is not busy time."""

        def piece(batch: Sequence[Encoding]) -> list[Array | OutOfMemoryError]:
            try:
                return list(self.model.forward(batch, output))
            except OutOfMemoryError as e:
                return [e] * len(batch)

        started = self.clock()
        try:
            return run_packed(encodings, piece, self.model.packing)
        finally:
            self.metrics.model_busy(self.clock() - started)


def _backend_error(cause: Exception) -> BackendError:
    err = BackendError(f"Backend error: {cause}")
    err.__cause__ = cause
    return err


def forward_in_pieces(
    model: Backend, output: Output, encodings: Sequence[Encoding]
) -> Sequence[Array]:
    """Run one queued batch as length-sorted pieces under the model's own token budget.

    --max-batch-tokens (TEI's 16384) bounds what is admitted into one batch; on CPU a forward
    of that size ran about 3x slower per text than pieces of the runtime's CPU budget (1024
    padded tokens), measured on all-MiniLM-L6-v2 with 32 mixed-length texts per request, and
    its activations grew the process by hundreds of MB. On GPUs the budget is the whole batch.
    The runtime's `packing` also cuts CPU pieces where padding would pass 10%.
    """
    return run_packed(encodings, lambda piece: model.forward(piece, output), model.packing)
