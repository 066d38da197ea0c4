from __future__ import annotations

import pytest

from tei_runtime.packing import MIN_TOKENS_BEFORE_PADDING_CUT, Packing, length_sorted_groups


def test_pack_respects_budget_and_covers_every_index_once() -> None:
    lengths = [5, 1, 9, 3, 3, 7, 2, 8]
    batches = length_sorted_groups(lengths, Packing(budget=16))
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 16


def test_pack_sorts_by_length() -> None:
    batches = length_sorted_groups([9, 1, 5], Packing(budget=100))
    assert batches == [[1, 2, 0]]


def test_entry_over_budget_runs_alone_and_empty_entries_count_as_one() -> None:
    assert length_sorted_groups([50, 2], Packing(budget=10)) == [[1], [0]]
    assert length_sorted_groups([0, 0, 0], Packing(budget=2)) == [[0, 1], [2]]
    assert length_sorted_groups([], Packing(budget=8)) == []


def test_pack_rejects_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="budget"):
        length_sorted_groups([1], Packing(budget=0))


def test_pack_caps_rows() -> None:
    assert length_sorted_groups([1] * 5, Packing(budget=100, max_rows=2)) == [[0, 1], [2, 3], [4]]


def test_padding_cut_starts_a_new_piece_once_the_piece_is_big_enough() -> None:
    rule = Packing(budget=10_000, max_padding=0.1)
    # 40 real tokens of length 10, then a 30: padding would be 120 of 150 tokens.
    assert length_sorted_groups([10, 10, 10, 10, 30], rule) == [[0, 1, 2, 3], [4]]
    # 10% padding is allowed: 10 x 9 + 11 -> 11 x 10 = 110 tokens, 9 of them padding.
    assert length_sorted_groups([10] * 9 + [11], rule) == [list(range(10))]
    # Under MIN_TOKENS_BEFORE_PADDING_CUT real tokens nothing is cut for padding.
    short = [1] * (MIN_TOKENS_BEFORE_PADDING_CUT - 1) + [20]
    assert length_sorted_groups(short, rule) == [list(range(len(short)))]
    assert length_sorted_groups([10, 10, 10, 10, 30], Packing(budget=10_000)) == [[0, 1, 2, 3, 4]]


def test_padding_cut_keeps_budget_and_covers_every_index() -> None:
    lengths = [7, 200, 13, 13, 64, 90, 5, 31, 31, 32, 250, 8, 120]
    rule = Packing(budget=512, max_padding=0.1)
    batches = length_sorted_groups(lengths, rule)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert longest * len(b) <= 512 or len(b) == 1
        real = sum(lengths[i] for i in b[:-1])
        if len(b) > 1 and real >= MIN_TOKENS_BEFORE_PADDING_CUT:
            padded = longest * len(b)
            assert padded - sum(lengths[i] for i in b) <= 0.1 * padded
