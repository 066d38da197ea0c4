"""Admission, tokenization and queueing of one request's inputs.

Admission: `max_concurrent_requests` permits, one per input, taken without waiting; when a
request cannot take all of its permits it is answered 429 at once (TEI's `try_acquire`). The
permits are held through tokenization, queue and inference.

Tokenization runs on a pool of `tokenization_workers` threads, off the event loop, before the
entries are queued, so the token-budget queue holds token counts it can pack by.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from tei_runtime import errors as rt_errors
from tei_runtime.backend import Output
from tei_runtime.data import Encoding
from tei_serve.errors import OverloadedError, from_runtime
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
    queue: float = 0.0
    """average per input"""
    inference: float = 0.0
    """average per input"""
    token_counts: list[int] = field(default_factory=list)


class Permits:
    """A counting semaphore that never waits."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.available = total

    @contextmanager
    def take(self, n: int) -> Iterator[None]:
        if n > self.available:
            raise OverloadedError()
        self.available -= n
        try:
            yield
        finally:
            self.available += n


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
        if use_prompt and prompt_name is None:
            prompt_name = self.default_prompt_name
            prompt = self.default_prompt if prompt_name is None else None
        call = functools.partial(
            self.model.encode,
            inputs,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name if use_prompt else None,
            prompt=prompt,
            instruction=instruction,
        )
        started = self.clock()
        try:
            encodings = await asyncio.get_running_loop().run_in_executor(self.pool, call)
        except rt_errors.TeiRuntimeError as e:
            raise from_runtime(e) from e
        meta.tokenization = self.clock() - started
        for inp in inputs:
            if isinstance(inp, str):
                meta.chars += len(inp)
            elif isinstance(inp, tuple):
                meta.chars += len(inp[0]) + len(inp[1])
            else:
                meta.chars += len(inp)
        for enc in encodings:
            n = len(enc)
            meta.tokens += n
            meta.token_counts.append(n)
            self.metrics.input_length.observe(n)
        return encodings

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
        """Admit, tokenize, queue and await every input of one request."""
        with self.permits.take(len(inputs)):
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
