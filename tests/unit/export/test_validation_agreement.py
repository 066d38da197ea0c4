"""validate.min_agreement: the one number a variant is held to, for vectors and for scores."""

from __future__ import annotations

import numpy as np
import pytest

from tei_export.validate import min_agreement


def _rows(*values: list[float]) -> np.ndarray:
    return np.array(values, np.float32)


def test_vectors_are_compared_row_by_row_and_the_worst_row_counts() -> None:
    reference = [_rows([1, 0, 0], [0, 1, 0]), _rows([0, 0, 2])]
    same_direction = [_rows([3, 0, 0], [0, 0.5, 0]), _rows([0, 0, 1])]
    assert min_agreement(same_direction, reference) == pytest.approx(1.0)
    one_row_off = [_rows([1, 0, 0], [1, 1, 0]), _rows([0, 0, 2])]
    assert min_agreement(one_row_off, reference) == pytest.approx(2**-0.5, rel=1e-6)


def test_an_offset_on_scores_that_share_a_sign_is_caught() -> None:
    # Reranker logits all negative, spread ~2: an uncentred cosine of the int8 scores shifted
    # by 1.8 is 0.98, which passed the old int8 bar; centred on the reference it is far off.
    reference = [_rows([-6.0]), _rows([-4.0]), _rows([-5.0], [-7.0], [-3.0], [-5.5])]
    shifted = [r + 1.8 for r in reference]
    flat_ref = np.concatenate([r.ravel() for r in reference])
    flat_got = flat_ref + 1.8
    uncentred = flat_ref @ flat_got / (np.linalg.norm(flat_ref) * np.linalg.norm(flat_got))
    assert uncentred > 0.98
    assert min_agreement(shifted, reference) < 0.8


def test_scores_of_single_row_batches_are_compared_across_batches_not_by_sign() -> None:
    reference = [_rows([1.0]), _rows([2.0]), _rows([3.0])]
    assert min_agreement([_rows([1.0]), _rows([2.0]), _rows([3.0])], reference) == pytest.approx(1)
    reordered = [_rows([3.0]), _rows([2.0]), _rows([1.0])]  # every sign right, ranking reversed
    assert min_agreement(reordered, reference) == pytest.approx(-1.0)
    small_noise = [_rows([1.01]), _rows([1.99]), _rows([3.0])]
    assert 0.999 < min_agreement(small_noise, reference) < 1.0


def test_constant_scores_fall_back_to_the_uncentred_cosine() -> None:
    reference = [_rows([0.25]), _rows([0.25], [0.25])]
    assert min_agreement([_rows([0.25]), _rows([0.25], [0.25])], reference) == pytest.approx(1)
    assert min_agreement([_rows([-0.25]), _rows([-0.25], [-0.25])], reference) < 0
