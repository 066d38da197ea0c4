from __future__ import annotations

import time

import numpy as np
import pytest
from rt_artifacts import VOCAB, ArtifactFactory, Built

from tei_runtime import load
from tei_runtime.errors import InputTooLongError, ValidationError
from tei_runtime.tokenization import CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN, cut_point

CLS, SEP = VOCAB["[CLS]"], VOCAB["[SEP]"]


def words(n: int, offset: int = 0) -> str:
    return " ".join(f"w{(i + offset) % 40}" for i in range(n))


def ids_of(n: int, offset: int = 0) -> list[int]:
    return [VOCAB[f"w{(i + offset) % 40}"] for i in range(n)]


def test_specials_and_offsets(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    (enc,) = m.encode(["Hello world"])
    assert enc.ids == (CLS, VOCAB["hello"], VOCAB["world"], SEP)
    assert enc.type_ids == (0, 0, 0, 0)
    assert enc.offsets == ((0, 0), (0, 5), (6, 11), (0, 0))
    assert len(enc) == 4
    (bare,) = m.encode(["Hello world"], add_special_tokens=False)
    assert bare.ids == (VOCAB["hello"], VOCAB["world"])


def test_empty_string_is_allowed(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    assert m.encode([""])[0].ids == (CLS, SEP)
    assert m.encode([""], add_special_tokens=False)[0].ids == ()


@pytest.mark.parametrize("direction", ["right", "left"])
def test_truncation_directions(embed_artifact: Built, direction: str) -> None:
    m = load(embed_artifact.root)
    (enc,) = m.encode([words(30)], truncation_direction=direction)  # type: ignore[arg-type]
    assert len(enc) == m.max_input_length == 16
    body = ids_of(30)
    kept = body[:14] if direction == "right" else body[-14:]
    assert enc.ids == (CLS, *kept, SEP)


def test_too_long_without_truncation_is_a_tei_style_error(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    with pytest.raises(InputTooLongError) as info:
        m.encode([words(30)], truncate=False)
    assert str(info.value) == (
        "Input validation error: `inputs` must have less than 16 tokens. Given: 32"
    )
    assert isinstance(info.value, ValidationError)
    assert (info.value.length, info.value.limit) == (32, 16)
    assert len(m.encode([words(14)], truncate=False)[0]) == 16  # exactly the limit is fine


def test_pairs_get_type_ids_and_longest_first_truncation(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    (enc,) = m.encode([("the query", "a passage")])
    assert enc.ids == (
        CLS,
        VOCAB["the"],
        VOCAB["query"],
        SEP,
        VOCAB["a"],
        VOCAB["passage"],
        SEP,
    )
    assert enc.type_ids == (0, 0, 0, 0, 1, 1, 1)
    (long,) = m.encode([("cat dog", words(40))])
    assert len(long) == 16
    assert long.ids[:4] == (CLS, VOCAB["cat"], VOCAB["dog"], SEP)


def test_id_inputs_are_decoded_tokenized_again_and_truncated(
    embed_artifact: Built, caplog: pytest.LogCaptureFixture
) -> None:
    m = load(embed_artifact.root)
    (enc,) = m.encode([[5, 6, 7]])
    assert enc.ids == (5, 6, 7) and enc.type_ids == (0, 0, 0)
    # Specials given as ids stay; none are added (TEI's `tokenize_input`).
    (framed,) = m.encode([[CLS, 5, SEP]])
    assert framed.ids == (CLS, 5, SEP)
    (right,) = m.encode([list(range(4, 34))])
    (left,) = m.encode([tuple(range(4, 34))], truncation_direction="left")
    assert right.ids == tuple(range(4, 20)) and left.ids == tuple(range(18, 34))
    with pytest.raises(InputTooLongError):
        m.encode([list(range(4, 34))], truncate=False)
    # Ids the vocabulary lacks drop out in the decoding, as TEI's tokenizer decode drops them.
    assert not [r for r in caplog.records if "outside the vocabulary" in r.message]
    assert m.encode([[5, 10_000, 6]])[0].ids == m.encode([[5, 6]])[0].ids
    m.encode([[5, 10_001]])
    # one warning, the first time: tiktoken ids from an OpenAI client embed as noise
    [warned] = [r for r in caplog.records if "outside the vocabulary" in r.message]
    assert warned.levelname == "WARNING" and "check_embedding_ctx_length" in warned.message
    assert warned.message.startswith(f"{m.manifest.source.model_id}: ")  # which model, of several
    with pytest.raises(ValidationError, match="no token id is in the vocabulary"):
        m.encode([[10_000, 20_000]])
    with pytest.raises(ValidationError, match="32 bits"):
        m.encode([[5, 2**32]])
    with pytest.raises(ValidationError, match="string"):
        m.encode([3.5])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="token ids"):
        m.encode([[1.5, 2.0]])  # type: ignore[list-item]
    assert m.encode([np.array([5, 6])])[0].ids == (5, 6)


def test_mixed_batch_keeps_order(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    out = m.encode(["cat", [9, 9], ("a", "the"), "dog"])
    assert [e.ids for e in out] == [
        (CLS, VOCAB["cat"], SEP),
        (9, 9),
        (CLS, VOCAB["a"], SEP, VOCAB["the"], SEP),
        (CLS, VOCAB["dog"], SEP),
    ]


def test_prompts(make_artifact: ArtifactFactory) -> None:
    built = make_artifact(prompts={"query": "query : ", "doc": "passage : "})
    m = load(built.root)
    (q,) = m.encode(["cat"], prompt_name="query")
    assert q.ids == (CLS, VOCAB["query"], VOCAB[":"], VOCAB["cat"], SEP)
    (free,) = m.encode(["cat"], prompt="search : ")
    assert free.ids == (CLS, VOCAB["search"], VOCAB[":"], VOCAB["cat"], SEP)
    (plain,) = m.encode(["cat"])
    assert plain.ids == (CLS, VOCAB["cat"], SEP)
    with pytest.raises(ValidationError) as bad:
        m.encode(["cat"], prompt_name="nope")
    assert str(bad.value) == (  # TEI's words, which name its flag even for a request's field
        "Input validation error: `default-prompt-name` is set to `nope` but it was not found "
        'in the Sentence Transformers prompts. Available prompts: ["query", "doc"]')
    with pytest.raises(ValidationError, match="not both"):
        m.encode(["cat"], prompt_name="query", prompt="x")
    # Token ids under a prompt are decoded and encoded again with it and the specials; a
    # prompt set to "" too (TEI's `Some("")`, e.g. a model's `"passage": ""`), not as none.
    cat = VOCAB["cat"]
    assert m.encode([[cat]], prompt="search : ")[0].ids == free.ids
    assert m.encode([[cat]], prompt="")[0].ids == (CLS, cat, SEP)
    assert m.encode([[cat]])[0].ids == (cat,)
    # As TEI: prompted ids are decoded without their specials and tokenized with new ones.
    (ids,) = m.encode([[CLS, VOCAB["cat"], SEP]], prompt_name="query")
    assert ids.ids == (CLS, VOCAB["query"], VOCAB[":"], VOCAB["cat"], SEP)


def test_default_prompt_applies_unless_overridden(make_artifact: ArtifactFactory) -> None:
    built = make_artifact(prompts={"query": "query : "}, default_prompt_name="query")
    m = load(built.root)
    assert m.encode(["cat"])[0].ids[1:3] == (VOCAB["query"], VOCAB[":"])
    assert m.encode(["cat"], prompt="")[0].ids == (CLS, VOCAB["cat"], SEP)
    assert m.tokenize(["cat"])[0][1].text == "query"


def test_a_10mb_string_costs_no_more_than_a_long_one(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    huge = words(2_000_000)  # ~8 MB
    start = time.perf_counter()
    (right,) = m.encode([huge])
    (left,) = m.encode([huge], truncation_direction="left")
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5
    assert right.ids == (CLS, *ids_of(14), SEP)
    tail = huge.split()[-14:]
    assert left.ids == (CLS, *[VOCAB[t] for t in tail], SEP)
    (pair,) = m.encode([("cat", huge)])
    assert len(pair) == 16


def test_cut_is_widened_when_it_would_change_the_result(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    # Long whitespace runs: the tight char budget holds fewer than 16 tokens, TEI's does.
    spaced = (" " * 200).join(["cat"] * 50)
    assert len(spaced) > 16 * MAX_CHARS_PER_TOKEN
    (enc,) = m.encode([spaced])
    assert enc.ids == (CLS, *[VOCAB["cat"]] * 14, SEP)
    (left,) = m.encode([spaced], truncation_direction="left")
    assert left.ids == enc.ids


def test_a_text_sparser_than_teis_cut_is_cut_as_tei_cuts_it(embed_artifact: Built) -> None:
    """More than 250 chars a token (TEI's cut): what TEI's cut leaves is embedded, and no
    more than that is tokenized, however long the text."""
    m = load(embed_artifact.root)
    limit = 16 * MAX_CHARS_PER_TOKEN
    sparse = (" " * 600).join(["cat"] * 5000)  # 3 MB, 5,000 tokens
    kept = m.tokenizer.cut_long(sparse, "right")
    assert len(kept) <= limit
    assert kept.split() == ["cat"] * len(kept.split()) and 5 <= len(kept.split()) <= 7
    (enc,) = m.encode([sparse])
    assert enc.ids == (CLS, *[VOCAB["cat"]] * len(kept.split()), SEP)
    assert len(m.tokenizer.cut_long("x" * 3_000_000, "left")) == limit  # one endless word
    # TEI's cut to the character, a word across it kept in part (not cut back to whitespace)
    straddling = " " * (limit - 5) + "catcat" + " cat" * 1000
    assert m.tokenizer.cut_long(straddling, "right") == " " * (limit - 5) + "catca"
    assert m.tokenizer.cut_long(straddling[::-1], "left") == "actac" + " " * (limit - 5)


def test_cut_point_prefers_whitespace() -> None:
    assert cut_point("a" * 95 + " " + "b" * 20, 100, "right") == "a" * 95
    assert cut_point("b" * 20 + " " + "a" * 95, 100, "left") == "a" * 95
    assert cut_point("x" * 30, 10, "right") == "x" * 10
    assert cut_point("short", 10, "right") == "short"
    assert CHARS_PER_TOKEN >= 10


def test_tokenize_gives_tei_tokens_with_byte_offsets(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    (tokens,) = m.tokenize(["Naïve café"])
    assert [(t.id, t.text, t.special, t.start, t.stop) for t in tokens] == [
        (CLS, "[CLS]", True, None, None),
        (VOCAB["naïve"], "Naïve", False, 0, 6),
        (VOCAB["café"], "café", False, 7, 12),
        (SEP, "[SEP]", True, None, None),
    ]
    (bare,) = m.tokenize(["cat"], add_special_tokens=False)
    assert [t.text for t in bare] == ["cat"]
    (prompted,) = m.tokenize(["cat"], prompt_name="query")
    assert [t.text for t in prompted] == ["[CLS]", "query", ":", "cat", "[SEP]"]
    assert prompted[3].start == 8
    (pair,) = m.tokenize([("cat", "dog")])
    assert [(t.text, t.start) for t in pair if not t.special] == [("cat", 0), ("dog", 0)]
    # /tokenize does not truncate
    assert len(m.tokenize([words(30)])[0]) == 32


def test_decode(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    ids = [[CLS, VOCAB["cat"], VOCAB["sat"], SEP]]
    assert m.decode(ids) == ["cat sat"]
    assert m.decode(ids, skip_special_tokens=False) == ["[CLS] cat sat [SEP]"]
    assert m.decode(np.array(ids)) == ["cat sat"]  # rows as arrays, e.g. from a batch
    # the common mistakes: one flat list, a string; said so, not a Python internals message
    for wrong in (ids[0], "abc"):
        with pytest.raises(ValidationError, match=r"list of token id lists, one per text"):
            m.decode(wrong)  # type: ignore[arg-type]


def test_argument_types_are_validation_errors(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    with pytest.raises(ValidationError, match=r"`prompt_name` must be a string; got list"):
        m.embed(["a"], prompt_name=["query"])  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"`truncation_direction` must be left or right"):
        m.encode(["a"], truncation_direction="up")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"`instruction` must be a string; got int"):
        m.encode(["a"], instruction=5)  # type: ignore[arg-type]


def test_default_truncation_direction_comes_from_the_manifest(
    make_artifact: ArtifactFactory,
) -> None:
    m = load(make_artifact(truncation_side="left").root)
    assert m.encode([words(30)])[0].ids == (CLS, *ids_of(30)[-14:], SEP)
    assert m.encode([words(30)], truncation_direction="right")[0].ids == (CLS, *ids_of(14), SEP)


def test_a_bare_string_is_not_a_batch(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    with pytest.raises(ValidationError, match="list"):
        m.encode("cat")
    with pytest.raises(ValidationError, match="list"):
        m.tokenize("cat")


def test_a_lone_surrogate_is_refused_naming_its_input(embed_artifact: Built) -> None:
    """JSON's `"\\ud83d"` (half an escaped emoji) makes a Python string UTF-8 cannot encode:
    tokenizers' own error named neither the input nor the reason."""
    m = load(embed_artifact.root)
    with pytest.raises(ValidationError, match=r"input 2 is not valid text: .*lone surrogate"):
        m.encode(["cat", "dog", "cat \ud83d", "dog"])
    with pytest.raises(ValidationError, match="input 0 is not valid text"):
        m.encode([("cat", "dog \udfff")])
    assert len(m.encode(["cat \U0001f600"])) == 1  # the whole emoji is text


def test_a_pair_may_be_a_list_of_two_strings(embed_artifact: Built) -> None:
    """sentence-transformers' CrossEncoder takes `[[query, passage]]`: so does the runtime."""
    m = load(embed_artifact.root)
    assert m.encode([["cat dog", "dog"]]) == m.encode([("cat dog", "dog")])
    assert m.encode([[5, 6]])[0].ids == (5, 6)  # two ints are still token ids


def _split(enc: object) -> tuple[int, int]:
    """Tokens of the query and of the passage in a pair's encoding (specials left out)."""
    type_ids = enc.type_ids  # type: ignore[attr-defined]
    return type_ids.count(0) - 2, type_ids.count(1) - 1


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_pair_keeps_which_side_is_longer(embed_artifact: Built, direction: str) -> None:
    """Longest-first gives the odd token of the pair budget (16 - 3 specials = 13) to the
    side with more tokens. The query here has more tokens but more characters per token:
    a cut of each side to a few characters a token would make it the shorter side, and the
    split would flip (TEI cuts nothing under 16 * 250 characters)."""
    m = load(embed_artifact.root)
    query = "cat " * 200  # 800 chars, 200 tokens
    passage = "a!" * 90  # 180 chars, 180 tokens
    assert len(query) > 16 * CHARS_PER_TOKEN and len(query + passage) < 16 * MAX_CHARS_PER_TOKEN
    plain = m.tokenizer._left if direction == "left" else m.tokenizer._right
    expected = plain.encode(query, passage)
    (enc,) = m.encode([(query, passage)], truncation_direction=direction)  # type: ignore[arg-type]
    assert enc.ids == tuple(expected.ids)
    assert _split(enc) == (7, 6)
    (swapped,) = m.encode([(passage, query)], truncation_direction=direction)  # type: ignore[arg-type]
    assert _split(swapped) == (6, 7)


def test_a_long_pair_is_cut_as_tei_cuts_it(embed_artifact: Built) -> None:
    """Over 16 * 250 characters, TEI cuts each side to 2,000 bytes before tokenizing; a
    side whose 2,000th byte is inside a character it leaves whole. What is left tokenizes
    to what TEI's tokenizer gives for it (cut further only where that changes nothing)."""
    from tei_runtime.tokenization import _cut_bytes

    m = load(embed_artifact.root)
    half = 16 * MAX_CHARS_PER_TOKEN // 2
    long = "cat " * 3000
    assert _cut_bytes(long, half, "right") == long[:half]
    assert _cut_bytes(long, half, "left") == long[-half:]
    accented = "é" * 4500  # 2 bytes each: byte 2,000 starts a character
    assert _cut_bytes(accented, half, "right") == "é" * (half // 2)
    odd = "a" + "é" * 4500  # byte 2,000 is the second half of an é
    assert _cut_bytes(odd, half, "right") == odd
    assert _cut_bytes("cat " * 10, half, "right") == "cat " * 10
    for direction, kept in (("right", long[:half]), ("left", long[-half:])):
        plain = m.tokenizer._left if direction == "left" else m.tokenizer._right
        (enc,) = m.encode([(long, "dog")], truncation_direction=direction)  # type: ignore[arg-type]
        assert enc.ids == tuple(plain.encode(kept, "dog").ids)


def test_two_long_sides_are_cut_without_flipping_which_is_longer(embed_artifact: Built) -> None:
    """Both sides far past the budget, under TEI's cut: each is cut tightly (tokenizers'
    pair truncation is quadratic in what it is given) only where the longer side stays
    the longer; the pair encodes as the uncut pair does, either way round."""
    m = load(embed_artifact.root)
    denser = "a!" * 800  # 1,600 tokens in 1,600 characters
    sparser = "cat " * 500  # 500 tokens in 2,000 characters: fewer tokens, more characters
    for pair in ((denser, sparser), (sparser, denser), (sparser, sparser[:-8])):
        assert len(pair[0] + pair[1]) <= 16 * MAX_CHARS_PER_TOKEN  # no TEI cut: all of it
        for direction in ("right", "left"):
            plain = m.tokenizer._left if direction == "left" else m.tokenizer._right
            (enc,) = m.encode([pair], truncation_direction=direction)  # type: ignore[arg-type]
            assert enc.ids == tuple(plain.encode(*pair).ids), (pair[0][:8], direction)
