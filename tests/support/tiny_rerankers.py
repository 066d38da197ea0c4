"""A tiny generative reranker in Qwen3-Reranker's layout: a random-weight Qwen3ForCausalLM with
a Qwen-style byte-level BPE tokenizer (ChatML special tokens, <think> tags, single "yes" and
"no" tokens) and a chat template, saved like a hub model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# Qwen2/3's pre-tokenizer split.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MERGES = [("y", "e"), ("ye", "s"), ("n", "o"), ("t", "h"), ("th", "e"), ("Ġ", "the")]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NOT_SPECIAL = ["<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_qwen_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NOT_SPECIAL])
    return tok


def build_qwen3_reranker(dest: Path, *, seed: int = 0, max_positions: int = 512) -> Path:
    import torch
    import transformers

    tokenizer = build_qwen_tokenizer()
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    pad = tokenizer.token_to_id("<|endoftext|>")
    eos = tokenizer.token_to_id("<|im_end|>")
    config: Any = transformers.AutoConfig.for_model(
        "qwen3",
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=pad, bos_token_id=pad, eos_token_id=eos,
        architectures=["Qwen3ForCausalLM"],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    model.save_pretrained(dest)
    tok_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": max_positions,
        "padding_side": "left",
        "add_prefix_space": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config))
    # transformers 5 rebuilds Qwen2's pipeline around the vocabulary; keep what it builds so
    # the runtime (tokenizer.json) and transformers tokenize alike.
    built = transformers.AutoTokenizer.from_pretrained(str(dest))
    if type(built).__name__ not in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        built.backend_tokenizer.save(str(dest / "tokenizer.json"))
    return dest
