"""A generative reranker's pairs: the prompt, the instruction and where truncation cuts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec
import pytest
from rt_artifacts import ArtifactFactory, Built

from support.tiny_rerankers import build_qwen_tokenizer
from tei_runtime.answer_prompt import PromptedPairs, format_pair
from tei_runtime.data import Encoding
from tei_runtime.errors import InputTooLongError, ManifestError, ValidationError
from tei_runtime.manifest import (
    MANIFEST_NAME,
    AnswerPrompt,
    GenerativeRerank,
    Task,
    decode_manifest,
    encode_manifest,
    read_manifest,
)
from tei_runtime.tokenization import Tokenizer

PROMPT = AnswerPrompt(
    prefix="<|im_start|>system\nsay yes or no<|im_end|>\n<|im_start|>user\n",
    template="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    default_instruction="find it",
    yes_token="yes", no_token="no", yes_token_id=1, no_token_id=2,
)  # fmt: skip


@pytest.fixture
def tokenizer(tmp_path: Path) -> Tokenizer:
    path = tmp_path / "tokenizer.json"
    build_qwen_tokenizer().save(str(path))
    return Tokenizer(path, max_input_length=120)


def test_format_pair_uses_the_default_or_the_given_instruction() -> None:
    assert format_pair(PROMPT, "q {x}", "d", None) == (
        "<Instruct>: find it\n<Query>: q {x}\n<Document>: d"
    )
    assert format_pair(PROMPT, "q", "d", "other").startswith("<Instruct>: other\n")


def test_pairs_are_prefix_pair_suffix(tokenizer: Tokenizer) -> None:
    pairs = PromptedPairs(PROMPT, tokenizer)
    [enc] = pairs.encode([("q", "d")], instruction=None, truncate=True,
                         truncation_direction="right")  # fmt: skip
    whole = PROMPT.prefix + format_pair(PROMPT, "q", "d", None) + PROMPT.suffix
    assert enc.ids == tokenizer.ids_without_specials([whole])[0]
    [other] = pairs.encode([("q", "d")], instruction="x", truncate=True,
                           truncation_direction="right")  # fmt: skip
    assert other.ids != enc.ids


def test_truncation_cuts_the_pair_never_the_prompt(tokenizer: Tokenizer) -> None:
    pairs = PromptedPairs(PROMPT, tokenizer)
    long = "word " * 200
    [enc] = pairs.encode([("q", long)], instruction=None, truncate=True,
                         truncation_direction="right")  # fmt: skip
    assert len(enc.ids) == 120
    assert enc.ids[: len(pairs.prefix_ids)] == pairs.prefix_ids
    assert enc.ids[-len(pairs.suffix_ids) :] == pairs.suffix_ids
    with pytest.raises(InputTooLongError):
        pairs.encode([("q", long)], instruction=None, truncate=False,
                     truncation_direction="right")  # fmt: skip
    # Past TEI's character limit (max_input_length * 250) an untruncated pair is refused
    # before it is tokenized, as any input is.
    with pytest.raises(ValidationError, match="must have less than 30000 characters"):
        pairs.encode([("q", "x" * 30_000)], instruction=None, truncate=False,
                     truncation_direction="right")  # fmt: skip


def test_left_truncation_cuts_the_document_start_not_the_question(
    tokenizer: Tokenizer,
) -> None:
    pairs = PromptedPairs(PROMPT, tokenizer)
    document = " ".join(f"w{i}" for i in range(300))
    text = {}
    for side in ("left", "right"):
        [enc] = pairs.encode([("what is it", document)], instruction="judge",
                             truncate=True, truncation_direction=side)  # fmt: skip
        assert len(enc.ids) == 120
        assert enc.ids[: len(pairs.prefix_ids)] == pairs.prefix_ids
        assert enc.ids[-len(pairs.suffix_ids) :] == pairs.suffix_ids
        text[side] = tokenizer.decode([list(enc.ids)], skip_special_tokens=False)[0]
    for side in ("left", "right"):
        assert "<Instruct>: judge\n<Query>: what is it\n<Document>:" in text[side]
    assert "w0 w1" in text["right"] and "w299" not in text["right"]
    assert text["left"].rstrip().endswith("w299<|im_end|>\n<|im_start|>assistant")
    assert "w0 " not in text["left"]
    # A question that fills the input alone is cut at its end on either side, as the card does.
    long_query = " ".join(f"q{i}" for i in range(300))
    ends = [
        pairs.encode([(long_query, "the document")], instruction=None, truncate=True,
                     truncation_direction=side)[0].ids
        for side in ("left", "right")
    ]  # fmt: skip
    assert ends[0] == ends[1] and len(ends[0]) == 120



def test_left_truncation_drops_the_documents_first_word_too(tokenizer: Tokenizer) -> None:
    """Byte-level BPE starts the document's first token at the space before it ("Ġthe"):
    that token is the document's, cut with its start, not kept before the kept tail."""
    pairs = PromptedPairs(PROMPT, tokenizer)
    # Short enough in characters that no cut before tokenizing takes the start off already.
    document = "the beginning. " + " ".join(f"s{i}." for i in range(100)) + " END"
    [enc] = pairs.encode([("q", document)], instruction=None, truncate=True,
                         truncation_direction="left")  # fmt: skip
    text = tokenizer.decode([list(enc.ids)], skip_special_tokens=False)[0]
    kept = text.partition("<Document>:")[2]
    assert "the" not in kept and kept.rstrip().endswith("END<|im_end|>\n<|im_start|>assistant")

@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("huge", ["document", "query", "instruction"])
def test_a_huge_part_is_cut_before_tokenizing_to_the_same_tokens(
    tokenizer: Tokenizer, direction: Literal["right", "left"], huge: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A megabyte-long document took a second to tokenize whole; the query and instruction
    go with every document of a request (a megabyte of either, times 32 documents, was a
    minute). Each is cut first, and the kept tokens are the same as without the cut."""
    pairs = PromptedPairs(PROMPT, tokenizer)
    words = " ".join(f"w{i % 97} yes, no." for i in range(20_000))  # ~250k chars
    parts = {"document": "a short document", "query": "q", "instruction": None}
    parts[huge] = words
    pair = (str(parts["query"]), str(parts["document"]))
    seen: list[int] = []
    tokenize = tokenizer.encode_without_specials

    def counting(texts: Sequence[str]) -> list[Encoding]:
        seen.extend(len(t) for t in texts)
        return tokenize(texts)

    monkeypatch.setattr(tokenizer, "encode_without_specials", counting)
    [cut] = pairs.encode([pair], instruction=parts["instruction"], truncate=True,
                         truncation_direction=direction)  # fmt: skip
    assert max(seen) < len(words) // 10  # the whole part was never tokenized
    monkeypatch.setattr(tokenizer, "cut_long", lambda text, direction, tokens=None: text)
    [whole] = pairs.encode([pair], instruction=parts["instruction"], truncate=True,
                           truncation_direction=direction)  # fmt: skip
    assert cut.ids == whole.ids and len(cut.ids) == tokenizer.max_input_length


def test_single_texts_are_refused_and_token_ids_pass(tokenizer: Tokenizer) -> None:
    pairs = PromptedPairs(PROMPT, tokenizer)
    with pytest.raises(ValidationError, match="pairs"):
        pairs.encode(["alone"], instruction=None, truncate=True, truncation_direction="right")
    [enc] = pairs.encode([[5, 6, 7]], instruction=None, truncate=True,
                         truncation_direction="right")  # fmt: skip
    assert enc.ids == (5, 6, 7)


def test_other_artifacts_are_written_and_read_as_before(embed_artifact: Built) -> None:
    data = (embed_artifact.root / MANIFEST_NAME).read_bytes()
    assert b"generative_rerank" not in data
    assert read_manifest(embed_artifact.root).generative_rerank is None
    with_prompt = msgspec.structs.replace(
        embed_artifact.manifest, generative_rerank=GenerativeRerank(prompt=PROMPT)
    )
    assert decode_manifest(encode_manifest(with_prompt)) == with_prompt


def test_an_instruction_for_a_cross_encoder_is_refused(make_artifact: ArtifactFactory) -> None:
    import tei_runtime

    model = tei_runtime.load(make_artifact(task=Task.RERANK, labels=1).root)
    assert model.predict([("q", "d")]).shape == (1, 1)
    with pytest.raises(ValidationError, match="generative rerankers"):
        model.predict([("q", "d")], instruction="find it")


def test_a_budget_the_default_instruction_fills_is_refused_or_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A low --max-batch-tokens left room for the prompt but not for a document: every
    document was cut away and all scored alike, with no word at start."""
    path = tmp_path / "tokenizer.json"
    build_qwen_tokenizer().save(str(path))
    roomy = PromptedPairs(PROMPT, Tokenizer(path, max_input_length=1000))
    [empty] = roomy.tokenizer.ids_without_specials([format_pair(PROMPT, "", "", None)])
    taken = len(roomy.prefix_ids) + len(roomy.suffix_ids) + len(empty)
    with pytest.raises(ManifestError, match="so no document would be scored"):
        PromptedPairs(PROMPT, Tokenizer(path, max_input_length=taken))
    with caplog.at_level(logging.WARNING, logger="tei_runtime"):
        PromptedPairs(PROMPT, Tokenizer(path, max_input_length=taken + 10))
    assert any("leaves 10 of" in r.getMessage() for r in caplog.records)
