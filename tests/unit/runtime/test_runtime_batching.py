from __future__ import annotations

import pytest

from tei_runtime.batching import pack


def test_pack_respects_budget_and_covers_every_index_once() -> None:
    lengths = [5, 1, 9, 3, 3, 7, 2, 8]
    batches = pack(lengths, budget=16)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 16


def test_pack_sorts_by_length() -> None:
    batches = pack([9, 1, 5], budget=100)
    assert batches == [[1, 2, 0]]


def test_entry_over_budget_runs_alone_and_empty_entries_count_as_one() -> None:
    assert pack([50, 2], budget=10) == [[1], [0]]
    assert pack([0, 0, 0], budget=2) == [[0, 1], [2]]
    assert pack([], budget=8) == []


def test_pack_rejects_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="budget"):
        pack([1], budget=0)


def test_pack_caps_rows() -> None:
    assert pack([1] * 5, budget=100, max_rows=2) == [[0, 1], [2, 3], [4]]
