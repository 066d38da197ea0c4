"""What every parity test feeds an exported model, and the bars it must clear."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tei_runtime.manifest import Precision

TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "grüße aus köln, ça va? ñandú",
    "a" * 3 + " b" * 40,
    "numbers 1234567890 and punctuation !?;:",
]
PAIRS = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3]), (TEXTS[4], TEXTS[1])]
# Against unpadded PyTorch / sentence-transformers (the issue's bars, the cards' tolerances).
MIN_COSINE = {Precision.FP32: 0.99999, Precision.FP16: 0.999, Precision.INT8: 0.98}
DTYPES = {Precision.FP32: "float32", Precision.FP16: "float16", Precision.INT8: "int8"}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, dim] arrays."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.asarray((a * b).sum(-1))


def prefixed_mean_reference(
    checkpoint: Path, model: Any, prefix: str, texts: Sequence[str] = TEXTS
) -> np.ndarray:
    """A PyTorch model on `prefix + text`, one unpadded text at a time, mean-pooled and
    normalised: the reference for an artifact whose default prompt is `prefix`."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    rows = []
    with torch.no_grad():
        for text in texts:
            tokens = model(**tokenizer(prefix + text, return_tensors="pt")).last_hidden_state[0]
            vector = tokens.mean(dim=0)
            rows.append((vector / vector.norm()).numpy())
    return np.stack(rows)
