"""HTTP wire types: TEI's request and response bodies (`router/src/http/types.rs`).

Request structs accept unknown fields, as TEI does. `inputs` unions that msgspec cannot express
(a list of token ids is ONE input, a list of strings is a batch) are decoded as `Any` and
resolved by `parse_inputs` / `parse_predict_inputs` with TEI's rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar, get_args

import msgspec
import numpy as np
from litestar import HttpMethod

from tei_serve.errors import BodyError, EmptyError
from tei_serve.serving import Direction

WireDirection = Literal["right", "left", "Right", "Left"]
RawInput = str | list[int]
# TEI's `usize` fields: a negative number, or one past what msgspec bounds (2^63), is a 422.
USize = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class EmbedRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Any
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    prompt_name: str | None = None
    normalize: bool = True
    dimensions: USize | None = None
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class EmbedAllRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Any
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    prompt_name: str | None = None
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class PredictRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Any
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    raw_scores: bool = False
    instruction: str | None = None
    """Generative rerankers only (not in TEI's API): the instruction in their prompt."""
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class RerankRequest(msgspec.Struct, frozen=True, kw_only=True):
    query: str
    texts: list[str]
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    raw_scores: bool = False
    return_text: bool = False
    instruction: str | None = None
    """Generative rerankers only (not in TEI's API): the instruction in their prompt."""
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class SimilarityInput(msgspec.Struct, frozen=True, kw_only=True):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(msgspec.Struct, frozen=True, kw_only=True):
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    prompt_name: str | None = None


class SimilarityRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class TokenizeRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class DecodeRequest(msgspec.Struct, frozen=True, kw_only=True):
    ids: Any
    skip_special_tokens: bool = True
    model: Any = None
    """With several models: the served model name that answers (not in TEI's API, whose
    server ignores the field: a value that is not a string is ignored here too)."""


class OpenAIRequest(msgspec.Struct, frozen=True, kw_only=True):
    input: Any
    model: str | None = None
    """With several models: the served model name that answers."""
    user: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: USize | None = None


# -- responses (the rest are serving's result Structs, encoded as they are) -----------------


class SparseValue(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    value: float


class OpenAIEmbedding(msgspec.Struct, frozen=True, kw_only=True):
    object: str
    embedding: msgspec.Raw | str
    """The vector's JSON text (tei_serve.http.floats), or base64 of its float32 bytes."""
    index: int


class OpenAIUsage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class OpenAIResponse(msgspec.Struct, frozen=True, kw_only=True):
    object: str
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIModel(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of `GET /v1/models` (OpenAI's model object)."""

    id: str
    object: str
    created: int
    owned_by: str


class OpenAIModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: str
    data: list[OpenAIModel]


class VertexRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Vertex AI's prediction body: each instance is the body of one request."""

    instances: list[msgspec.Raw]


class Named(msgspec.Struct, frozen=True):
    """Just the `model` field of any request body (for `/`, which decodes by the model); any
    JSON type, so a non-string one is judged where every route's is (routes.pick)."""

    model: Any = None


# -- decoding --------------------------------------------------------------------------------

T = TypeVar("T")

DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (
        EmbedRequest, EmbedAllRequest, PredictRequest, RerankRequest, SimilarityRequest,
        TokenizeRequest, DecodeRequest, OpenAIRequest, VertexRequest, Named,
    )
}
ENCODER = msgspec.json.Encoder()
GET_HEAD = [HttpMethod.GET, HttpMethod.HEAD]
"""TEI's GET routes (axum's `get`) answer HEAD too: load balancers probe /health with it."""


def decode(body: bytes, type_: type[T], *, nested_in: int = 0) -> T:
    """The one way a request body becomes a request: every failure is TEI's 400 or 422.

    Malformed JSON (a syntax error, invalid UTF-8, a `NaN` literal, a number past float64, a
    body that stops halfway, a field nested past serde_json's depth limit or the interpreter's
    recursion limit) answers 400; JSON of the wrong shape (a wrong type, a missing field, a
    number out of its field's range, a known field given twice) 422, as axum's `Json` does
    with serde. `nested_in`: how deep inside the request's body this value sits (a /vertex
    instance: 2), which serde's depth limit counts too; such a value's shape errors carry no
    axum prefix (TEI decodes an instance with serde_json itself and answers serde's message).
    """
    shape = f"{_SHAPE}: " if nested_in == 0 else ""
    try:
        value: T = DECODERS[type_].decode(body)
    except msgspec.ValidationError as e:
        if str(e).startswith(_FLOAT_OVERFLOW):  # serde_json's NumberOutOfRange: syntax, 400
            raise BodyError(f"{_SYNTAX}: {e}", status=400) from e
        raise BodyError(f"{shape}{e}") from e
    except msgspec.DecodeError as e:
        raise BodyError(f"{_SYNTAX}: {_syntax_detail(body, e)}", status=400) from e
    except RecursionError as e:
        raise BodyError(f"{_SYNTAX}: nested too deeply", status=400) from e
    # serde_json's depth limit counts the decoded fields (unknown ones are skipped without
    # it), so the value is walked, but only where the body's brackets could nest that deep:
    # the walk of a 2 MB body of `[[[1]],...` took seconds of the event loop; the counts take
    # microseconds, the bracket scan milliseconds.
    limit = SERDE_DEPTH_LIMIT - nested_in
    if (
        body.count(b"[") + body.count(b"{") >= limit
        and _bracket_depth(body) >= limit
        and _nesting(value) >= limit
    ):
        raise BodyError(f"{_SYNTAX}: recursion limit exceeded", status=400)
    # A /vertex instance is read by TEI as serde_json's Value first, which keeps the last
    # of a repeated key: only a body's own fields can be refused as repeated.
    duplicate = _duplicate_field(body, type_) if nested_in == 0 else None
    if duplicate is not None:
        raise BodyError(f"{shape}duplicate field `{duplicate}`")
    return value


SERDE_DEPTH_LIMIT = 128
"""serde_json refuses a value nested this deep (the body's object counts as one) while
deserializing it, a syntax error TEI answers 400; the fields decoded as any JSON (`inputs`)
are where a request can nest that far and reach the handler."""


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # unrolled: runs, not characters
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def _bracket_depth(body: bytes) -> int:
    """How deep a well-formed JSON text's arrays and objects nest, strings left out: a bound
    on the decoded request's nesting (which drops unknown fields), found without a walk."""
    steps = _DEPTH_STEP[np.frombuffer(_JSON_STRING.sub(b"", body), dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def _nesting(request: object) -> int:
    """How many arrays and objects deep the request's decoded fields go, the request's own
    object counting as one (as serde_json counts)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(request, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, msgspec.Struct):
            items: Iterable[object] = (getattr(value, f) for f in value.__struct_fields__)
        elif isinstance(value, dict):
            items = value.values()
        elif isinstance(value, list):
            items = value
        else:
            continue
        stack.extend(
            (item, depth + 1) for item in items if isinstance(item, list | dict | msgspec.Struct)
        )
    return deepest


def _syntax_detail(body: bytes, error: msgspec.DecodeError) -> str:
    """msgspec's words, except where they mislead: it reports a `\\ud800`-style escape with
    no low surrogate after it as "Input data was truncated", even mid-body."""
    detail = str(error)
    if detail == "Input data was truncated" and (lone := _LONE_HIGH_SURROGATE.search(body)):
        return f"lone leading surrogate in hex escape (byte {lone.end() - 6})"
    return detail


# A \uD800-\uDBFF escape (after an even run of backslashes: not itself escaped) that no
# \uDC00-\uDFFF escape follows.
_LONE_HIGH_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)

_FLOAT_OVERFLOW = "Number out of range"
"""msgspec's words for a number literal past float64 (`1e400`)."""
_SHAPE = "Failed to deserialize the JSON body into the target type"
_SYNTAX = "Failed to parse the request body as JSON"


def _structs_in(type_: Any) -> list[type[msgspec.Struct]]:
    """The Struct types a field's type names (itself, or the members of its union)."""
    if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        return [type_]
    return [t for arg in get_args(type_) for t in _structs_in(arg)]


def _field_names(type_: type[msgspec.Struct]) -> frozenset[str]:
    """The wire names of `type_`'s fields and of the Structs nested in it."""
    names = set(type_.__struct_encode_fields__)
    for field in msgspec.structs.fields(type_):
        for nested in _structs_in(field.type):
            names |= _field_names(nested)
    return frozenset(names)


def _key_pattern(names: frozenset[str]) -> re.Pattern[bytes]:
    """Matches `"name":` for the given names; in JSON only an object key is followed by `:`."""
    alternatives = b"|".join(re.escape(name.encode()) for name in sorted(names))
    return re.compile(rb'"(' + alternatives + rb')"\s*:')


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key-value pairs in body order, repeats kept."""


def _duplicate_field(body: bytes, type_: type[Any]) -> str | None:
    """A field of `type_` given twice in one object that serde deserializes into a struct:
    the body's own, and those of its Struct-typed fields (msgspec keeps the last; serde
    refuses). Repeats inside a field decoded as any JSON, or an unknown one, are kept as
    serde_json's Value keeps them (the last wins)."""
    # One cheap pass first: a key given twice in one object is matched twice in the body.
    seen = KEY_PATTERNS[type_].findall(body)
    # (A key spelled with \u escapes is not matched: `"dim\u0065nsions"` beside `"dimensions"`
    # is taken, the last winning; finding such keys cost more than the decode on long
    # escaped texts.)
    if len(seen) == len(set(seen)):
        return None
    try:
        tree = json.loads(body, object_pairs_hook=_Pairs)
    except RecursionError as e:  # msgspec's limit and the json module's differ
        raise BodyError(f"{_SYNTAX}: nested too deeply", status=400) from e
    return _repeated(tree, type_)


def _repeated(value: Any, type_: type[msgspec.Struct]) -> str | None:
    if not isinstance(value, _Pairs):
        return None
    fields = {f.encode_name: f for f in msgspec.structs.fields(type_)}
    keys = [k for k, _ in value]
    twice = sorted(k for k in set(keys) if k in fields and keys.count(k) > 1)
    if twice:
        return twice[0]
    last = dict(value)  # the value msgspec decoded for each field
    for name, field in fields.items():
        for nested in _structs_in(field.type):
            if (found := _repeated(last.get(name), nested)) is not None:
                return found
    return None


FIELD_NAMES: dict[type[Any], frozenset[str]] = {t: _field_names(t) for t in DECODERS}
KEY_PATTERNS: dict[type[Any], re.Pattern[bytes]] = {
    t: _key_pattern(names) for t, names in FIELD_NAMES.items()
}


def direction_of(value: WireDirection) -> Direction:
    return "left" if value.lower() == "left" else "right"


def _is_ids(value: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in value)


U32_MAX = 2**32 - 1


def _check_u32(ids: list[int]) -> None:
    """TEI's token ids are u32: a larger one does not deserialize (422), it is no huge id."""
    if any(v < 0 or v > U32_MAX for v in ids):
        raise BodyError(f"{_SHAPE}: token ids must be in [0, 2^32)")


def _one(value: Any, field: str) -> RawInput:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and _is_ids(value):
        _check_u32(value)
        return value
    raise BodyError(
        f"Failed to deserialize the JSON body into the target type: `{field}` must be a "
        "string, a list of token ids or a list of them"
    )


def parse_inputs(value: Any, *, field: str = "inputs") -> tuple[list[RawInput], bool]:
    """TEI's `Input`: returns (inputs, is_batch). `[1, 2, 3]` is one pre-tokenized input."""
    if isinstance(value, str):
        return [value], False
    if isinstance(value, list):
        if _is_ids(value):
            # `[]` too: TEI reads it as one input of no token ids, refused as empty only after
            # the route's model checks, like any empty input.
            return [_one(value, field)], False
        return [_one(v, field) for v in value], True
    raise BodyError(
        f"Failed to deserialize the JSON body into the target type: `{field}` must be a "
        "string or a list"
    )


PredictInput = str | tuple[str, str]


def parse_predict_inputs(value: Any) -> tuple[list[PredictInput], bool]:
    """TEI's `PredictInput`: `"s"` one input, `["a","b"]` ONE pair, `[["a"],["q","d"]]` a batch."""
    bad = BodyError(
        "Failed to deserialize the JSON body into the target type: `inputs` must be a string, "
        "a pair of strings or a list of those"
    )

    def item(v: Any) -> PredictInput:
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            if len(v) == 1:
                return str(v[0])
            if len(v) == 2:
                return (str(v[0]), str(v[1]))
        raise bad

    if isinstance(value, str):
        return [value], False
    if isinstance(value, list):
        # As TEI's visitor: the first element decides; a string starts one input (a text or
        # a pair), a list starts a batch whose every element is a list. `[]` is no input.
        if not value:
            raise bad
        if all(isinstance(v, str) for v in value):
            if len(value) == 1:
                return [value[0]], False
            if len(value) == 2:
                return [(value[0], value[1])], False
            raise bad
        return [item(v) for v in value], True
    raise bad


def parse_ids(value: Any) -> list[list[int]]:
    """`/decode` ids: `[u32]` or `[[u32]]`."""
    if isinstance(value, list) and value and _is_ids(value):
        _check_u32(value)
        return [value]
    if isinstance(value, list) and value and all(
        isinstance(v, list) and _is_ids(v) for v in value
    ):
        for ids in value:
            _check_u32(ids)
        return value
    if value == [] or (isinstance(value, list) and any(v == [] for v in value)):
        raise EmptyError("Input validation error: `input_ids` cannot be empty")
    raise BodyError(
        "Failed to deserialize the JSON body into the target type: `ids` must be a list of "
        "token ids or a list of them"
    )
