"""Cards for architectures that exist only as a checkpoint's own code."""

from __future__ import annotations

from tei_export.cards import find_card


def test_remote_code_architecture_is_matched_before_the_borrowed_model_type() -> None:
    # jina-embeddings-v2's config.json says model_type "bert" and ships JinaBERT's code.
    assert find_card("bert", "JinaBertForMaskedLM", remote_code=True).family == "jina_bert"
    assert find_card("bert", "JinaBertForMaskedLM").family == "bert"
    assert find_card("bert", "BertModel", remote_code=True).family == "bert"
