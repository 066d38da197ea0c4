"""Tiny random-weight checkpoints of the encoder families transformers 5 added natively
(nomic_bert, gte, eurobert, jina_embeddings_v3), saved like hub models.

Same recipe as tiny_models (width 32, two layers, the character-level WordPiece tokenizer),
kept apart so that each family's config quirks live in one table here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.tiny_models import (
    CLS,
    MASK,
    PAD,
    SEP,
    WITH_TOKEN_TYPES,
    _vocab,
    _write_sentence_transformers,
    random_model,
    write_tokenizer,
)
from support.tiny_models import build_tokenizer as build_tokenizer

# model_type -> config kwargs beyond the common small sizes.
ENCODERS: dict[str, dict[str, Any]] = {
    "nomic_bert": {"pad_token_id": PAD},
    # gte-multilingual-base style: one token type; the hub-layout tests cover type_vocab_size 0.
    "gte": {"pad_token_id": PAD, "type_vocab_size": 1},
    "eurobert": {
        "pad_token_id": PAD, "bos_token_id": CLS, "eos_token_id": SEP, "mask_token_id": MASK,
    },
    "jina_embeddings_v3": {"pad_token_id": PAD, "bos_token_id": CLS, "eos_token_id": SEP},
    "embedding_gemma2_text": {
        "pad_token_id": PAD, "bos_token_id": CLS, "eos_token_id": SEP, "num_key_value_heads": 2,
        "head_dim": 8, "sliding_window": 8, "hidden_size_per_layer_input": 8,
        "embedding_dim": 24, "layer_types": ["sliding_attention", "full_attention"],
    },
}

# Random-weight seeds other than 0. embedding_gemma2_text's int8 variant is sensitive to its
# tiny random weights (validation min cosine 0.975 with seed 0, 0.993 with seed 1: its 24-wide
# projection of few-token mean pools); the real model's int8 is unmeasured here.
SEEDS: dict[str, int] = {"embedding_gemma2_text": 1}

COMMON: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}


def tiny_model(model_type: str, *, head: str = "base", num_labels: int = 1,
               seed: int = 0, **overrides: Any) -> Any:
    """A random model of `model_type` with every weight perturbed away from its init (so no
    LayerNorm is the identity and no bias is zero)."""
    kwargs = {"vocab_size": len(_vocab()), **COMMON, **ENCODERS[model_type], **overrides}
    return random_model(model_type, kwargs, head=head, num_labels=num_labels, seed=seed)


def build_encoder(
    dest: Path,
    model_type: str,
    *,
    head: str = "base",
    num_labels: int = 1,
    st_pooling: str | None = None,
    seed: int | None = None,
    **overrides: Any,
) -> Path:
    """A checkpoint folder in transformers' native layout (save_pretrained)."""
    seed = SEEDS.get(model_type, 0) if seed is None else seed
    model = tiny_model(model_type, head=head, num_labels=num_labels, seed=seed, **overrides)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    write_tokenizer(dest, token_types=model_type in WITH_TOKEN_TYPES)
    if st_pooling is not None:
        _write_sentence_transformers(dest, st_pooling, None, None)
    return dest


# Hub (remote-code) layouts: the config keys and weight names nomic-embed-text-v1.5 and
# gte-*-v1.5 publish, written from a native model by the inverse of the documented mapping.
NOMIC_AUTO_MAP = {
    "AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
    "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel",
}
GTE_AUTO_MAP = {
    "AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
    "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
    "AutoModelForSequenceClassification":
        "Alibaba-NLP/new-impl--modeling.NewForSequenceClassification",
}
NOMIC_THETA = 1000.0
GTE_THETA = 500000.0
GTE_NTK_FACTOR = 2.0


def nomic_published_config(vocab_size: int) -> dict[str, Any]:
    return {
        "model_type": "nomic_bert",
        "architectures": ["NomicBertModel"],
        "auto_map": NOMIC_AUTO_MAP,
        "activation_function": "swiglu",
        "vocab_size": vocab_size,
        "n_embd": COMMON["hidden_size"],
        "n_head": COMMON["num_attention_heads"],
        "n_layer": COMMON["num_hidden_layers"],
        "n_inner": COMMON["intermediate_size"],
        "n_positions": COMMON["max_position_embeddings"],
        "max_trained_positions": COMMON["max_position_embeddings"],
        "type_vocab_size": 2,
        "layer_norm_epsilon": 1e-12,
        "rotary_emb_base": NOMIC_THETA,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "prenorm": False,
        "parallel_block": False,
        "use_rms_norm": False,
        "causal": False,
        "fused_bias_fc": True,
        "fused_dropout_add_ln": True,
        "use_flash_attn": True,
        "pad_vocab_size_multiple": 64,
    }


def gte_published_config(vocab_size: int, *, head: str, type_vocab_size: int,
                         ntk: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": "new",
        "architectures": ["NewForSequenceClassification" if head != "base" else "NewModel"],
        "auto_map": GTE_AUTO_MAP,
        "vocab_size": vocab_size,
        **COMMON,
        "hidden_act": "gelu",
        "type_vocab_size": type_vocab_size,
        "layer_norm_eps": 1e-12,
        "pad_token_id": PAD,
        "position_embedding_type": "rope",
        "layer_norm_type": "layer_norm",
        "pack_qkv": True,
        "logn_attention_scale": False,
        "logn_attention_clip1": False,
        "unpad_inputs": False,
        "use_memory_efficient_attention": False,
        "rope_theta": GTE_THETA,
        "rope_scaling": {"type": "ntk", "factor": GTE_NTK_FACTOR} if ntk else None,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.0,
    }
    if head != "base":
        config["num_labels"] = 1
        config["id2label"] = {"0": "LABEL_0"}
        config["label2id"] = {"LABEL_0": 0}
    return config


def ntk_inv_freq(theta: float, factor: float, head_dim: int) -> Any:
    """new-impl's fixed-NTK inverse frequencies, as its rotary class computes them."""
    import torch

    base = theta * factor
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return inv_freq / factor ** (2 / head_dim)


def _published_nomic(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    out = {
        "embeddings.word_embeddings.weight": state["embeddings.word_embeddings.weight"],
        "embeddings.token_type_embeddings.weight": state["embeddings.token_type_embeddings.weight"],
        "emb_ln.weight": state["embeddings.LayerNorm.weight"],
        "emb_ln.bias": state["embeddings.LayerNorm.bias"],
    }
    for i in range(COMMON["num_hidden_layers"]):
        src, dst = f"layers.{i}.", f"encoder.layers.{i}."
        out[dst + "attn.Wqkv.weight"] = torch.cat(
            [state[src + f"self_attn.{x}_proj.weight"] for x in "qkv"], dim=0
        )
        out[dst + "attn.out_proj.weight"] = state[src + "self_attn.o_proj.weight"]
        out[dst + "mlp.fc11.weight"] = state[src + "mlp.up_proj.weight"]
        out[dst + "mlp.fc12.weight"] = state[src + "mlp.gate_proj.weight"]
        out[dst + "mlp.fc2.weight"] = state[src + "mlp.down_proj.weight"]
        norms = (("norm1", "post_attention_layernorm"), ("norm2", "post_mlp_layernorm"))
        for norm, native in norms:
            for p in ("weight", "bias"):
                out[dst + f"{norm}.{p}"] = state[src + f"{native}.{p}"]
    return out


def _published_gte(state: dict[str, Any], *, head: str) -> dict[str, Any]:
    import torch

    base = "gte." if head != "base" else ""
    prefix = "new." if head != "base" else ""
    out: dict[str, Any] = {}
    for name in ("embeddings.word_embeddings.weight", "embeddings.token_type_embeddings.weight",
                 "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"):
        if base + name in state:
            out[prefix + name] = state[base + name]
    for i in range(COMMON["num_hidden_layers"]):
        src, dst = f"{base}layers.{i}.", f"{prefix}encoder.layer.{i}."
        for p in ("weight", "bias"):
            out[dst + f"attention.qkv_proj.{p}"] = torch.cat(
                [state[src + f"self_attn.{x}_proj.{p}"] for x in "qkv"], dim=0
            )
            out[dst + f"attention.o_proj.{p}"] = state[src + f"self_attn.o_proj.{p}"]
            out[dst + f"mlp.down_proj.{p}"] = state[src + f"mlp.down_proj.{p}"]
            out[dst + f"attn_ln.{p}"] = state[src + f"post_attention_layernorm.{p}"]
            out[dst + f"mlp_ln.{p}"] = state[src + f"post_mlp_layernorm.{p}"]
        out[dst + "mlp.up_gate_proj.weight"] = torch.cat(
            [state[src + "mlp.up_proj.weight"], state[src + "mlp.gate_proj.weight"]], dim=0
        )
    if head != "base":
        for p in ("weight", "bias"):
            out[f"new.pooler.dense.{p}"] = state[f"gte.pooler.dense.{p}"]
            out[f"classifier.{p}"] = state[f"classifier.{p}"]
    return out


def build_hub_layout(
    dest: Path, layout: str, *, head: str = "base", st_pooling: str | None = None,
    type_vocab_size: int = 0, ntk: bool = True,
) -> tuple[Path, Any]:
    """A checkpoint folder in the published remote-code layout ("nomic_bert" or "new"), and
    the native model (in memory) whose outputs an export of it must reproduce."""
    from safetensors.torch import save_file

    vocab_size = len(_vocab())
    if layout == "nomic_bert":
        model = tiny_model(
            "nomic_bert", type_vocab_size=2, layer_norm_eps=1e-12,
            rope_parameters={"rope_type": "default", "rope_theta": NOMIC_THETA},
        )
        config = nomic_published_config(vocab_size)
        weights = _published_nomic(model.state_dict())
    else:
        model = tiny_model(
            "gte", head=head, type_vocab_size=type_vocab_size, layer_norm_eps=1e-12,
            rope_parameters={"rope_type": "default", "rope_theta": GTE_THETA},
        )
        if ntk:
            # The reference gets new-impl's frequencies directly, not through the mapping.
            rotary = (model.gte if head != "base" else model).rotary_emb
            head_dim = COMMON["hidden_size"] // COMMON["num_attention_heads"]
            rotary.inv_freq.copy_(ntk_inv_freq(GTE_THETA, GTE_NTK_FACTOR, head_dim))
        config = gte_published_config(vocab_size, head=head,
                                      type_vocab_size=type_vocab_size, ntk=ntk)
        weights = _published_gte(model.state_dict(), head=head)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})
    write_tokenizer(dest, token_types=layout in WITH_TOKEN_TYPES)
    if st_pooling is not None:
        _write_sentence_transformers(dest, st_pooling, None, None)
    return dest, model


REMOTE_CODE_DIR = Path(__file__).parent / "remote_code"
JINA_AUTO_MAP = {
    "AutoConfig": "configuration_tiny_jina.TinyJinaBertConfig",
    "AutoModel": "modeling_tiny_jina.TinyJinaBertModel",
    "AutoModelForSequenceClassification":
        "modeling_tiny_jina.TinyJinaBertForSequenceClassification",
}


def build_remote_code_checkpoint(
    dest: Path, *, st_pooling: str | None = "mean", reranker: bool = False
) -> Path:
    """A JinaBERT-style checkpoint (ALiBi, GLU) that ships its own modeling code, as
    jina-embeddings-v2 does: config.json with model_type "bert" and an auto_map. With
    `reranker`, a one-logit sequence-classification head as jina-reranker-v1-* publishes."""
    import shutil

    import torch
    import transformers

    dest.mkdir(parents=True, exist_ok=True)
    for source in REMOTE_CODE_DIR.glob("*_tiny_jina.py"):
        shutil.copyfile(source, dest / source.name)
    config = {
        "model_type": "bert",
        "architectures": [
            "JinaBertForSequenceClassification" if reranker else "JinaBertForMaskedLM"
        ],
        "auto_map": JINA_AUTO_MAP,
        **({"num_labels": 1} if reranker else {}),
        "vocab_size": len(_vocab()),
        **COMMON,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": PAD,
        "position_embedding_type": "alibi",
        "feed_forward_type": "glu",
    }
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    loaded = transformers.AutoConfig.from_pretrained(str(dest), trust_remote_code=True)
    torch.manual_seed(0)
    auto_class = (
        transformers.AutoModelForSequenceClassification if reranker else transformers.AutoModel
    )
    model = auto_class.from_config(loaded, trust_remote_code=True)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    model.save_pretrained(dest)
    (dest / "config.json").write_text(json.dumps(config, indent=2))  # as published, not as saved
    write_tokenizer(dest, token_types=True)  # a BertTokenizer, as jina publishes
    if st_pooling is not None:
        _write_sentence_transformers(dest, st_pooling, None, None)
    return dest


# jinaai/jina-embeddings-v3's published layout: model_type "xlm-roberta" with rotary positions,
# fused Wqkv, and every Linear and Embedding weight stored as a parametrization holding five
# task LoRA adapters (facts from its xlm-roberta-flash-implementation code).
JINA_V3_AUTO_MAP = {
    "AutoConfig": "jinaai/xlm-roberta-flash-implementation--configuration_xlm_roberta."
    "XLMRobertaFlashConfig",
    "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA",
}
JINA_V3_ADAPTERS = (
    "retrieval.query", "retrieval.passage", "separation", "classification", "text-matching",
)  # fmt: skip
JINA_V3_INSTRUCTIONS = {
    "retrieval.query": "Represent the query for retrieving evidence documents: ",
    "retrieval.passage": "Represent the document for retrieval: ",
    "separation": "",
    "classification": "",
    "text-matching": "",
}
JINA_V3_THETA = 20000.0
JINA_V3_RANK = 4
JINA_V3_ALPHA = 1.0


def jina_v3_published_config(vocab_size: int) -> dict[str, Any]:
    return {
        "model_type": "xlm-roberta",
        "architectures": ["XLMRobertaModel"],
        "auto_map": JINA_V3_AUTO_MAP,
        "vocab_size": vocab_size,
        **COMMON,
        "hidden_act": "gelu",
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": PAD,
        "bos_token_id": CLS,
        "eos_token_id": SEP,
        "position_embedding_type": "rotary",
        "rotary_emb_base": JINA_V3_THETA,
        "use_flash_attn": True,
        "load_trained_adapters": True,
        "lora_adaptations": list(JINA_V3_ADAPTERS),
        "task_instructions": JINA_V3_INSTRUCTIONS,
        "lora_rank": JINA_V3_RANK,
        "lora_alpha": JINA_V3_ALPHA,
        "lora_dropout_p": 0.0,
        "lora_main_params_trainable": False,
        "emb_pooler": None,
        "matryoshka_dimensions": [8, 16, 32],
        "truncate_dim": None,
    }


def _jina_v3_native_modules(i: int | None) -> dict[str, tuple[str, ...]]:
    """Published module -> the native weights it holds (several: fused along dim 0)."""
    if i is None:
        return {
            "embeddings.word_embeddings": ("embeddings.word_embeddings",),
            "embeddings.token_type_embeddings": ("embeddings.token_type_embeddings",),
            "pooler.dense": ("pooler.dense",),
        }
    src, dst = f"layers.{i}.", f"encoder.layers.{i}."
    return {
        dst + "mixer.Wqkv": tuple(src + f"self_attn.{x}_proj" for x in "qkv"),
        dst + "mixer.out_proj": (src + "self_attn.o_proj",),
        dst + "mlp.fc1": (src + "mlp.fc1",),
        dst + "mlp.fc2": (src + "mlp.fc2",),
    }


def build_jina_v3_published(dest: Path, *, with_pooler: bool = True) -> tuple[Path, Any, Any]:
    """A checkpoint in jina-embeddings-v3's published layout, the native model it was written
    from (no adapter), and `with_adapter(name)`: that native model with the named task's LoRA
    applied projection by projection (the reference an export with --adapter must match)."""
    import copy

    import torch
    from safetensors.torch import save_file

    model = tiny_model(
        "jina_embeddings_v3", type_vocab_size=1, layer_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": JINA_V3_THETA},
    )  # fmt: skip
    state = model.state_dict()
    count = len(JINA_V3_ADAPTERS)
    generator = torch.Generator().manual_seed(7)
    published: dict[str, Any] = {}
    lora: dict[str, tuple[Any, Any]] = {}
    modules: dict[str, tuple[str, ...]] = {}
    for i in (None, *range(COMMON["num_hidden_layers"])):
        modules.update(_jina_v3_native_modules(i))
    for module, natives in modules.items():
        if module.startswith("pooler.") and not with_pooler:
            continue
        weight = torch.cat([state[n + ".weight"] for n in natives], dim=0)
        published[f"roberta.{module}.parametrizations.weight.original"] = weight
        rows, cols = weight.shape
        if module.endswith("_embeddings"):  # A: rows x rank, B: rank x width
            a = torch.randn(count, rows, JINA_V3_RANK, generator=generator) * 0.3
            b = torch.randn(count, JINA_V3_RANK, cols, generator=generator) * 0.3
        else:  # A: rank x in, B: out x rank
            a = torch.randn(count, JINA_V3_RANK, cols, generator=generator) * 0.3
            b = torch.randn(count, rows, JINA_V3_RANK, generator=generator) * 0.3
        published[f"roberta.{module}.parametrizations.weight.0.lora_A"] = a
        published[f"roberta.{module}.parametrizations.weight.0.lora_B"] = b
        lora[module] = (a, b)
        if natives[0] + ".bias" in state:
            published[f"roberta.{module}.bias"] = torch.cat(
                [state[n + ".bias"] for n in natives], dim=0
            )
    for p in ("weight", "bias"):
        published[f"roberta.emb_ln.{p}"] = state[f"embeddings.LayerNorm.{p}"]
        for i in range(COMMON["num_hidden_layers"]):
            published[f"roberta.encoder.layers.{i}.norm1.{p}"] = state[
                f"layers.{i}.post_attention_layernorm.{p}"
            ]
            published[f"roberta.encoder.layers.{i}.norm2.{p}"] = state[
                f"layers.{i}.post_mlp_layernorm.{p}"
            ]

    def with_adapter(name: str) -> Any:
        index = JINA_V3_ADAPTERS.index(name)
        adapted = copy.deepcopy(model)
        weights = dict(adapted.named_parameters())
        scale = JINA_V3_ALPHA / JINA_V3_RANK
        with torch.no_grad():
            for module, (a, b) in lora.items():
                natives = modules[module]
                if module.endswith("_embeddings"):
                    weights[natives[0] + ".weight"].add_(a[index] @ b[index] * scale)
                    continue
                # Fused Wqkv: each projection gets its own rows of B, times the shared A.
                for part, native in zip(b[index].chunk(len(natives), dim=0), natives,
                                        strict=True):  # fmt: skip
                    weights[native + ".weight"].add_(part @ a[index] * scale)
        return adapted.eval()

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(jina_v3_published_config(len(_vocab())), indent=2))
    save_file({k: v.contiguous() for k, v in published.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    write_tokenizer(dest)
    _write_sentence_transformers(dest, "mean", None, None)
    return dest, model, with_adapter
