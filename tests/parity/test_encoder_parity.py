"""The encoder families transformers 5 added natively (nomic_bert, gte, eurobert,
jina_embeddings_v3): a tiny random checkpoint of each, exported and run through tei_runtime,
against sentence-transformers (embedders) or transformers (heads) on unpadded input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from support.loopback_server import served_embeddings, served_logits
from support.parity_inputs import DTYPES, MIN_COSINE, PAIRS, TEXTS, cosines
from support.tiny_encoders import ENCODERS, build_encoder
from tei_export.cards import find_card
from tei_runtime.manifest import Precision, Task, read_manifest

pytestmark = pytest.mark.slow



def export(checkpoint: Path, out: Path, **options: object) -> Path:
    from tei_export.api import export_model

    return export_model(str(checkpoint), out, quiet=True, **options)  # type: ignore[arg-type]


def check_manifest(artifact: Path, task: Task) -> None:
    """Every variant validated above its tolerance; fp32/fp16 reach the card's fused counts."""
    manifest = read_manifest(artifact)
    assert manifest.task is task
    assert {v.precision for v in manifest.variants} == set(Precision)
    card = find_card(manifest.model_type, manifest.architecture)
    assert card.fusion.attention_unfused_reason
    for variant in manifest.variants:
        assert variant.validation.min_cosine >= MIN_COSINE[variant.precision], variant.file
        if variant.precision is Precision.INT8:
            continue
        for op, per_layer in card.fusion.expected_per_layer.items():
            assert variant.fused_ops.get(op, 0) >= per_layer * 2, (variant.file, op)


def st_reference(checkpoint: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(checkpoint), device="cpu")
    return np.concatenate(
        [model.encode([t], normalize_embeddings=True, convert_to_numpy=True) for t in texts]
    )


def assert_embeds_like(artifact: Path, reference: np.ndarray) -> None:
    import tei_runtime

    for precision, dtype in DTYPES.items():
        got = tei_runtime.load(artifact, device="cpu", dtype=dtype).embed(TEXTS)
        found = cosines(got, reference)
        assert found.min() >= MIN_COSINE[precision], (dtype, found)
    served = served_embeddings(tei_runtime.load(artifact, device="cpu"), TEXTS)
    assert cosines(served, reference).min() >= MIN_COSINE[Precision.FP32], "served /embed"


@pytest.mark.parametrize("model_type", sorted(ENCODERS))
def test_encoder_embedder_matches_sentence_transformers(tmp_path: Path, model_type: str) -> None:
    pooling = find_card(model_type, "?").default_pooling.value
    checkpoint = build_encoder(tmp_path / "ck", model_type, st_pooling=pooling)
    artifact = export(checkpoint, tmp_path / "art")
    check_manifest(artifact, Task.EMBED)
    assert_embeds_like(artifact, st_reference(checkpoint, TEXTS))


@pytest.mark.parametrize(
    ("model_type", "labels"),
    [("gte", 1), ("eurobert", 3), ("nomic_bert", 1), ("nomic_bert", 2)],
)
def test_encoder_head_matches_transformers(tmp_path: Path, model_type: str, labels: int) -> None:
    import torch
    import transformers

    import tei_runtime

    checkpoint = build_encoder(
        tmp_path / "ck", model_type, head="sequence-classification", num_labels=labels
    )
    artifact = export(checkpoint, tmp_path / "art")
    check_manifest(artifact, Task.RERANK if labels == 1 else Task.CLASSIFY)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(checkpoint))
    inputs: list[tuple[str, str]] | list[str] = PAIRS if labels == 1 else TEXTS
    rows = []
    with torch.no_grad():
        for item in inputs:
            encoded = (tokenizer(*item, return_tensors="pt") if isinstance(item, tuple)
                       else tokenizer(item, return_tensors="pt"))
            rows.append(model.eval()(**encoded).logits[0].numpy())
    model = tei_runtime.load(artifact, device="cpu")
    got = model.predict(inputs, raw_scores=True)
    np.testing.assert_allclose(got, np.stack(rows), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(served_logits(model, inputs), np.stack(rows), atol=1e-4, rtol=1e-4)
