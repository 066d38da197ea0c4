"""The token-budget queue: a pure data structure (no asyncio, no threads, injected clock).

Entries are tokenized inputs waiting for the model. `next_batch()` picks the entries of one
batch under two limits: padded cost `max_len x n <= max_batch_tokens` (dense ONNX sessions pad
every row to the longest) and `n <= max_batch_requests`.

Choice of entries, in order:

1. Entries whose client went away (`is_dropped()` true) are removed and reported.
2. The oldest entry (the anchor) is always in the batch, and the batch only holds entries of
   the anchor's kind (the runtime call it needs). Each batch therefore serves the oldest waiter,
   so an entry is served within as many batches as there are entries ahead of it: none starves.
3. While the anchor has waited less than `max_wait`, the other entries are chosen by length:
   among the waiting entries of that kind sorted by length, the contiguous run around the anchor
   that holds the most entries within budget (ties go to the run that pads least).
   Sorting by length cuts padding, which is the cost of a dense batch.
4. Once the anchor has waited `max_wait` or more (a backlog), batches are packed strictly first
   come, first served, as TEI does, so the backlog drains in arrival order.

An entry longer than the budget on its own still goes out, alone (the server caps
max_input_length at max_batch_tokens at start-up, so this does not happen there).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(eq=False)
class Entry(Generic[P]):
    length: int
    """Tokens in this input (before padding)."""
    kind: Hashable
    """Which runtime call serves it; a batch holds one kind only."""
    payload: P
    is_dropped: Callable[[], bool] = field(default=lambda: False)
    enqueued_at: float = 0.0
    seq: int = 0


@dataclass(frozen=True)
class Batch(Generic[P]):
    kind: Hashable
    entries: list[Entry[P]]
    max_length: int
    padded_tokens: int
    """max_length x len(entries): what the model computes."""
    created_at: float

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True)
class Taken(Generic[P]):
    batch: Batch[P] | None
    dropped: list[Entry[P]]


class TokenBudgetQueue(Generic[P]):
    def __init__(
        self,
        *,
        max_batch_tokens: int,
        max_batch_requests: int | None = None,
        max_wait: float = 0.05,
        clock: Callable[[], float],
    ) -> None:
        if max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be >= 1")
        if max_batch_requests is not None and max_batch_requests < 1:
            raise ValueError("max_batch_requests must be >= 1")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_wait = max_wait
        self.clock = clock
        self._entries: dict[int, Entry[P]] = {}
        """Insertion ordered, so the first value is the oldest."""
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def push(
        self,
        payload: P,
        *,
        length: int,
        kind: Hashable = None,
        is_dropped: Callable[[], bool] | None = None,
    ) -> Entry[P]:
        entry = Entry(
            length=max(1, length),
            kind=kind,
            payload=payload,
            is_dropped=is_dropped or (lambda: False),
            enqueued_at=self.clock(),
            seq=next(self._seq),
        )
        self._entries[entry.seq] = entry
        return entry

    def drain(self) -> list[Entry[P]]:
        """Remove and return every waiting entry (shutdown)."""
        out = list(self._entries.values())
        self._entries.clear()
        return out

    def _drop_gone(self) -> list[Entry[P]]:
        gone = [e for e in self._entries.values() if e.is_dropped()]
        for e in gone:
            del self._entries[e.seq]
        return gone

    def _cap(self) -> int:
        return self.max_batch_requests if self.max_batch_requests is not None else 1 << 62

    def next_batch(self) -> Taken[P]:
        dropped = self._drop_gone()
        if not self._entries:
            return Taken(None, dropped)
        now = self.clock()
        anchor = next(iter(self._entries.values()))
        same = [e for e in self._entries.values() if e.kind == anchor.kind]
        if now - anchor.enqueued_at >= self.max_wait:
            chosen = self._fifo(same)
        else:
            chosen = self._by_length(same, anchor)
        for e in chosen:
            del self._entries[e.seq]
        chosen.sort(key=lambda e: e.seq)
        max_length = max(e.length for e in chosen)
        batch = Batch(
            kind=anchor.kind,
            entries=chosen,
            max_length=max_length,
            padded_tokens=max_length * len(chosen),
            created_at=now,
        )
        return Taken(batch, dropped)

    def _fifo(self, same: list[Entry[P]]) -> list[Entry[P]]:
        cap = self._cap()
        chosen: list[Entry[P]] = []
        max_len = 0
        for e in same:
            new_max = max(max_len, e.length)
            if chosen and (new_max * (len(chosen) + 1) > self.max_batch_tokens
                           or len(chosen) >= cap):
                break
            chosen.append(e)
            max_len = new_max
        return chosen

    def _by_length(self, same: list[Entry[P]], anchor: Entry[P]) -> list[Entry[P]]:
        ordered = sorted(same, key=lambda e: (e.length, e.seq))
        lengths = [e.length for e in ordered]
        a = ordered.index(anchor)
        cap = self._cap()
        prefix = list(itertools.accumulate(lengths, initial=0))
        best_i, best_j, best_key = a, a, (1, -0)
        # j is the longest entry of the run (its length is the padded length); the run is
        # [i, j] with i <= a <= j and as many entries as fit before j. Most entries wins;
        # among those, the least padding (max_len x n - real tokens).
        for j in range(a, len(ordered)):
            fit = min(self.max_batch_tokens // lengths[j], cap)
            if fit < 1:
                break  # over budget on its own (the anchor then goes out alone)
            i = max(0, j - fit + 1)
            if i > a:
                break  # the run can no longer include the anchor; longer j only fit fewer
            n = j - i + 1
            key = (n, -(lengths[j] * n - (prefix[j + 1] - prefix[i])))
            if key > best_key or (best_i, best_j) == (a, a):
                best_i, best_j, best_key = i, j, key
        return ordered[best_i : best_j + 1]
