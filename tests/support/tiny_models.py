"""Tiny random-weight checkpoints, built from a transformers config and saved like hub models.

No package ships reranker, classifier or non-BERT weights, so every architecture the model cards
cover is exercised with one of these: a few layers of width 32, a character-level WordPiece
tokenizer (so real text gives many tokens), saved with save_pretrained + tokenizer.json.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)

# model_type -> config kwargs beyond the common small sizes.
FAMILIES: dict[str, dict[str, Any]] = {
    "bert": {},
    "roberta": {"pad_token_id": PAD, "max_position_embeddings": 130},
    "xlm-roberta": {"pad_token_id": PAD, "max_position_embeddings": 130},
    "camembert": {"pad_token_id": PAD, "max_position_embeddings": 130},
    "distilbert": {"dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 4},
    "mpnet": {"pad_token_id": PAD, "max_position_embeddings": 130},
    "modernbert": {
        "pad_token_id": PAD, "bos_token_id": CLS, "eos_token_id": SEP,
        "cls_token_id": CLS, "sep_token_id": SEP, "global_attn_every_n_layers": 2,
        "local_attention": 16,
    },
    "deberta-v2": {"pad_token_id": PAD},
    "qwen2": {"num_key_value_heads": 2, "pad_token_id": PAD, "bos_token_id": CLS,
              "eos_token_id": SEP},
    "qwen3": {"num_key_value_heads": 2, "head_dim": 8, "pad_token_id": PAD,
              "bos_token_id": CLS, "eos_token_id": SEP},
    "mistral": {"num_key_value_heads": 2, "pad_token_id": PAD, "bos_token_id": CLS,
                "eos_token_id": SEP},
    "gemma3_text": {"num_key_value_heads": 2, "head_dim": 8, "pad_token_id": PAD,
                    "bos_token_id": CLS, "eos_token_id": SEP, "sliding_window": 16},
}
DECODERS = {"qwen2", "qwen3", "mistral", "gemma3_text"}
# The families whose hub tokenizers return token_type_ids; the others' tokenizer configs
# narrow model_input_names, as their real tokenizers do.
WITH_TOKEN_TYPES = {"bert", "deberta-v2", "nomic_bert"}  # nomic-embed-text: a BertTokenizer


def _vocab() -> dict[str, int]:
    chars = string.ascii_lowercase + string.digits + string.punctuation + "äöüéèàçñßæøå"
    pieces = SPECIALS + list(chars) + [f"##{c}" for c in chars]
    return {piece: i for i, piece in enumerate(pieces)}


def build_tokenizer(*, decoder: bool) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(_vocab(), unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    if decoder:
        # Decoders used as embedders append an end token and pool the last one.
        tok.post_processor = processors.TemplateProcessing(
            single="$A [SEP]", pair="$A [SEP] $B:1 [SEP]:1", special_tokens=[("[SEP]", SEP)]
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
        )
    return tok


def random_model(
    model_type: str, kwargs: dict[str, Any], *, head: str, num_labels: int, seed: int
) -> Any:
    """A random `model_type` model (head: base | sequence-classification | masked-lm)."""
    import torch
    import transformers

    kwargs = dict(kwargs)
    if head == "sequence-classification":
        kwargs["num_labels"] = num_labels
        if num_labels > 1:
            kwargs["id2label"] = {i: f"label_{i}" for i in range(num_labels)}
            kwargs["label2id"] = {f"label_{i}": i for i in range(num_labels)}
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    auto = {
        "base": transformers.AutoModel,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "masked-lm": transformers.AutoModelForMaskedLM,
    }[head]
    torch.manual_seed(seed)
    model = auto.from_config(config)
    # Random init leaves LayerNorms at identity and biases at zero; perturb every weight so the
    # parity tests compare something that is not trivially symmetric.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return model.eval()


def build_checkpoint(
    dest: Path,
    model_type: str,
    *,
    head: str = "base",
    num_labels: int = 1,
    st_pooling: str | None = None,
    dense_out: int | None = None,
    prompts: dict[str, str] | None = None,
    seed: int = 0,
) -> Path:
    """Write a checkpoint folder; head is base | sequence-classification | masked-lm."""
    vocab_size = len(_vocab())
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
    }
    kwargs = {**common, **FAMILIES[model_type]}
    model = random_model(model_type, kwargs, head=head, num_labels=num_labels, seed=seed)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)

    write_tokenizer(dest, decoder=model_type in DECODERS,
                    token_types=model_type in WITH_TOKEN_TYPES)
    _save_the_tokenizer_transformers_builds(dest)
    if st_pooling is not None:
        _write_sentence_transformers(dest, st_pooling, dense_out, prompts)
    return dest


def write_tokenizer(dest: Path, *, decoder: bool = False, token_types: bool = False) -> None:
    """tokenizer.json and tokenizer_config.json as a hub checkpoint ships them."""
    build_tokenizer(decoder=decoder).save(str(dest / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "model_max_length": 120,
        "padding_side": "left" if decoder else "right",
        "model_input_names": ["input_ids", "attention_mask"]
        + (["token_type_ids"] if token_types else []),
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config))


def _write_sentence_transformers(
    dest: Path, pooling: str, dense_out: int | None, prompts: dict[str, str] | None
) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]
    (dest / "1_Pooling").mkdir(exist_ok=True)
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
            "last-token": "pooling_mode_lasttoken"}
    pooling_config = {"word_embedding_dimension": 32, **{k: False for k in keys.values()}}
    pooling_config[keys[pooling]] = True
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    if dense_out is not None:
        import torch
        from sentence_transformers.sentence_transformer.modules import Dense

        torch.manual_seed(1)
        dense = Dense(32, dense_out, activation_function=torch.nn.Tanh())
        (dest / "2_Dense").mkdir(exist_ok=True)
        dense.save(str(dest / "2_Dense"))
        modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                        "type": "sentence_transformers.models.Dense"})
    normalize_dir = f"{len(modules)}_Normalize"
    (dest / normalize_dir).mkdir(exist_ok=True)
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": normalize_dir,
                    "type": "sentence_transformers.models.Normalize"})
    (dest / "modules.json").write_text(json.dumps(modules))
    (dest / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 96}))
    if prompts:
        (dest / "config_sentence_transformers.json").write_text(
            json.dumps({"prompts": prompts, "default_prompt_name": None})
        )


# Decoder families added on transformers 5: causal Llama and the ModernBERT decoder (Ettin).
FAMILIES["llama"] = {"num_key_value_heads": 2, "pad_token_id": PAD, "bos_token_id": CLS,
                     "eos_token_id": SEP}
FAMILIES["modernbert-decoder"] = {"pad_token_id": PAD, "bos_token_id": CLS, "eos_token_id": SEP,
                                  "cls_token_id": CLS, "sep_token_id": SEP,
                                  "global_attn_every_n_layers": 2, "local_attention": 16}
DECODERS.update({"llama", "modernbert-decoder"})


def add_dense_module(dest: Path, folder: str, out_features: int, *, seed: int = 2) -> Path:
    """A Dense module folder that modules.json does not list (stella ships 2_Dense_256,
    2_Dense_1024, ... beside the one it applies)."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense

    torch.manual_seed(seed)
    dense = Dense(32, out_features, activation_function=torch.nn.Identity())
    (dest / folder).mkdir()
    dense.save(str(dest / folder))
    return dest / folder


def build_bidirectional_gemma3(dest: Path, **options: Any) -> Path:
    """EmbeddingGemma's layout: a Gemma 3 text model with bidirectional attention. The flag
    changes no weight, so it is set in the saved config.json."""
    build_checkpoint(dest, "gemma3_text", **options)
    config = json.loads((dest / "config.json").read_text())
    config["use_bidirectional_attention"] = True
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _save_the_tokenizer_transformers_builds(dest: Path) -> None:
    """transformers 5 ignores the tokenizer class a checkpoint names for some model types (qwen2)
    and rebuilds its own pipeline around the vocabulary. A real checkpoint's tokenizer.json is
    that pipeline; write it so, so the runtime (which reads tokenizer.json, as TEI does) and
    sentence-transformers tokenize alike."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(dest))
    if type(tokenizer).__name__ not in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        tokenizer.backend_tokenizer.save(str(dest / "tokenizer.json"))
