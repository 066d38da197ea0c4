"""Decoder layouts beyond one checkpoint per card: EmbeddingGemma's bidirectional Gemma 3 (its
mask overlay is what transformers builds with vmap, which TorchScript cannot trace), exported
and served padded on either side, against sentence-transformers on unpadded texts."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest

from support.loopback_server import served_embeddings
from support.parity_inputs import cosines
from support.tiny_models import build_bidirectional_gemma3
from tei_runtime.manifest import MANIFEST_NAME, Precision, encode_manifest, read_manifest

pytestmark = pytest.mark.slow

TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "a" * 3 + " b" * 40,
    "numbers 1234567890 and punctuation !?;:",
]
MIN_COSINE = {"float32": 0.99999, "float16": 0.999, "int8": 0.98}


def test_bidirectional_gemma3_matches_sentence_transformers(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    import tei_runtime
    from tei_export.api import export_model

    checkpoint = build_bidirectional_gemma3(tmp_path / "ck", st_pooling="mean", dense_out=16)
    artifact = export_model(str(checkpoint), tmp_path / "art", quiet=True)
    manifest = read_manifest(artifact)
    assert {v.precision for v in manifest.variants} == set(Precision)
    st = SentenceTransformer(str(checkpoint), device="cpu")
    assert st[0].auto_model.config.use_bidirectional_attention
    reference = np.concatenate([st.encode([t], normalize_embeddings=True) for t in TEXTS])

    for side in ("left", "right"):
        padded = tmp_path / f"art-{side}"
        shutil.copytree(artifact, padded)
        (padded / MANIFEST_NAME).write_bytes(
            encode_manifest(msgspec.structs.replace(manifest, padding_side=side))
        )
        for dtype, minimum in MIN_COSINE.items():
            got = tei_runtime.load(padded, device="cpu", dtype=dtype).embed(TEXTS)
            assert got.shape == (len(TEXTS), 16)
            assert cosines(got, reference).min() >= minimum, (side, dtype)
        served = served_embeddings(tei_runtime.load(padded, device="cpu"), TEXTS)
        assert cosines(served, reference).min() >= MIN_COSINE["float32"], (side, "served")
