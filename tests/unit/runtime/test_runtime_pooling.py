from __future__ import annotations

import numpy as np
import pytest

from tei_runtime import pooling
from tei_runtime.errors import ValidationError
from tei_runtime.manifest import Pooling


def _batch(left: bool) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(1)
    lengths = [3, 5, 1]
    width = 6
    seqs = [rng.normal(size=(n, 4)).astype(np.float32) for n in lengths]
    emb = rng.normal(size=(3, width, 4)).astype(np.float32)  # garbage in the padding
    mask = np.zeros((3, width), dtype=np.int64)
    for r, s in enumerate(seqs):
        cols = slice(width - len(s), width) if left else slice(0, len(s))
        emb[r, cols] = s
        mask[r, cols] = 1
    return emb, mask, seqs


@pytest.mark.parametrize("left", [False, True])
def test_pool_modes_match_numpy_under_both_paddings(left: bool) -> None:
    emb, mask, seqs = _batch(left)
    np.testing.assert_allclose(
        pooling.pool(emb, mask, Pooling.MEAN), [s.mean(axis=0) for s in seqs], atol=1e-6
    )
    np.testing.assert_allclose(pooling.pool(emb, mask, Pooling.CLS), [s[0] for s in seqs])
    np.testing.assert_allclose(pooling.pool(emb, mask, Pooling.LAST_TOKEN), [s[-1] for s in seqs])
    np.testing.assert_allclose(
        pooling.pool(emb, mask, Pooling.SPLADE),
        [np.log1p(np.maximum(s, 0)).max(axis=0) for s in seqs],
        atol=1e-6,
    )


def test_mean_of_an_empty_row_is_zero_not_nan() -> None:
    emb = np.ones((1, 2, 3), dtype=np.float32)
    out = pooling.pool(emb, np.zeros((1, 2), dtype=np.int64), Pooling.MEAN)
    assert np.all(out == 0)


def test_normalize_unit_rows_and_zero_row_stays_zero() -> None:
    v = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    out = pooling.normalize(v)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])
    assert out.dtype == np.float32


def test_matryoshka_slices_then_normalize() -> None:
    v = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    cut = pooling.truncate_dimensions(v, 2)
    np.testing.assert_allclose(pooling.normalize(cut), [[0.6, 0.8]])
    assert pooling.truncate_dimensions(v, None) is v


@pytest.mark.parametrize("dims", [0, -1, 4])
def test_matryoshka_rejects_bad_dimensions(dims: int) -> None:
    with pytest.raises(ValidationError, match="dimensions"):
        pooling.truncate_dimensions(np.zeros((1, 3), dtype=np.float32), dims)


def test_scores_sigmoid_softmax_raw() -> None:
    one = np.array([[0.0], [2.0], [-800.0]], dtype=np.float32)
    np.testing.assert_allclose(pooling.scores(one)[:2, 0], [0.5, 1 / (1 + np.exp(-2.0))])
    assert pooling.scores(one)[2, 0] == 0.0
    many = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, 0.0]], dtype=np.float32)
    e = np.exp(many[0] - many[0].max())
    np.testing.assert_allclose(pooling.scores(many)[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(pooling.scores(many)[1], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(pooling.scores(many, raw_scores=True), many)
    assert not np.isnan(pooling.scores(one)).any()


def test_to_sparse_keeps_positive_entries_in_order() -> None:
    dense = np.array([[0.0, 1.5, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    a, b = pooling.to_sparse(dense)
    assert a.indices == [1, 3] and a.values == [1.5, 0.25]
    assert b.indices == [] and b.values == []


def test_cosine_similarity_float32_and_zero_safe() -> None:
    source = np.asarray([3.0, 4.0], dtype=np.float32)
    others = np.asarray([[3.0, 4.0], [-4.0, 3.0], [0.0, 0.0], [-6.0, -8.0]], dtype=np.float32)
    cosines = pooling.cosine_similarity(source, others)
    assert cosines.dtype == np.float32
    assert np.allclose(cosines, [1.0, 0.0, 0.0, -1.0], atol=1e-6)
