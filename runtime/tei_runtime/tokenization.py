"""Tokenization from tokenizer.json with truncation, pairs, prompts and pre-tokenized ids.

Three `tokenizers.Tokenizer` instances are kept (no truncation, truncate right, truncate
left) rather than one reconfigured per call: reconfiguring mutates shared state, which would
race when the server tokenizes on several threads.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeAlias

import tokenizers  # type: ignore[import-untyped,unused-ignore]  # py.typed only from 0.23

from tei_runtime.data import Encoding, Token
from tei_runtime.errors import InputTooLongError, TokenizerError, ValidationError

_log = logging.getLogger(__name__)

Direction: TypeAlias = Literal["left", "right"]
TextInput: TypeAlias = str | tuple[str, str]
Input: TypeAlias = str | tuple[str, str] | Sequence[int]

# A token never needs more than this many characters in practice (BERT's WordPiece gives up
# on words over 100 chars). Texts longer than max_input_length * this are cut before
# tokenizing; `cut_long` checks the cut still yields a full window and undoes it otherwise.
CHARS_PER_TOKEN = 20
# TEI refuses an input of more than max_input_length * this many characters when truncation
# is off, before tokenizing it (its MAX_CHAR_MULTIPLIER).
MAX_CHARS_PER_TOKEN = 250
# How far back from the cut point to look for whitespace to cut at.
_WHITESPACE_SEARCH = 0.1

_PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>", "</s>")


def chars_of(item: Input) -> int:
    """An input's size as TEI counts it: a string's characters, a pair's both, ids one each."""
    if isinstance(item, str):
        return len(item)
    if is_pair(item):
        return len(item[0]) + len(item[1])  # type: ignore[arg-type]
    return len(item)


def is_pair(item: object) -> bool:
    """A (query, passage) pair: two strings, as a tuple or (as sentence-transformers'
    CrossEncoder takes them too) a list; token ids are ints, so a list of two strings is
    never mistaken for them."""
    return (
        isinstance(item, tuple | list)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    )


_U32_MAX = 2**32 - 1


def _ids(item: object) -> tuple[int, ...]:
    if isinstance(item, bytes | bytearray | memoryview):  # iterating them gives ints
        raise ValidationError(
            f"each input must be a string, a (query, passage) pair of strings or a list of "
            f"token ids; got {type(item).__name__} (decode it to str first)"
        )
    try:
        # operator.index takes ints and numpy integers, and refuses floats and strings.
        ids = tuple(operator.index(i) for i in item)  # type: ignore[attr-defined]
    except TypeError as e:
        raise ValidationError(
            "each input must be a string, a (query, passage) pair of strings or a list of "
            f"token ids; got {type(item).__name__}"
        ) from e
    if any(i < 0 for i in ids):
        raise ValidationError("token ids must not be negative")
    if not ids:  # as the server's `inputs` cannot be empty: no vector of zeros
        raise ValidationError("an input of token ids must not be empty")
    return ids


def _require_batch(inputs: object) -> None:
    # A bare string is a Sequence[str] too; iterating it would embed each character.
    if isinstance(inputs, str | bytes):
        raise ValidationError("`inputs` must be a list of inputs, not a single string")
    if isinstance(inputs, Mapping) or not (
        hasattr(inputs, "__len__") and hasattr(inputs, "__getitem__")
    ):
        raise ValidationError(
            f"`inputs` must be a list (or tuple) of inputs; got {type(inputs).__name__}"
        )


def cut_point(text: str, budget: int, direction: Direction) -> str:
    """Keep about `budget` chars at the kept end, cutting at whitespace where one is near."""
    if len(text) <= budget:
        return text
    reach = max(1, int(budget * _WHITESPACE_SEARCH))
    if direction == "right":
        for i in range(budget, budget - reach, -1):
            if text[i].isspace():
                return text[:i]
        return text[:budget]
    start = len(text) - budget
    for i in range(start - 1, start - 1 + reach):
        if text[i].isspace():
            return text[i + 1 :]
    return text[start:]


def _cut_bytes(text: str, size: int, direction: Direction) -> str:
    """`text` cut to `size` UTF-8 bytes at the kept end, as Rust's `String::truncate` cuts
    when the index is a character boundary (TEI checks that, and cuts nothing where not).
    A left cut keeps the last bytes: the end left truncation keeps, as `cut_long` does."""
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate is refused later
    if len(data) <= size:
        return text
    at = size if direction == "right" else len(data) - size
    if data[at] & 0xC0 == 0x80:  # a continuation byte: inside a character
        return text
    kept = data[:at] if direction == "right" else data[at:]
    return kept.decode("utf-8", "surrogatepass")


def check_direction(direction: object) -> None:
    """A truncation direction is `left` or `right` (TEI's words where it is not)."""
    if direction not in ("left", "right"):
        raise ValidationError(f"`truncation_direction` must be left or right. Given: {direction}")


def is_text(value: str) -> bool:
    """Whether `value` is text UTF-8 can encode (Python strings may hold lone surrogates,
    from JSON's `\\ud83d` escapes, which no tokenizer takes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Tokenizer:
    def __init__(self, tokenizer_json: Path, *, max_input_length: int, name: str = "") -> None:
        self.name = name or str(tokenizer_json.parent)
        """The model the tokenizer belongs to, as warnings name it (several may be served)."""
        try:
            data = tokenizer_json.read_text(encoding="utf-8")
            self._plain = tokenizers.Tokenizer.from_str(data)
            self._right = tokenizers.Tokenizer.from_str(data)
            self._left = tokenizers.Tokenizer.from_str(data)
        except Exception as e:  # tokenizers raises bare Exception for a malformed file
            raise TokenizerError(f"{tokenizer_json}: cannot load tokenizer ({e})") from e
        self.max_input_length = max_input_length
        for tok in (self._plain, self._right, self._left):
            tok.no_padding()
        self._plain.no_truncation()
        self._right.enable_truncation(max_input_length, direction="right")
        self._left.enable_truncation(max_input_length, direction="left")
        self.pad_id = self._find_pad_id()
        self.vocab_size = self._plain.get_vocab_size(with_added_tokens=True)
        self._warned_unknown_ids = False

    def _find_pad_id(self) -> int:
        padding = self._plain.padding
        if padding is not None and isinstance(padding.get("pad_id"), int):
            return int(padding["pad_id"])
        for token in _PAD_TOKENS:
            found = self._plain.token_to_id(token)
            if found is not None:
                return int(found)
        # Padded positions are masked out, so any id is correct; 0 always exists.
        return 0

    def cut_long(self, text: str, direction: Direction, tokens: int | None = None) -> str:
        """`text` cut at whitespace to about `tokens` (default: max_input_length) tokens'
        worth of characters, kept at the end truncation keeps, before it is tokenized.

        The cut is exact where it alone still fills those tokens: truncation keeps at most
        that many tokens of one sequence, and cutting at whitespace leaves the pre-tokens
        (hence tokens) before the cut unchanged. A tight cut (CHARS_PER_TOKEN) is tried
        first, then one at TEI's count (MAX_CHARS_PER_TOKEN); a text sparser than that in
        tokens (whitespace runs, one endless word) is cut as TEI cuts it, at exactly that
        many characters, so no text costs more than that many characters of tokenizing."""
        window = self.max_input_length if tokens is None else tokens
        for per_token in (CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN):
            budget = window * per_token
            if len(text) <= budget:
                return text
            cut = cut_point(text, budget, direction)
            if self._count(cut) >= window:
                return cut
        return text[-budget:] if direction == "left" else text[:budget]

    def cut_pair(self, query: str, passage: str, direction: Direction) -> tuple[str, str]:
        """A pair cut as TEI cuts it before tokenizing, and no further.

        Longest-first truncation gives the odd token of the budget to the side with more
        tokens, so each side must keep its full token count: cutting each side on its own
        (as `cut_long` does a text) can make the longer side the shorter one. TEI cuts a
        pair only when it holds more than max_input_length * 250 characters, each side then
        to half that many bytes (left untouched where that byte is inside a character); what
        it tokenizes is bounded by the payload limit, as here."""
        limit = self.max_input_length * MAX_CHARS_PER_TOKEN
        if len(query) + len(passage) > limit:
            query = _cut_bytes(query, limit // 2, direction)
            passage = _cut_bytes(passage, limit // 2, direction)
        # What is left would tokenize in full, and tokenizers' pair truncation then builds
        # every combination of the two sides' overflow windows: quadratic, seconds for two
        # 30,000-character sides. Each side is cut as `cut_long` cuts a text (its kept end
        # exact, at least max_input_length tokens) where that leaves the longer side longer:
        # then longest-first splits the budget as it would the whole pair.
        tight = self.max_input_length * CHARS_PER_TOKEN
        if len(query) <= tight and len(passage) <= tight:
            return query, passage
        cut_query = self.cut_long(query, direction)
        cut_passage = self.cut_long(passage, direction)

        def order(a: str, b: str) -> int:
            n_a, n_b = self._count(a), self._count(b)
            return (n_a > n_b) - (n_a < n_b)

        if order(cut_query, cut_passage) == order(query, passage):
            return cut_query, cut_passage
        return query, passage  # the cut would flip the sides: exact, at the full cost

    def _count(self, text: str) -> int:
        try:
            # the batch call: it releases Python's lock, which a pair's counts hold for seconds
            [encoding] = self._plain.encode_batch([text], add_special_tokens=False)
            return len(encoding.ids)
        except Exception as e:
            raise TokenizerError(str(e)) from e

    def encode(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool = True,
        truncation_direction: Direction = "right",
        prefix: str | None = None,
        add_special_tokens: bool = True,
    ) -> list[Encoding]:
        """Tokenize a batch. `prefix` (a prompt) goes before each text and each pair's query."""
        _require_batch(inputs)
        check_direction(truncation_direction)
        out: list[Encoding | None] = [None] * len(inputs)
        texts: list[TextInput] = []
        where: list[int] = []
        for i, item in enumerate(inputs):
            if not truncate:
                self.check_chars(item)
            if isinstance(item, str):
                text = prefix + item if prefix else item
                texts.append(self.cut_long(text, truncation_direction) if truncate else text)
                where.append(i)
            elif is_pair(item):
                query, passage = str(item[0]), str(item[1])
                query = prefix + query if prefix else query
                if truncate:
                    query, passage = self.cut_pair(query, passage, truncation_direction)
                texts.append((query, passage))
                where.append(i)
            else:
                out[i] = self._from_ids(_ids(item), prefix, truncate, truncation_direction)
        if texts:
            tok = self._plain
            if truncate:
                tok = self._left if truncation_direction == "left" else self._right
            try:
                encoded = tok.encode_batch(texts, add_special_tokens=add_special_tokens)
            except Exception as e:  # tokenizers raises bare Exception
                for i, item in zip(where, texts, strict=True):
                    if not all(is_text(t) for t in ((item,) if isinstance(item, str) else item)):
                        raise ValidationError(
                            f"input {i} is not valid text: it holds a lone surrogate (such as "
                            "\\ud83d, half of an escaped emoji), which UTF-8 cannot encode"
                        ) from e
                raise TokenizerError(str(e)) from e
            for i, enc in zip(where, encoded, strict=True):
                if not truncate and len(enc.ids) > self.max_input_length:
                    raise InputTooLongError(len(enc.ids), self.max_input_length)
                out[i] = Encoding(
                    ids=tuple(enc.ids),
                    type_ids=tuple(enc.type_ids),
                    offsets=tuple(enc.offsets),
                )
        return [e for e in out if e is not None]

    def check_chars(self, item: Input) -> None:
        """TEI's character pre-check of an input that will not be truncated: one longer than
        max_input_length * 250 characters is refused before anything tokenizes it."""
        chars = chars_of(item)
        limit = self.max_input_length * MAX_CHARS_PER_TOKEN
        if chars > limit:
            raise ValidationError(
                f"`inputs` must have less than {limit} characters. Given: {chars}"
            )

    def ids_without_specials(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Token ids of each text as it is: no special tokens added, no truncation."""
        return [e.ids for e in self.encode_without_specials(texts)]

    def encode_without_specials(self, texts: Sequence[str]) -> list[Encoding]:
        """Each text as it is (no special tokens added, no truncation), with offsets."""
        try:
            encoded = self._plain.encode_batch(list(texts), add_special_tokens=False)
        except Exception as e:  # tokenizers raises bare Exception
            raise TokenizerError(str(e)) from e
        return [
            Encoding(ids=tuple(e.ids), type_ids=tuple(e.type_ids), offsets=tuple(e.offsets))
            for e in encoded
        ]

    def _from_ids(
        self, ids: tuple[int, ...], prefix: str | None, truncate: bool, direction: Direction
    ) -> Encoding:
        """Token ids read as TEI reads them: decoded, then tokenized again, so that a prompt
        can go before them; with no prompt that leaves well-formed ids as they were. Ids the
        vocabulary lacks drop out in the decoding, as in TEI (OpenAI clients send tiktoken
        ids); ids that are not u32 are refused, as TEI's body parser refuses them."""
        if any(i > _U32_MAX for i in ids):
            raise ValidationError("token ids must fit in 32 bits (at most 4294967295)")
        unknown = sum(i >= self.vocab_size for i in ids)
        if ids and unknown == len(ids):
            raise ValidationError(
                f"no token id is in the vocabulary (size {self.vocab_size}): nothing to embed"
            )
        if unknown and not self._warned_unknown_ids:
            self._warned_unknown_ids = True  # once: a client sending them sends them always
            _log.warning(
                "%s: token ids outside the vocabulary (size %d) were dropped from an input: ids "
                "from another tokenizer (an OpenAI client's tiktoken ids) embed as noise; send "
                "text instead (LangChain: check_embedding_ctx_length=False)",
                self.name, self.vocab_size,
            )  # fmt: skip
        tok = self._plain
        if truncate:
            tok = self._left if direction == "left" else self._right
        # The batch calls, one item each: tokenizers' single-item decode and encode hold
        # Python's lock throughout, and 600k ids took seconds, every other thread (the event
        # loop's too) stopped meanwhile. A prompt set to "" still takes the prompt's path, as
        # TEI's `Some("")` does: the ids are re-encoded with special tokens.
        try:
            if prefix is not None:
                [text] = self._plain.decode_batch([list(ids)], skip_special_tokens=True)
                [enc] = tok.encode_batch([prefix + text], add_special_tokens=True)
            else:
                [text] = self._plain.decode_batch([list(ids)], skip_special_tokens=False)
                [enc] = tok.encode_batch([text], add_special_tokens=False)
        except Exception as e:  # tokenizers raises bare Exception
            raise TokenizerError(str(e)) from e
        if len(enc.ids) > self.max_input_length:
            raise InputTooLongError(len(enc.ids), self.max_input_length)
        return Encoding(
            ids=tuple(enc.ids), type_ids=tuple(enc.type_ids), offsets=tuple(enc.offsets)
        )

    def tokens(
        self,
        inputs: Sequence[TextInput],
        *,
        add_special_tokens: bool = True,
        prefix: str | None = None,
    ) -> list[list[Token]]:
        """TEI's /tokenize view: no truncation (so TEI's character limit holds), byte offsets
        into the (prompted) input."""
        _require_batch(inputs)
        texts: list[TextInput] = []
        for item in inputs:
            if isinstance(item, str) or is_pair(item):
                self.check_chars(item)
            if isinstance(item, str):
                texts.append(prefix + item if prefix else item)
            elif is_pair(item):
                query, passage = str(item[0]), str(item[1])
                texts.append((prefix + query if prefix else query, passage))
            else:
                raise ValidationError("`inputs` must be strings or (query, passage) pairs")
        try:
            encoded = self._plain.encode_batch(texts, add_special_tokens=add_special_tokens)
        except Exception as e:
            raise TokenizerError(str(e)) from e
        result: list[list[Token]] = []
        for text, enc in zip(texts, encoded, strict=True):
            members = (text,) if isinstance(text, str) else text
            byte_maps = [_ByteOffsets(m) for m in members]
            row: list[Token] = []
            for tid, token, special, (start, stop), seq in zip(
                enc.ids,
                enc.tokens,
                enc.special_tokens_mask,
                enc.offsets,
                enc.sequence_ids,
                strict=True,
            ):
                if special or seq is None:
                    row.append(Token(id=tid, text=token, special=True, start=None, stop=None))
                    continue
                bytes_of = byte_maps[seq]
                b_start, b_stop = bytes_of.at(start), bytes_of.at(stop)
                row.append(
                    Token(
                        id=tid,
                        text=bytes_of.slice(b_start, b_stop),
                        special=False,
                        start=b_start,
                        stop=b_stop,
                    )
                )
            result.append(row)
        return result

    def decode(
        self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
    ) -> list[str]:
        try:
            return list(
                self._plain.decode_batch(
                    [list(i) for i in ids], skip_special_tokens=skip_special_tokens
                )
            )
        except Exception as e:
            raise TokenizerError(str(e)) from e


class _ByteOffsets:
    """Char offset -> UTF-8 byte offset, as TEI reports offsets (Rust's tokenizers use bytes)."""

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")
        self._prefix: list[int] | None = None
        if not text.isascii():
            prefix = [0]
            for ch in text:
                prefix.append(prefix[-1] + len(ch.encode("utf-8")))
            self._prefix = prefix

    def at(self, char_offset: int) -> int:
        return char_offset if self._prefix is None else self._prefix[char_offset]

    def slice(self, start: int, stop: int) -> str:
        return self.data[start:stop].decode("utf-8", errors="replace")
