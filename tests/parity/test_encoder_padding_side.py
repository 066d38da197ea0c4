"""An encoder whose tokenizer pads on the left (a valid tokenizer_config.json setting) exports
and matches sentence-transformers: its batches pad on the right, which the fused Attention's
mask and the validation's reference are written for, with a note saying so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tei_runtime
from support.tiny_models import build_checkpoint

pytestmark = pytest.mark.slow

TEXTS = ["hello world", "the cat sat on the mat with the dog", "red", "blue green red blue"]


@pytest.mark.parametrize("model_type", ["bert", "xlm-roberta"])
def test_a_left_padding_tokenizer_on_an_encoder(tmp_path: Path, model_type: str) -> None:
    from sentence_transformers import SentenceTransformer

    checkpoint = build_checkpoint(tmp_path / "ck", model_type, st_pooling="mean")
    config = checkpoint / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "padding_side": "left"}))
    out = tmp_path / "artifact"
    run = subprocess.run(
        [sys.executable, "-m", "tei_export", str(checkpoint), str(out), "--variants", "fp32"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "batches pad on the right" in run.stdout + run.stderr
    model = tei_runtime.load(out, device="cpu")
    assert model.manifest.padding_side == "right"
    reference = SentenceTransformer(str(checkpoint), device="cpu")
    # one text at a time: no padding at all on the reference's side
    expected = np.stack([reference.encode([t], normalize_embeddings=True)[0] for t in TEXTS])
    got = model.embed(TEXTS)
    cosine = (got * expected).sum(axis=1)
    assert cosine.min() > 0.99999, cosine


def test_do_lower_case_over_a_cased_tokenizer_is_a_note(tmp_path: Path) -> None:
    """sentence-transformers lowercases first where sentence_bert_config.json says so; the
    artifact (as TEI) does not, and the export says so where tokenizer.json keeps case."""
    checkpoint = build_checkpoint(tmp_path / "ck", "bert", st_pooling="mean")
    tokenizer = checkpoint / "tokenizer.json"
    data = json.loads(tokenizer.read_text())
    data["normalizer"] = None  # cased
    tokenizer.write_text(json.dumps(data))
    (checkpoint / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 64, "do_lower_case": True})
    )
    run = subprocess.run(
        [sys.executable, "-m", "tei_export", str(checkpoint), str(tmp_path / "out"),
         "--variants", "fp32"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sets do_lower_case but tokenizer.json keeps case" in run.stdout + run.stderr
