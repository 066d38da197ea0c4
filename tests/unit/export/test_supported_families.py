"""An unsupported architecture's error names every supported family and its model_type."""

from __future__ import annotations

import pytest

from tei_export.cards import CardError, find_card, load_cards
from tei_export.cli import parser


def test_error_lists_every_family_and_model_type() -> None:
    with pytest.raises(CardError) as info:
        find_card("gpt2", "GPT2Model")
    message = str(info.value)
    assert message.startswith("unsupported architecture GPT2Model (model_type 'gpt2')")
    for card in load_cards():
        assert card.family in message
        for model_type in card.model_types:
            assert model_type in message
    assert "gemma3 (gemma3_text)" in message
    assert "modernbert_decoder (modernbert-decoder)" in message
    assert "llama" in message
    with pytest.raises(CardError, match=r"\(config\.json has no model_type, which "):
        find_card("", "BertModel")


def test_cli_help_lists_the_families() -> None:
    text = " ".join(parser().format_help().split())
    for card in load_cards():
        assert card.family in text

