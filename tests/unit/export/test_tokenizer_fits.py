"""A tokenizer whose ids run past the model's embedding table is refused at export."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.tiny_models import build_tokenizer
from tei_export.errors import ExportError
from tei_export.tokenizer_json import TOKENIZER_JSON, check_fits_vocabulary


def test_ids_past_the_embedding_table_are_refused(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(decoder=False)
    tokenizer.save(str(tmp_path / TOKENIZER_JSON))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    check_fits_vocabulary(tmp_path, size)  # ids 0 .. size-1: each has a row
    check_fits_vocabulary(tmp_path, None)  # a config without vocab_size: nothing to check
    with pytest.raises(ExportError, match=rf"gives ids up to {size - 1} .*vocab_size is 40"):
        check_fits_vocabulary(tmp_path, 40)
