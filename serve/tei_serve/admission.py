"""Admission, tokenization and queueing of one request's inputs.

Admission: `max_concurrent_requests` permits, one per input, held through tokenization, queue
and inference. A request that cannot take all of its permits is answered 429 at once (TEI's
`try_acquire` on its HTTP routes and unary RPCs). A gRPC stream's messages wait for theirs
instead, first come first served, as TEI's streams do (`acquire_permit().await`): the stream
front-end marks them with `waiting_for_permits()`.

With its permits held, a request's inputs are counted (`te_embed_count` / `te_predict_count`)
and checked one by one in request order, as TEI's `Infer` does just before it tokenizes them:
the first input that fails (empty, too long, an unknown prompt) gives the answer.

Tokenization runs on a pool of `tokenization_workers` threads, off the event loop, before the
entries are queued, so the token-budget queue holds token counts it can pack by; a request of
at most `INLINE_CHARS` characters is tokenized on the loop, where that is cheaper than the hop.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from tei_runtime import errors as rt_errors
from tei_runtime.backend import Output
from tei_runtime.data import Encoding
from tei_runtime.tokenization import chars_of
from tei_serve.errors import (
    OverloadedError,
    empty_input,
    from_runtime,
    refused_while_tokenizing,
)
from tei_serve.metrics import Metrics
from tei_serve.model import Direction, Input, ServedModel
from tei_serve.worker import Result, Worker


@dataclass
class Tally:
    """One request's figures as they accumulate (serving turns them into its `Metadata`)."""

    start: float
    chars: int = 0
    tokens: int = 0
    tokenization: float = 0.0
    """average per input"""
    queue: float = 0.0
    """average per input"""
    inference: float = 0.0
    """average per input"""
    token_counts: list[int] = field(default_factory=list)


INLINE_CHARS = 256
"""A request whose inputs total at most this many characters (`chars_of`) is tokenized on the
event loop: handing it to the tokenizer pool and back cost more than tokenizing it (110-140 us
of latency against 30 us for a 70-character text; 160 us for 512 characters; all-MiniLM-L6-v2's
tokenizer on a 2-core AMD EPYC Zen 4 VM)."""


class Permits:
    """A counting semaphore: `acquire(n)` takes n permits at once, or fails, or waits.

    Waiters are served in arrival order, and permits freed go to them before anyone who does
    not wait: a stream message queued for permits is not starved by a flow of HTTP requests
    (those get 429 while anyone waits, as under TEI's fair semaphore)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.available = total
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for _, f in self._waiters if not f.done())

    def _grant(self) -> None:
        while self._waiters:
            need, granted = self._waiters[0]
            if granted.done():  # its caller left while waiting
                self._waiters.popleft()
                continue
            if need > self.available:
                return
            self._waiters.popleft()
            self.available -= need
            granted.set_result(None)

    def _release(self, n: int) -> None:
        self.available += n
        self._grant()

    async def _wait_for(self, n: int) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self._release(n)
            else:  # a smaller request behind it may fit now
                granted.cancel()
                self._grant()
            raise

    @asynccontextmanager
    async def acquire(self, n: int, *, wait: bool = False) -> AsyncIterator[None]:
        """Hold n permits for the block; without `wait`, none free is `OverloadedError`.

        n over the total fails at once unless waiting; a waiter takes every permit instead
        (TEI's waiting callers take one per input as they go, so they never need more)."""
        if wait:
            n = min(n, self.total)
        if n <= self.available and not self.waiting:
            self.available -= n
        elif wait:
            await self._wait_for(n)
        else:
            raise OverloadedError()
        try:
            yield
        finally:
            self._release(n)


_WAIT_FOR_PERMITS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tei_serve_wait_for_permits", default=False
)

T = TypeVar("T")


async def waiting_for_permits(work: Awaitable[T]) -> T:
    """Await `work` with its admissions waiting for permits rather than failing at once.

    A context variable, so it reaches the admission through every layer between (routing,
    observation, the operation) without a flag on each; it is set in this task only."""
    token = _WAIT_FOR_PERMITS.set(True)
    try:
        return await work
    finally:
        _WAIT_FOR_PERMITS.reset(token)


class Admission:
    """Permits, the tokenizer pool and the queue hand-off, for the serving core."""

    def __init__(
        self,
        model: ServedModel,
        worker: Worker,
        metrics: Metrics,
        *,
        max_concurrent_requests: int,
        pool: ThreadPoolExecutor,
        default_prompt_name: str | None = None,
        default_prompt: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.worker = worker
        self.metrics = metrics
        self.permits = Permits(max_concurrent_requests)
        self.pool = pool
        """The tokenizer threads (shared by every model of the process; not closed here)."""
        self.default_prompt_name = default_prompt_name
        self.default_prompt = default_prompt
        self.clock = clock

    async def off_loop(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the tokenizer pool (tokenize, decode, big JSON encodes)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    def prompt_of(self, prompt_name: str | None) -> tuple[str | None, str | None]:
        """(prompt name, prompt text) for a request's `prompt_name`, as TEI's tokenizer picks:
        the request's name when it gives one (even an empty one, which no model has), else
        --default-prompt-name, else --default-prompt (else the artifact's own default)."""
        if prompt_name is not None:
            return prompt_name, None
        if self.default_prompt_name is not None:
            return self.default_prompt_name, None
        return None, self.default_prompt

    async def tokenize(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool,
        truncation_direction: Direction,
        prompt_name: str | None,
        meta: Tally,
        use_prompt: bool = True,
        instruction: str | None = None,
    ) -> Sequence[Encoding]:
        prompt: str | None = None
        if use_prompt:
            prompt_name, prompt = self.prompt_of(prompt_name)
        call = functools.partial(
            self.model.encode,
            inputs,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name if use_prompt else None,
            prompt=prompt,
            instruction=instruction,
        )
        chars = sum(map(chars_of, inputs))
        started = self.clock()
        try:
            if chars <= INLINE_CHARS:
                encodings = call()
            else:
                encodings = await asyncio.get_running_loop().run_in_executor(self.pool, call)
        except rt_errors.TeiRuntimeError as e:
            raise refused_while_tokenizing(from_runtime(e)) from e
        # Per input, as TEI reports it (headers, spans, te_request_tokenization_duration):
        # TEI averages each input's own tokenization; one batch call's wall time shared out.
        meta.tokenization = (self.clock() - started) / max(1, len(inputs))
        meta.chars += chars
        for enc in encodings:
            n = len(enc)
            meta.tokens += n
            meta.token_counts.append(n)
            self.metrics.input_length.observe(n)
        return encodings

    async def _refuse_empty(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool,
        truncation_direction: Direction,
        prompt_name: str | None,
        use_prompt: bool,
        instruction: str | None,
    ) -> None:
        """An empty input's error, unless an input before it fails first.

        TEI validates a batch input by input, each through its tokenization, and answers with
        the first failure in request order: an empty input after one that is too long (or
        after any input, when the prompt name is unknown) answers with that earlier error.
        Only the inputs before the first empty one are tokenized, and only when there is one.
        """
        empty_at = next((i for i, inp in enumerate(inputs) if is_empty(inp)), None)
        if empty_at is None:
            return
        if empty_at:
            await self.tokenize(
                inputs[:empty_at], truncate=truncate, truncation_direction=truncation_direction,
                prompt_name=prompt_name, meta=Tally(start=self.clock()), use_prompt=use_prompt,
                instruction=instruction,
            )  # fmt: skip
        raise empty_input()

    async def run(
        self,
        inputs: Sequence[Input],
        output: Output,
        *,
        truncate: bool,
        truncation_direction: Direction = "right",
        prompt_name: str | None = None,
        meta: Tally,
        use_prompt: bool = True,
        instruction: str | None = None,
    ) -> list[Result]:
        """Admit, count, check, tokenize, queue and await every input of one request."""
        async with self.permits.acquire(len(inputs), wait=_WAIT_FOR_PERMITS.get()):
            self.metrics.inputs_received("predict" if output is Output.LOGITS else "embed",
                                         len(inputs))  # fmt: skip
            await self._refuse_empty(
                inputs, truncate=truncate, truncation_direction=truncation_direction,
                prompt_name=prompt_name, use_prompt=use_prompt, instruction=instruction,
            )  # fmt: skip
            encodings = await self.tokenize(
                inputs,
                truncate=truncate,
                truncation_direction=truncation_direction,
                prompt_name=prompt_name,
                meta=meta,
                use_prompt=use_prompt,
                instruction=instruction,
            )
            futures = [self.worker.submit(enc, output) for enc in encodings]
            try:
                results = list(await asyncio.gather(*futures))
            finally:
                # On error or cancellation (client gone), the queue drops what is left.
                for f in futures:
                    f.cancel()
        n = len(results)
        meta.queue = sum(r.queue_time for r in results) / n
        meta.inference = sum(r.inference_time for r in results) / n
        return results


def is_empty(inp: Input) -> bool:
    """TEI's `EncodingInput::is_empty`: "", [] (no token ids), a pair of two ""."""
    return not (inp[0] or inp[1] if isinstance(inp, tuple) else inp)
