"""Tiny random-weight checkpoints of the encoder families transformers 5 added natively
(nomic_bert, gte, eurobert, jina_embeddings_v3), saved like hub models.

Same recipe as tiny_models (width 32, two layers, the character-level WordPiece tokenizer),
kept apart so that each family's config quirks live in one table here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.tiny_models import CLS, MASK, PAD, SEP, _vocab, _write_sentence_transformers
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
}

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
    import torch
    import transformers

    kwargs = {"vocab_size": len(_vocab()), **COMMON, **ENCODERS[model_type], **overrides}
    if head == "sequence-classification":
        kwargs["num_labels"] = num_labels
        if num_labels > 1:
            kwargs["id2label"] = {i: f"label_{i}" for i in range(num_labels)}
            kwargs["label2id"] = {f"label_{i}": i for i in range(num_labels)}
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    auto = {
        "base": transformers.AutoModel,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
    }[head]
    torch.manual_seed(seed)
    model = auto.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return model.eval()


def write_tokenizer(dest: Path) -> None:
    build_tokenizer(decoder=False).save(str(dest / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "model_max_length": 120,
        "padding_side": "right",
        "model_input_names": ["input_ids", "attention_mask"],
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config))


def build_encoder(
    dest: Path,
    model_type: str,
    *,
    head: str = "base",
    num_labels: int = 1,
    st_pooling: str | None = None,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """A checkpoint folder in transformers' native layout (save_pretrained)."""
    model = tiny_model(model_type, head=head, num_labels=num_labels, seed=seed, **overrides)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    write_tokenizer(dest)
    if st_pooling is not None:
        _write_sentence_transformers(dest, st_pooling, None, None)
    return dest
