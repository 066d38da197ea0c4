"""Packing many inputs into padded batches under a token budget (for the high-level calls).

Sorting by length first keeps padding low; the padded cost of a batch is its longest entry
times its size, the same measure as the server's batcher.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class _Sized(Protocol):
    def __len__(self) -> int: ...


S = TypeVar("S", bound=_Sized)


def pack(lengths: Sequence[int], budget: int, *, max_rows: int | None = None) -> list[list[int]]:
    """Indices into `lengths`, grouped so that max_len * n <= budget for every batch.

    An entry longer than the budget on its own still gets a batch (of one). `max_rows` caps
    the entries per batch (TensorRT's profiles end at a batch size).
    """
    if budget <= 0:
        raise ValueError(f"batch token budget must be positive, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = max(lengths[i], 1)
        full = max_rows is not None and len(current) >= max_rows
        if current and (full or max(longest, length) * (len(current) + 1) > budget):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def run_packed(
    items: Sequence[S],
    forward: Callable[[Sequence[S]], Sequence[T]],
    budget: int,
    *,
    max_rows: int | None = None,
) -> list[T]:
    """`forward` over the `pack`ed batches of `items`; results in the order of `items`.

    No items: no call. One batch that holds everything is passed on as it is, in order.
    """
    groups = pack([len(i) for i in items], budget, max_rows=max_rows)
    if not groups:
        return []
    if len(groups) == 1:
        return list(forward(items))
    results: list[T | None] = [None] * len(items)
    for indices in groups:
        for i, value in zip(indices, forward([items[i] for i in indices]), strict=True):
            results[i] = value
    return [r for r in results if r is not None]
