"""`protocol.decode`, the one JSON decoding path: every malformed body is TEI's 400 or 422."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tei_serve.errors import BodyError, ErrorType, ValidationError
from tei_serve.http.protocol import (
    DecodeRequest,
    EmbedRequest,
    RerankRequest,
    SimilarityRequest,
    _bracket_depth,
    decode,
    parse_ids,
    parse_inputs,
)

DEEP = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(("body", "status"), [
    (DEEP, 400),                                            # nested 100,000 deep
    (b'{"inputs": ' + b"[" * 100_000, 400),                 # ... and cut short
    (b'{"inputs": "a", "dimensions": NaN}', 400),           # NaN literal
    (b'{"inputs": "a", "dimensions": Infinity}', 400),
    (b'{"inputs": "\xff\xfe"}', 400),                       # invalid UTF-8
    (b'{"inputs": "\xed\xa0\x80"}', 400),                   # an encoded surrogate
    (b'{"inputs": "abc', 400),                              # stops halfway
    (b'{"inputs": ["a", "b"', 400),
    (b"", 400),
    (b'{"inputs": "a"} trailing', 400),
    (b'{"inputs": "a", "dimensions": 1e400}', 400),         # past float64: serde's syntax
    (b'{"inputs": [1e400]}', 400),
    (b'{"inputs": ' + b"[" * 127 + b"]" * 127 + b"}", 400),  # serde_json's depth limit (128)
    (b'{"inputs": ' + b"[ " * 127 + b"] " * 127 + b"}", 400),  # ... with spaces between
    (b'{"inputs": ' + b'{"a": ' * 127 + b"1" + b"}" * 128, 400),  # ... as objects
    (b'{"inputs": "a", "dimensions": 123456789012345678901234567890}', 422),
    (b'{"inputs": "a", "dimensions": -1}', 422),
    (b'{"inputs": "a", "normalize": 1}', 422),
    (b'{"inputs": "a", "inputs": "b"}', 422),               # duplicate key
    (b'{"truncate": true}', 422),                           # missing field
    (b'[1, 2]', 422),
])  # fmt: skip
def test_malformed_bodies_are_400_or_422(body: bytes, status: int) -> None:
    with pytest.raises(BodyError) as e:
        decode(body, EmbedRequest)
    assert e.value.http_status == status
    assert e.value.error_type is ErrorType.VALIDATION


def test_nesting_under_serde_jsons_limit_is_only_the_wrong_shape() -> None:
    """127 containers deep (the body's object and 126 arrays) deserializes in TEI and fails
    as a wrong shape: 422, where one more is its syntax error, 400."""
    body = b'{"inputs": ' + b"[" * 126 + b"]" * 126 + b"}"
    _refused_422(body, EmbedRequest, lambda r: parse_inputs(r.inputs))
    unknown = b'{"inputs": "a", "x": ' + b"[" * 200 + b"]" * 200 + b"}"
    assert decode(unknown, EmbedRequest).inputs == "a"  # an unknown field is skipped unread
    # A /vertex instance sits two levels down in its body: the limit counts those too.
    instance = b'{"inputs": ' + b"[" * 125 + b"]" * 125 + b"}"
    assert decode(instance, EmbedRequest).inputs is not None
    with pytest.raises(BodyError, match="recursion limit exceeded"):
        decode(instance, EmbedRequest, nested_in=2)
    # brackets inside strings are text, however they are escaped
    texts = b'{"inputs": ["' + b"[[[\\\\" * 200 + b'", "\\"[[[" ]}'
    assert decode(texts, EmbedRequest).inputs == ["[[[\\" * 200, '"[[[']
    assert _bracket_depth(texts) == 2  # what gates the walk: the strings left out


def test_duplicate_keys() -> None:
    with pytest.raises(BodyError, match="duplicate field `query`"):
        decode(b'{"query": "a", "texts": ["x"], "query": "b"}', RerankRequest)
    body = b'{"inputs": {"source_sentence": "a", "sentences": [], "sentences": ["b"]}}'
    with pytest.raises(BodyError, match="duplicate field `sentences`"):
        decode(body, SimilarityRequest)
    with pytest.raises(BodyError, match="duplicate field `inputs`"):
        decode(b'{"inputs" : "a",\n "normalize": true, "inputs"\n\t: "b"}', EmbedRequest)
    # A field's name inside a text, or the same name in two different objects, is no duplicate.
    ok = decode(b'{"inputs": "say \\"inputs\\" twice: \\"inputs\\"", "x": {"inputs": 1}}',
                EmbedRequest)
    assert ok.inputs == 'say "inputs" twice: "inputs"'
    # Unknown fields are ignored, as TEI does, even when repeated, and so are repeats inside
    # them or inside a field decoded as any JSON (serde_json's Value keeps the last).
    assert decode(b'{"inputs": "a", "x": 1, "x": 2}', EmbedRequest).inputs == "a"
    body = b'{"inputs": "a", "meta": {"normalize": 1, "normalize": 2}}'
    assert decode(body, EmbedRequest).normalize is True
    assert decode(b'{"ids": {"ids": 1, "ids": 2}}', DecodeRequest).ids == {"ids": 2}
    # A /vertex instance is read as a Value first: its repeats are kept, the last winning.
    instance = b'{"inputs": "a", "normalize": true, "normalize": false}'
    assert decode(instance, EmbedRequest, nested_in=2).normalize is False
    # An escaped text that is no key, or an escaped unknown key, is no duplicate.
    escaped = b'{"inputs": ["caf\\u00e9", "\\u00e9"], "\\u0078": 1}'
    assert decode(escaped, EmbedRequest).inputs == ["caf\u00e9", "\u00e9"]


def _refused_422(body: bytes, type_: type[Any], parse: Callable[[Any], object]) -> None:
    """Refused with 422 either while decoding or while reading the ids, as a body that does
    not deserialize (TEI's ids are u32)."""
    with pytest.raises(ValidationError) as e:
        parse(decode(body, type_))
    assert e.value.http_status == 422, e.value.message
    assert e.value.message.startswith("Failed to deserialize the JSON body"), e.value.message


def test_huge_token_ids_are_422() -> None:
    for ids in ("[4294967296]", "[18446744073709551616]", "[1e30]", "[1.0]",
                "[[1], [4294967296]]", "[-1]"):
        _refused_422(f'{{"inputs": {ids}}}'.encode(), EmbedRequest,
                     lambda r: parse_inputs(r.inputs))
        _refused_422(f'{{"ids": {ids}}}'.encode(), DecodeRequest, lambda r: parse_ids(r.ids))
    assert parse_inputs([2**32 - 1]) == ([[2**32 - 1]], False)
    assert parse_ids([[0, 2**32 - 1]]) == [[0, 2**32 - 1]]


def test_a_lone_surrogate_escape_is_named_not_called_truncation() -> None:
    # msgspec calls a high-surrogate escape with no low one after it "Input data was truncated"
    for body, at in ((b'{"inputs": "\\ud800"}', 12), (b'{"inputs": "a\\\\\\uDBFF"}', 15)):
        with pytest.raises(BodyError) as e:
            decode(body, EmbedRequest)
        assert e.value.http_status == 400
        assert str(e.value) == ("Failed to parse the request body as JSON: lone leading "
                                f"surrogate in hex escape (byte {at})")
    with pytest.raises(BodyError, match=r"JSON: Input data was truncated$"):
        decode(b'{"inputs": "abc', EmbedRequest)  # truly cut short: msgspec's words stand
    # an escaped backslash before `u` is text, and a full pair is one character
    assert decode(b'{"inputs": "\\\\ud800"}', EmbedRequest).inputs == "\\ud800"
    assert decode(b'{"inputs": "\\ud800\\udc00"}', EmbedRequest).inputs == "\U00010000"
