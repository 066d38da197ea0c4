"""hub_layouts' pure mapping: published config keys and weight names -> native ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tei_export.errors import ExportError
from tei_export.hub_layouts import (
    LAYOUTS,
    detect,
    merge_lora,
    native_config,
    native_weight_names,
    read_adapters,
)

NOMIC = {
    "model_type": "nomic_bert", "architectures": ["NomicBertModel"], "auto_map": {},
    "activation_function": "swiglu", "vocab_size": 30528, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_inner": 3072, "n_positions": 8192, "type_vocab_size": 2,
    "layer_norm_epsilon": 1e-12, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False, "rotary_scaling_factor": None, "qkv_proj_bias": False,
    "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False,
}
GTE = {
    "model_type": "new", "architectures": ["NewModel"], "vocab_size": 30528,
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 8192,
    "type_vocab_size": 0, "rope_theta": 500000, "rope_scaling": {"type": "ntk", "factor": 2.0},
}


def test_detects_published_layouts_only() -> None:
    assert detect(NOMIC) is LAYOUTS["nomic_bert"]
    assert detect(GTE) is LAYOUTS["new"]
    # transformers' own nomic_bert config (hidden_size, no n_embd) needs no mapping.
    assert detect({"model_type": "nomic_bert", "hidden_size": 768}) is None
    assert detect({"model_type": "bert"}) is None


def test_nomic_config_keys_map_to_native_names() -> None:
    native = native_config(LAYOUTS["nomic_bert"], NOMIC)
    assert native["model_type"] == "nomic_bert"
    assert native["architectures"] == ["NomicBertModel"]
    assert (native["hidden_size"], native["num_attention_heads"], native["num_hidden_layers"],
            native["intermediate_size"], native["max_position_embeddings"]) == (
        768, 12, 12, 3072, 8192)
    assert native["hidden_act"] == "silu"
    assert native["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000.0}
    assert "auto_map" not in native


def test_gte_fixed_ntk_becomes_linear_scaling_of_the_scaled_base() -> None:
    rope = native_config(LAYOUTS["new"], GTE)["rope_parameters"]
    assert rope["rope_type"] == "linear"
    assert rope["rope_theta"] == 1_000_000.0
    assert rope["factor"] == pytest.approx(2.0 ** (2 / 64))


@pytest.mark.parametrize(
    ("layout", "config", "message"),
    [
        ("nomic_bert", {**NOMIC, "rotary_emb_fraction": 0.5}, "rotary_emb_fraction=0.5"),
        ("nomic_bert", {**NOMIC, "qkv_proj_bias": True}, "qkv_proj_bias=True"),
        ("nomic_bert", {k: v for k, v in NOMIC.items() if k != "n_inner"}, "'n_inner'"),
        ("nomic_bert", {**NOMIC, "moe_every_n_layers": 2, "num_experts": 8, "moe_top_k": 2},
         "mixture-of-experts layers .*nomic-embed-text-v2-moe cannot be exported"),
        ("new", {**GTE, "rope_scaling": {"type": "dynamic", "factor": 2}}, "rope_scaling"),
        ("new", {**GTE, "architectures": ["NewForTokenClassification"]},
         "NewForTokenClassification has no native mapping"),
    ],
)
def test_unmappable_config_is_named(layout: str, config: dict[str, object], message: str) -> None:
    with pytest.raises(ExportError, match=message):
        native_config(LAYOUTS[layout], config)


def test_weight_names_split_fused_projections_and_strip_prefixes() -> None:
    mapping = native_weight_names(
        LAYOUTS["new"],
        ["new.encoder.layer.3.attention.qkv_proj.bias",
         "new.encoder.layer.3.mlp.up_gate_proj.weight", "new.pooler.dense.weight",
         "classifier.weight", "new.embeddings.position_ids"],
        "GteForSequenceClassification",
    )
    assert mapping == {
        "new.encoder.layer.3.attention.qkv_proj.bias": [
            "gte.layers.3.self_attn.q_proj.bias", "gte.layers.3.self_attn.k_proj.bias",
            "gte.layers.3.self_attn.v_proj.bias"],
        "new.encoder.layer.3.mlp.up_gate_proj.weight": [
            "gte.layers.3.mlp.up_proj.weight", "gte.layers.3.mlp.gate_proj.weight"],
        "new.pooler.dense.weight": ["gte.pooler.dense.weight"],
        "classifier.weight": ["classifier.weight"],
    }


def test_base_model_drops_heads_it_does_not_have() -> None:
    mapping = native_weight_names(
        LAYOUTS["nomic_bert"],
        ["bert.emb_ln.weight", "cls.predictions.bias", "pooler.dense.weight"],
        "NomicBertModel",
    )
    assert mapping == {"bert.emb_ln.weight": ["embeddings.LayerNorm.weight"]}


def test_unknown_weight_is_named() -> None:
    with pytest.raises(ExportError, match=r"'encoder\.layers\.0\.attn\.rotary_emb\.scale'"):
        native_weight_names(
            LAYOUTS["nomic_bert"], ["encoder.layers.0.attn.rotary_emb.scale"], "NomicBertModel"
        )


# -- jina-embeddings-v3: detection and the task LoRA merge ---------------------------------------

_JINA = {"model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"],
         "position_embedding_type": "rotary", "lora_adaptations": ["a", "b"], "lora_rank": 2,
         "lora_alpha": 4, "task_instructions": {"a": "Query: ", "b": ""}}  # fmt: skip


def test_jina_v3_is_detected_only_with_rotary_positions() -> None:
    assert detect(_JINA) is LAYOUTS["jina-embeddings-v3"]
    # plain XLM-RoBERTa (learned absolute positions) is read by transformers as is
    assert detect({**_JINA, "position_embedding_type": "absolute"}) is None


def test_merge_lora_adds_the_chosen_adapter_scaled() -> None:
    import torch

    adapters = read_adapters(_JINA)
    assert adapters is not None and adapters.scaling == 2.0
    weight, embedding = torch.randn(6, 3), torch.randn(5, 3)
    a, b = torch.randn(2, 2, 3), torch.randn(2, 6, 2)  # Linear: A rank x in, B out x rank
    ea, eb = torch.randn(2, 5, 2), torch.randn(2, 2, 3)  # Embedding: A rows x rank, B rank x w
    tensors = {
        "l.parametrizations.weight.original": weight, "l.parametrizations.weight.0.lora_A": a,
        "l.parametrizations.weight.0.lora_B": b, "l.bias": torch.ones(6),
        "e_embeddings.parametrizations.weight.original": embedding,
        "e_embeddings.parametrizations.weight.0.lora_A": ea,
        "e_embeddings.parametrizations.weight.0.lora_B": eb,
    }  # fmt: skip
    merged = merge_lora(tensors, adapters, "b")
    assert sorted(merged) == ["e_embeddings.weight", "l.bias", "l.weight"]
    torch.testing.assert_close(merged["l.weight"], weight + 2.0 * b[1] @ a[1])
    torch.testing.assert_close(merged["e_embeddings.weight"], embedding + 2.0 * ea[1] @ eb[1])
    base = merge_lora(tensors, adapters, None)
    assert torch.equal(base["l.weight"], weight) and torch.equal(base["e_embeddings.weight"],
                                                                 embedding)  # fmt: skip


def test_merge_lora_names_what_does_not_fit() -> None:
    import torch

    adapters = read_adapters(_JINA)
    orphan = {"l.parametrizations.weight.0.lora_A": torch.zeros(2, 2, 3)}
    with pytest.raises(ExportError, match=r"l\.parametrizations\.weight\.original"):
        merge_lora(orphan, adapters, None)
    wrong_shape = {
        "l.parametrizations.weight.original": torch.zeros(6, 4),
        "l.parametrizations.weight.0.lora_A": torch.zeros(2, 2, 3),
        "l.parametrizations.weight.0.lora_B": torch.zeros(2, 6, 2),
    }
    with pytest.raises(ExportError, match=r"weight l: the LoRA update \(6, 3\) does not fit"):
        merge_lora(wrong_shape, adapters, "a")
    one_adapter = {**wrong_shape, "l.parametrizations.weight.original": torch.zeros(6, 3),
                   "l.parametrizations.weight.0.lora_A": torch.zeros(1, 2, 3)}  # fmt: skip
    with pytest.raises(ExportError, match="do not hold 2 adapters"):
        merge_lora(one_adapter, adapters, "a")


@pytest.mark.parametrize("damage", ["truncated", "bad index", "missing shard"])
def test_unreadable_published_weights_are_one_clear_error(tmp_path: Path, damage: str) -> None:
    from tei_export import hub_layouts

    match damage:
        case "truncated":
            (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00")
        case "bad index":
            (tmp_path / "model.safetensors.index.json").write_text("{")
        case "missing shard":
            (tmp_path / "model.safetensors.index.json").write_text(
                '{"weight_map": {"emb_ln.weight": "model-00002-of-00002.safetensors"}}'
            )
    with pytest.raises(ExportError, match=r"cannot read the weights|not a readable weight index"):
        hub_layouts._read_weights(tmp_path)
