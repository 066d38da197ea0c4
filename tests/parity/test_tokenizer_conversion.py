"""A checkpoint that ships only a Python tokenizer's files (BERT's vocab.txt, as older hub
models do) exports with the tokenizer.json transformers converts from them, matching
sentence-transformers on the same folder; the folder itself is left as it was. The same for a
sentencepiece model (XLM-R's sentencepiece.bpe.model), trained here on a few sentences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from support.parity_inputs import cosines
from support.tiny_models import build_checkpoint, build_tokenizer
from tei_runtime.manifest import Precision

pytestmark = pytest.mark.slow

TEXTS = ["hello", "The quick brown fox, 42 times!", "ÄÖÜ café naïve", "a " * 40]


def _legacy(folder: Path) -> Path:
    """The checkpoint with tokenizer.json replaced by vocab.txt and a BertTokenizer config."""
    (folder / "tokenizer.json").unlink()
    vocab = build_tokenizer(decoder=False).get_vocab()
    (folder / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.__getitem__)) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 120}))
    return folder


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_vocab_txt_only_checkpoint_exports_with_a_converted_tokenizer(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    import tei_runtime
    from tei_export.api import export_model

    legacy = _legacy(build_checkpoint(tmp_path / "legacy", "bert", st_pooling="mean"))
    before = sorted(p.name for p in legacy.iterdir())
    out = tmp_path / "out"
    out.mkdir()
    artifact = export_model(str(legacy), out / "art", quiet=True, precisions=[Precision.FP32])

    assert (artifact / "tokenizer.json").is_file()
    assert sorted(p.name for p in legacy.iterdir()) == before  # the source is untouched
    assert _leftovers(out) == []  # the staged copy is gone
    reference = SentenceTransformer(str(legacy), device="cpu")
    expected = np.concatenate([reference.encode([t]) for t in TEXTS])
    got = tei_runtime.load(artifact, device="cpu").embed(TEXTS)
    assert cosines(got, expected).min() >= 0.99999


def _sentencepiece_xlmr(folder: Path) -> Path:
    """The checkpoint with tokenizer.json replaced by a sentencepiece model, as XLM-R ships."""
    import sentencepiece

    (folder / "tokenizer.json").unlink()
    corpus = folder.parent / "corpus.txt"
    corpus.write_text("\n".join(["the quick brown fox jumps over the lazy dog"] * 40
                                + ["café naïve über straße, 42 times!"] * 20))  # fmt: skip
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder.parent / "sp"), vocab_size=40,
        model_type="unigram", minloglevel=2,
    )  # fmt: skip
    (folder.parent / "sp.model").rename(folder / "sentencepiece.bpe.model")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 120}))
    config = json.loads((folder / "config.json").read_text())
    # XLM-R's special ids: <s> 0, <pad> 1, </s> 2 (positions count from the pad id)
    config.update(bos_token_id=0, pad_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_sentencepiece_only_checkpoint_exports_with_a_converted_tokenizer(
    tmp_path: Path,
) -> None:
    from sentence_transformers import SentenceTransformer

    import tei_runtime
    from tei_export.api import export_model

    spm = _sentencepiece_xlmr(
        build_checkpoint(tmp_path / "spm", "xlm-roberta", st_pooling="mean"))
    out = tmp_path / "out"
    out.mkdir()
    artifact = export_model(str(spm), out / "art", quiet=True, precisions=[Precision.FP32])
    reference = SentenceTransformer(str(spm), device="cpu")
    expected = np.concatenate([reference.encode([t]) for t in TEXTS])
    got = tei_runtime.load(artifact, device="cpu").embed(TEXTS)
    assert cosines(got, expected).min() >= 0.99999


def test_no_tokenizer_files_at_all_is_one_clear_error(tmp_path: Path) -> None:
    from tei_export.api import export_model
    from tei_export.errors import ExportError

    folder = build_checkpoint(tmp_path / "bare", "bert")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ExportError, match=r"no tokenizer\.json and no vocabulary file"):
        export_model(str(folder), out / "art", quiet=True, precisions=[Precision.FP32])
    assert _leftovers(out) == [] and not (out / "art").exists()
