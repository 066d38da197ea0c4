"""Folders saved by the pinned sentence-transformers itself, not written by hand: 6.x names its
modules by class path (`sentence_transformers.base.modules.dense.Dense`), writes one
`pooling_mode` key, and keeps the length limit only in tokenizer_config.json. The export must
read all of it and return what `SentenceTransformer.encode` returns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from support.parity_inputs import cosines
from support.tiny_models import build_checkpoint
from tei_runtime.manifest import Pooling, Precision

pytestmark = pytest.mark.slow

LIMIT = 24
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog",
         " ".join(["many words go past the limit of the model"] * 6)]  # fmt: skip


@pytest.mark.parametrize(("family", "mode", "pooling"), [
    ("bert", "mean", Pooling.MEAN), ("qwen3", "lasttoken", Pooling.LAST_TOKEN),
])  # fmt: skip
def test_a_folder_saved_by_sentence_transformers_6(
    tmp_path: Path, family: str, mode: str, pooling: Pooling
) -> None:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Transformer,
    )
    from sentence_transformers.sentence_transformer.modules import Pooling as StPooling

    import tei_runtime
    from tei_export.api import export_model

    base = build_checkpoint(tmp_path / "base", family)
    transformer = Transformer(str(base), max_seq_length=LIMIT)
    torch.manual_seed(3)
    modules = [transformer, StPooling(32, pooling_mode=mode),
               Dense(32, 16, activation_function=torch.nn.Tanh()), Normalize()]  # fmt: skip
    prompts = {"query": "query: ", "passage": "passage: "}
    saved = tmp_path / "st6"
    SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name="query",
                        device="cpu").save(str(saved))  # fmt: skip
    # What this test is about: the layout 6.x writes.
    types = [m["type"] for m in json.loads((saved / "modules.json").read_text())]
    assert not any(t.endswith(("models.Pooling", "models.Dense")) for t in types), types
    assert "pooling_mode" in json.loads((saved / "1_Pooling" / "config.json").read_text())

    artifact = export_model(str(saved), tmp_path / "art", quiet=True,
                            precisions=[Precision.FP32])  # fmt: skip
    model = tei_runtime.load(artifact, device="cpu")
    manifest = model.manifest
    assert (manifest.pooling, manifest.normalize, manifest.max_input_length) == (
        pooling, True, LIMIT)
    assert model.dimension == 16

    reference = SentenceTransformer(str(saved), device="cpu")
    for prompt_name in ("query", "passage"):
        expected = np.concatenate([reference.encode([t], prompt_name=prompt_name) for t in TEXTS])
        got = model.embed(TEXTS, prompt_name=prompt_name)
        assert cosines(got, expected).min() >= 0.99999, prompt_name
    # The default prompt is sentence-transformers' default too.
    default = np.concatenate([reference.encode([t]) for t in TEXTS])
    assert cosines(model.embed(TEXTS), default).min() >= 0.99999
