"""A tokenizer whose ids run past the model's embedding table is refused at export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import processors

from support.tiny_models import build_tokenizer
from support.tiny_rerankers import build_qwen_tokenizer
from tei_export.errors import ExportError
from tei_export.tokenizer_json import TOKENIZER_JSON, check_fits_vocabulary


def test_ids_past_the_embedding_table_are_refused(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(decoder=False)
    tokenizer.save(str(tmp_path / TOKENIZER_JSON))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert check_fits_vocabulary(tmp_path, size) == []  # ids 0 .. size-1: each has a row
    assert check_fits_vocabulary(tmp_path, None) == []  # no vocab_size: nothing to check
    with pytest.raises(ExportError, match=rf"gives ids up to {size - 1} .*vocab_size is 40"):
        check_fits_vocabulary(tmp_path, 40)


def test_added_tokens_past_the_table_are_a_note_unless_every_text_gets_one(
    tmp_path: Path,
) -> None:
    """A Qwen-style tokenizer's `<|endoftext|>` past a small table is a note (only a text
    that spells it out reaches it); a special token framing every text is an error."""
    qwen = build_qwen_tokenizer()
    qwen.save(str(tmp_path / TOKENIZER_JSON))
    base = qwen.get_vocab_size(with_added_tokens=False)
    assert qwen.get_vocab_size(with_added_tokens=True) > base
    [note] = check_fits_vocabulary(tmp_path, base)
    assert note.startswith(f"added tokens past config.json's vocab_size {base} (")
    # the same added token appended to every text: each text reaches past the table
    qwen.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos := qwen.token_to_id(
            "<|endoftext|>"))],
    )
    qwen.save(str(tmp_path / TOKENIZER_JSON))
    with pytest.raises(ExportError, match=rf"gives ids up to {eos} \('<\|endoftext\|>'\)"):
        check_fits_vocabulary(tmp_path, base)


def test_lowercases_reads_the_normalizer(tmp_path: Path) -> None:
    """sentence-transformers' do_lower_case adds nothing where tokenizer.json lowercases."""
    from tei_export.tokenizer_json import lowercases

    cases = {
        "bert-uncased": ({"type": "BertNormalizer", "lowercase": True}, True),
        "bert-cased": ({"type": "BertNormalizer", "lowercase": False}, False),
        "sequence": ({"type": "Sequence", "normalizers": [{"type": "NFD"},
                                                          {"type": "Lowercase"}]}, True),
        "none": (None, False),
    }  # fmt: skip
    for name, (normalizer, expected) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps({"normalizer": normalizer}))
        assert lowercases(folder) is expected, name
    assert lowercases(tmp_path / "missing") is False
