"""Decoder planning and validation grid: pure logic on JSON files, no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tei_export.checkpoint import read_checkpoint
from tei_export.plan import make_plan
from tei_export.validate import length_grid

DECODER_CONFIGS = {
    "qwen3": "Qwen3Model",
    "llama": "LlamaModel",
    "modernbert-decoder": "ModernBertDecoderModel",
}


def _folder(root: Path, config: dict[str, object], tokenizer_config: dict[str, object]) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text("{}")
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return root


def _decoder(root: Path, model_type: str, padding_side: str) -> Path:
    config = {"model_type": model_type, "architectures": [DECODER_CONFIGS[model_type]],
              "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "max_position_embeddings": 256}
    return _folder(root, config, {"padding_side": padding_side})


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_decoders_validate_the_padded_mix_on_both_sides(tmp_path: Path, padding_side: str) -> None:
    plan = make_plan(read_checkpoint(_decoder(tmp_path / "m", "qwen3", padding_side)))
    grid = length_grid(plan)
    padded = [batch for batch in grid if len(batch.lengths) > 1]
    assert {batch.padding_side for batch in padded} == {"left", "right"}
    assert all(b.padding_side == padding_side for b in grid if len(b.lengths) == 1)


def test_encoders_validate_their_own_padding_side_only(tmp_path: Path) -> None:
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64,
              "num_attention_heads": 4, "num_hidden_layers": 2, "max_position_embeddings": 256}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config, {})))
    assert {batch.padding_side for batch in length_grid(plan)} == {"right"}


@pytest.mark.parametrize("model_type", sorted(DECODER_CONFIGS))
def test_decoder_cards_take_position_ids_and_pool_the_last_token(
    tmp_path: Path, model_type: str
) -> None:
    plan = make_plan(read_checkpoint(_decoder(tmp_path / "m", model_type, "left")))
    assert plan.card.decoder
    assert plan.inputs == ["input_ids", "attention_mask", "position_ids"]
    assert plan.pooling is not None and plan.pooling.value == "last-token"
