"""bench.attention's graphs compute the attention they claim to, at a toy shape.

Each variant's ONNX graph runs on onnxruntime's CPU provider and is compared with the numpy
reference on the real (non-padding) positions of a batch whose second row is left-padded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# `bench` is not installed, and tests/ (on sys.path through its conftest) holds a `bench`
# folder of its own that would otherwise be imported as a namespace package in its place.
REPO = str(Path(__file__).resolve().parents[3])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
if getattr(sys.modules.get("bench"), "__file__", None) is None:
    sys.modules.pop("bench", None)

from bench.attention import (  # noqa: E402
    VARIANTS,
    Batch,
    Dims,
    Variant,
    make_batch,
    make_session,
    max_abs_diff_on_real,
    reference,
    run_output,
)

TOY = Dims(heads=4, kv_heads=2, head_dim=8)
LEFT_PADDED = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=np.int64)
UNPADDED = np.ones_like(LEFT_PADDED)
TOLERANCE = 1e-4


def _diff(variant: Variant, batch: Batch) -> float:
    # The pinned onnxruntime has every op measured: one failing to load is a failure here.
    session = make_session(variant.build(TOY), threads=1)
    return max_abs_diff_on_real(run_output(session, variant.feeds(batch)), batch, TOY)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.timed_padded], ids=lambda v: v.key)
def test_variant_matches_reference_on_left_padded_batch(variant: Variant) -> None:
    assert _diff(variant, make_batch(TOY, LEFT_PADDED)) <= TOLERANCE


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.key)
def test_variant_matches_reference_unpadded(variant: Variant) -> None:
    assert _diff(variant, make_batch(TOY, UNPADDED)) <= TOLERANCE


def test_gqa_seqlens_takes_left_padding_for_right_padding() -> None:
    """What the module docstring says about GroupQueryAttention's own padding contract."""
    (variant,) = [v for v in VARIANTS if not v.timed_padded]
    assert _diff(variant, make_batch(TOY, LEFT_PADDED)) > 0.1


def test_padding_changes_the_reference() -> None:
    """The padded row's real positions differ from what they would be if the padding were
    attended to, so a graph that ignored the mask could not pass the tests above."""
    padded = make_batch(TOY, LEFT_PADDED)
    ignoring_padding = Batch(padded.query, padded.key, padded.value, UNPADDED)
    real = LEFT_PADDED == 1
    gap = np.abs(reference(padded, TOY)[real] - reference(ignoring_padding, TOY)[real]).max()
    assert gap > 0.1


def test_reference_is_softmax_attention_for_one_token() -> None:
    """A single real token attends only to itself: the output is its own value, repeated
    over each group of query heads."""
    mask = np.array([[0, 0, 0, 0, 1]], dtype=np.int64)
    batch = make_batch(TOY, mask)
    value = batch.value[0, -1].reshape(TOY.kv_heads, TOY.head_dim)
    expected = np.repeat(value, TOY.group, axis=0).reshape(-1)
    np.testing.assert_allclose(reference(batch, TOY)[0, -1], expected, atol=1e-6)
