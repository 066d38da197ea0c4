"""Generative rerankers in the plan: when a causal LM becomes one, and its prompt's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.tiny_rerankers import build_qwen_tokenizer
from tei_export.cards import Head
from tei_export.checkpoint import read_checkpoint
from tei_export.errors import ExportError
from tei_export.plan import is_generative_reranker, make_plan
from tei_runtime.manifest import Task


def _causal_lm(
    root: Path, model_type: str = "qwen3", architecture: str = "Qwen3ForCausalLM"
) -> Path:
    root.mkdir(parents=True)
    config = {"model_type": model_type, "architectures": [architecture], "hidden_size": 64,
              "num_attention_heads": 4, "num_hidden_layers": 2, "max_position_embeddings": 512}
    (root / "config.json").write_text(json.dumps(config))
    build_qwen_tokenizer().save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"padding_side": "left"}))
    return root


def test_only_an_explicit_rerank_task_makes_a_causal_lm_a_generative_reranker() -> None:
    assert is_generative_reranker("Qwen3ForCausalLM", Task.RERANK)
    assert not is_generative_reranker("Qwen3ForCausalLM", Task.EMBED)
    assert not is_generative_reranker("BertForSequenceClassification", Task.RERANK)


def test_causal_lm_without_task_still_embeds(tmp_path: Path) -> None:
    plan = make_plan(read_checkpoint(_causal_lm(tmp_path / "m")))
    assert plan.task is Task.EMBED and plan.head is Head.BASE
    assert plan.generative_rerank is None


def test_rerank_task_on_qwen3_causal_lm_plans_the_answer_head(tmp_path: Path) -> None:
    tokenizer = build_qwen_tokenizer()
    plan = make_plan(read_checkpoint(_causal_lm(tmp_path / "m")), task=Task.RERANK)
    assert plan.task is Task.RERANK and plan.head is Head.CAUSAL_LM
    assert plan.pooling is None and plan.outputs == ["logits"]
    assert plan.labels == {0: "yes"}
    assert plan.generative_rerank is not None
    prompt = plan.generative_rerank.prompt
    assert prompt.yes_token_id == tokenizer.token_to_id("yes")
    assert prompt.no_token_id == tokenizer.token_to_id("no")
    assert prompt.yes_token_id != prompt.no_token_id
    assert "{instruction}" in prompt.template and prompt.default_instruction


def test_rerank_task_on_a_family_without_a_reranker_prompt_names_those_with_one(
    tmp_path: Path,
) -> None:
    folder = _causal_lm(tmp_path / "m", "mistral", "MistralForCausalLM")
    with pytest.raises(ExportError, match=r"no generative reranker prompt .*qwen3"):
        make_plan(read_checkpoint(folder), task=Task.RERANK)


def test_answer_tokens_must_be_single_tokens(tmp_path: Path) -> None:
    folder = _causal_lm(tmp_path / "m")
    data = json.loads((folder / "tokenizer.json").read_text())
    del data["model"]["vocab"]["yes"]
    data["model"]["merges"] = [m for m in data["model"]["merges"] if m not in (["ye", "s"], "ye s")]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ExportError, match="answer token 'yes' is not in the vocabulary"):
        make_plan(read_checkpoint(folder), task=Task.RERANK)


def test_the_prompt_markers_must_be_single_tokens(tmp_path: Path) -> None:
    """A tokenizer without Qwen's ChatML markers would read the card's prompt as plain text."""
    folder = _causal_lm(tmp_path / "m")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|im_end|>"]
    data["model"]["vocab"].pop("<|im_end|>", None)
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ExportError, match=r"prompt token '<\|im_end\|>' is not in the vocabulary"):
        make_plan(read_checkpoint(folder), task=Task.RERANK)


def test_the_input_length_is_the_model_cards_where_positions_allow_more(tmp_path: Path) -> None:
    folder = _causal_lm(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40960}))
    assert make_plan(read_checkpoint(folder), task=Task.RERANK).max_input_length == 8192
    assert make_plan(read_checkpoint(folder)).max_input_length == 40960  # embedding: positions
