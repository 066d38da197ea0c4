"""JinaBERT-style checkpoints that exist only as their own modeling code (auto_map): refused
without --trust-remote-code, exported with it and matched against that code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.loopback_server import served_embeddings, served_logits
from support.parity_inputs import DTYPES, MIN_COSINE, PAIRS, TEXTS, cosines
from support.tiny_encoders import build_remote_code_checkpoint
from tei_export.errors import ExportError
from tei_runtime.manifest import Precision, Task, read_manifest

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_remote_code_checkpoint(tmp_path_factory.mktemp("remote") / "jina")


def _own_code(checkpoint: Path, auto_class: Any) -> Any:
    """The checkpoint's own code, built the ordinary way (no meta-device loading) through
    `auto_class` and given its weights strictly."""
    import transformers
    from safetensors.torch import load_file

    config = transformers.AutoConfig.from_pretrained(str(checkpoint), trust_remote_code=True)
    model = auto_class.from_config(config, trust_remote_code=True).eval()
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=True)
    return model


def _reference(checkpoint: Path) -> np.ndarray:
    """The checkpoint's own code on one unpadded text at a time; mean-pooled, normalised."""
    import torch
    import transformers

    model = _own_code(checkpoint, transformers.AutoModel)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            vector = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(0)
            rows.append((vector / vector.norm()).numpy())
    return np.stack(rows)


def test_remote_code_is_refused_without_the_flag(checkpoint: Path, tmp_path: Path) -> None:
    from tei_export.api import export_model

    out = tmp_path / "art"
    with pytest.raises(ExportError) as refused:
        export_model(str(checkpoint), out, quiet=True)
    message = str(refused.value)
    assert "\n" not in message
    assert "--trust-remote-code" in message
    assert "JinaBertForMaskedLM" in message
    assert not out.exists()


def test_remote_code_exports_with_the_flag(checkpoint: Path, tmp_path: Path) -> None:
    import tei_runtime
    from tei_export.api import export_model

    assert "auto_map" in json.loads((checkpoint / "config.json").read_text())
    artifact = export_model(str(checkpoint), tmp_path / "art", quiet=True, trust_remote_code=True)
    manifest = read_manifest(artifact)
    assert (manifest.task, manifest.card) == (Task.EMBED, "jina_bert")
    for variant in manifest.variants:
        assert variant.validation.min_cosine >= MIN_COSINE[variant.precision], variant.file
        if variant.precision is not Precision.INT8:
            assert variant.fused_ops.get("LayerNormalization", 0) >= 4, variant.file
    reference = _reference(checkpoint)
    for precision, dtype in DTYPES.items():
        got = tei_runtime.load(artifact, device="cpu", dtype=dtype).embed(TEXTS)
        found = cosines(got, reference)
        assert found.min() >= MIN_COSINE[precision], (dtype, found)
    served = served_embeddings(tei_runtime.load(artifact, device="cpu"), TEXTS)
    assert cosines(served, reference).min() >= MIN_COSINE[Precision.FP32], "served /embed"


def test_remote_code_reranker_head_matches_its_code(tmp_path: Path) -> None:
    """jina-reranker-v1-* publishes JinaBertForSequenceClassification with one logit: a rerank
    artifact whose raw scores are the remote code's logits on each unpadded pair."""
    import torch
    import transformers

    import tei_runtime
    from tei_export.api import export_model

    checkpoint = build_remote_code_checkpoint(tmp_path / "ck", st_pooling=None, reranker=True)
    artifact = export_model(str(checkpoint), tmp_path / "art", quiet=True, trust_remote_code=True)
    manifest = read_manifest(artifact)
    assert (manifest.task, manifest.card) == (Task.RERANK, "jina_bert")
    for variant in manifest.variants:
        assert variant.validation.min_cosine >= MIN_COSINE[variant.precision], variant.file

    model = _own_code(checkpoint, transformers.AutoModelForSequenceClassification)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    with torch.no_grad():
        expected = np.stack([
            model(**tokenizer(query, text, return_tensors="pt")).logits[0].numpy()
            for query, text in PAIRS
        ])
    served = tei_runtime.load(artifact, device="cpu")
    np.testing.assert_allclose(
        served.predict(PAIRS, raw_scores=True), expected, atol=1e-4, rtol=1e-4
    )
    np.testing.assert_allclose(served_logits(served, PAIRS), expected, atol=1e-4, rtol=1e-4)
