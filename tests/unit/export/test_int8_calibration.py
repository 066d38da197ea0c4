"""The calibration texts and how a graph's outputs become one vector per text."""

from __future__ import annotations

import unicodedata

import numpy as np

from tei_export.calibration import calibration_texts
from tei_export.precision import text_vectors


def test_calibration_texts_are_varied() -> None:
    texts = calibration_texts()
    assert len(texts) == len(set(texts)) >= 50
    lengths = sorted(len(t.split()) for t in texts)
    assert lengths[0] <= 2 and lengths[-1] >= 300  # one-word queries to past 256 tokens
    scripts = {
        unicodedata.name(ch).split()[0]
        for t in texts
        for ch in t
        if ch.isalpha() and not ch.isascii()
    }
    assert {"CJK", "HIRAGANA", "HANGUL", "CYRILLIC", "ARABIC", "LATIN"} <= scripts


def test_text_vectors_average_tokens_and_keep_scores_a_row_each() -> None:
    tokens = [np.ones((1, 3, 4), np.float32), np.arange(8, dtype=np.float32).reshape(1, 2, 4)]
    np.testing.assert_allclose(text_vectors(tokens), [[1, 1, 1, 1], [2, 3, 4, 5]])
    pooled = [np.full((1, 4), 2.0, np.float32)]
    np.testing.assert_allclose(text_vectors(pooled), [[2, 2, 2, 2]])
    scores = [np.array([[0.5]], np.float32), np.array([[-1.0]], np.float32)]
    assert text_vectors(scores).shape == (2, 1)  # min_agreement joins single scores
