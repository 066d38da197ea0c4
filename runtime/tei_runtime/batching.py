"""Packing many inputs into padded batches under a token budget (for the high-level calls).

Sorting by length first keeps padding low; the padded cost of a batch is its longest entry
times its size, the same measure as the server's batcher.
"""

from __future__ import annotations

from collections.abc import Sequence


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
