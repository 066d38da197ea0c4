"""Values that cross the runtime's border: tokenized inputs, tokens, sparse vectors."""

from __future__ import annotations

import msgspec


class Encoding(msgspec.Struct, frozen=True, kw_only=True):
    """One tokenized input, ready to be packed into a batch (no padding)."""

    ids: tuple[int, ...]
    type_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    """Character offsets into the text the tokenizer saw; (0, 0) for special tokens and
    pre-tokenized ids."""

    def __len__(self) -> int:
        return len(self.ids)


class Token(msgspec.Struct, frozen=True, kw_only=True):
    """One token as TEI's /tokenize shows it: byte offsets into the input, None for specials."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class SparseVector(msgspec.Struct, frozen=True, kw_only=True):
    """The non-zero entries of a sparse (SPLADE) embedding, indices ascending."""

    indices: list[int]
    values: list[float]
