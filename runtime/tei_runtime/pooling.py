"""Pooling, normalisation and score heads in pure numpy.

Every function takes the attention mask rather than assuming a padding side, so the same
code is right for right-padded encoders and left-padded decoders.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tei_runtime.data import SparseVector
from tei_runtime.errors import ValidationError
from tei_runtime.manifest import Pooling

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

# Keeps a zero vector (an input of no tokens) at zero instead of NaN.
_EPS = 1e-12


def first_token_index(mask: IntArray) -> IntArray:
    """Index of the first real token of each row (0 under right padding)."""
    index: IntArray = np.argmax(mask > 0, axis=1).astype(np.int64)
    return index


def last_token_index(mask: IntArray) -> IntArray:
    """Index of the last real token of each row (seq-1 under left padding)."""
    seq = mask.shape[1]
    index: IntArray = (seq - 1 - np.argmax(mask[:, ::-1] > 0, axis=1)).astype(np.int64)
    return index


def pool(token_embeddings: FloatArray, mask: IntArray, pooling: Pooling) -> FloatArray:
    """[batch, seq, hidden] + [batch, seq] mask -> [batch, hidden]."""
    if pooling is Pooling.MEAN:
        weights = mask.astype(np.float32)[:, :, None]
        summed = (token_embeddings * weights).sum(axis=1)
        counts = np.maximum(weights.sum(axis=1), 1.0)
        mean: FloatArray = (summed / counts).astype(np.float32)
        return mean
    rows = np.arange(token_embeddings.shape[0])
    if pooling is Pooling.CLS:
        return token_embeddings[rows, first_token_index(mask)].astype(np.float32)
    if pooling is Pooling.LAST_TOKEN:
        return token_embeddings[rows, last_token_index(mask)].astype(np.float32)
    if pooling is Pooling.SPLADE:
        # Graphs normally pool SPLADE themselves; this is the same reduction for ones that
        # expose per-token vocabulary logits as token_embeddings.
        activated = np.log1p(np.maximum(token_embeddings, 0.0))
        activated = np.where(mask[:, :, None] > 0, activated, 0.0)
        pooled: FloatArray = activated.max(axis=1).astype(np.float32)
        return pooled
    raise ValueError(f"unknown pooling {pooling!r}")


def normalize(vectors: FloatArray) -> FloatArray:
    """L2-normalise each row; an all-zero row stays zero."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit: FloatArray = (vectors / np.maximum(norms, _EPS)).astype(np.float32)
    return unit


def truncate_dimensions(vectors: FloatArray, dimensions: int | None) -> FloatArray:
    """Matryoshka truncation: keep the first `dimensions` columns (normalise afterwards)."""
    if dimensions is None:
        return vectors
    check_dimensions(dimensions, vectors.shape[-1])
    return np.ascontiguousarray(vectors[..., :dimensions])


def check_dimensions(dimensions: int, width: int) -> None:
    """Raise ValidationError unless `dimensions` can truncate vectors `width` wide."""
    if isinstance(dimensions, bool) or not isinstance(dimensions, int | np.integer):
        raise ValidationError(f"`dimensions` must be an integer; got {dimensions!r}")
    # TEI's texts, so a served error reads as TEI's.
    if dimensions <= 0:
        raise ValidationError("`dimensions` should be positive")
    if dimensions > width:
        raise ValidationError(
            "`dimensions` should be smaller than the maximum embedding dimension."
        )


def cosine_similarity(source: FloatArray, others: FloatArray) -> FloatArray:
    """Cosine of `source` [dim] with each row of `others` [n, dim]; 0 against a zero vector."""
    unit_source = normalize(source[None, :].astype(np.float32, copy=False))[0]
    cosines: FloatArray = normalize(others.astype(np.float32, copy=False)) @ unit_source
    return cosines


def sigmoid(logits: FloatArray) -> FloatArray:
    # Split by sign so that exp never overflows.
    out = np.empty_like(logits, dtype=np.float32)
    pos = logits >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-logits[pos]))
    exp = np.exp(logits[~pos])
    out[~pos] = exp / (1.0 + exp)
    return out


def softmax(logits: FloatArray) -> FloatArray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    probs: FloatArray = (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)
    return probs


def scores(logits: FloatArray, *, raw_scores: bool = False) -> FloatArray:
    """TEI's predict scores: sigmoid for one label, softmax over several, or the raw logits."""
    logits = logits.astype(np.float32, copy=False)
    if raw_scores:
        return logits
    if logits.shape[-1] == 1:
        return sigmoid(logits)
    return softmax(logits)


def to_sparse(dense: FloatArray) -> list[SparseVector]:
    """Rows of a [n, vocab] SPLADE matrix as their non-zero (index, value) entries."""
    vectors: list[SparseVector] = []
    for row in dense:
        indices = np.flatnonzero(row > 0)
        vectors.append(
            SparseVector(indices=indices.tolist(), values=row[indices].astype(float).tolist())
        )
    return vectors
