"""The texts every engine embeds: deterministic, English-like, cut to exact token counts.

Generated (seeded) rather than shipped so the pools can be any size; cut with the model's own
tokenizer so "short/medium/long" mean token counts, not characters. No engine truncates them:
long stops at the model's max_input_length.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
from tokenizers import Tokenizer

_TEXT = (
    "the a of to and in is it that for on with as was by at from this be are or an have not "
    "which one you all were can there their has more been if will would when who so what no "
    "about out up into than them some could only other time new these two may first then do "
    "any like my now over such our man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three states himself few house use during "
    "without again place american around however home small found thought went say part once "
    "general high upon school every united left number course war until always away something "
    "fact though water less public put think almost hand enough far took head yet government "
    "system better set told nothing night end why called point model embedding vector search "
    "retrieval query document server latency throughput memory network inference batch token "
    "sentence transformer attention layer gradient training dataset evaluation benchmark "
    "quantization precision accuracy language translation summary question answer context"
)
_WORDS = _TEXT.split()


class Pool(msgspec.Struct, frozen=True, kw_only=True):
    texts: list[str]
    tokens: list[int]  # per text, special tokens included, as the model sees it


def _tokenizer(artifact: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 18))]
    return " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!"))


def _cut(tok: Tokenizer, rng: random.Random, n_tokens: int) -> str:
    """A text of exactly n_tokens tokens with special tokens (cut at a token boundary)."""
    text = ""
    special = len(tok.encode("").ids)
    while len(tok.encode(text).ids) < n_tokens:
        text = f"{text} {_sentence(rng)}".strip()
    enc = tok.encode(text)
    # the end of the last kept real token; special tokens ([CLS] first for an encoder, an end
    # token last for a decoder) are not in the text
    real = [i for i, s in enumerate(enc.special_tokens_mask) if not s]
    keep = n_tokens - special
    return text[: enc.offsets[real[keep - 1]][1]]


def make_pools(
    artifact: Path, size: int, max_tokens: int, targets: dict[str, int], seed: int = 5
) -> dict[str, Pool]:
    tok = _tokenizer(artifact)
    rng = random.Random(seed)
    wanted: dict[str, list[int]] = {
        name: [min(n, max_tokens)] * size for name, n in targets.items()
    }
    # mixed: log-normal around ~48 tokens, clipped to [6, max]: many short queries, a tail
    # of passages, like a retrieval index's traffic.
    wanted["mixed"] = [
        max(6, min(max_tokens, round(rng.lognormvariate(3.9, 0.8)))) for _ in range(size)
    ]
    pools: dict[str, Pool] = {}
    for name, lengths in wanted.items():
        texts = [_cut(tok, rng, n) for n in lengths]
        counts = [len(tok.encode(t).ids) for t in texts]
        pools[name] = Pool(texts=texts, tokens=counts)
    return pools
