"""HTTP wire types: TEI's request and response bodies (`router/src/http/types.rs`).

Request structs accept unknown fields, as TEI does. `inputs` unions that msgspec cannot express
(a list of token ids is ONE input, a list of strings is a batch) are decoded as `Any` and
resolved by `parse_inputs` / `parse_predict_inputs` with TEI's rules.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from tei_serve.errors import BodyError, EmptyError, ValidationError
from tei_serve.serving import Direction

WireDirection = Literal["right", "left", "Right", "Left"]
RawInput = str | list[int]


class EmbedRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Any
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    prompt_name: str | None = None
    normalize: bool = True
    dimensions: int | None = None


class EmbedAllRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Any
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    prompt_name: str | None = None


class PredictRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Any
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    raw_scores: bool = False
    instruction: str | None = None
    """Generative rerankers only (not in TEI's API): the instruction in their prompt."""


class RerankRequest(msgspec.Struct, frozen=True, kw_only=True):
    query: str
    texts: list[str]
    truncate: bool | None = None
    truncation_direction: WireDirection = "right"
    raw_scores: bool = False
    return_text: bool = False
    instruction: str | None = None
    """Generative rerankers only (not in TEI's API): the instruction in their prompt."""


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


class TokenizeRequest(msgspec.Struct, frozen=True, kw_only=True):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeRequest(msgspec.Struct, frozen=True, kw_only=True):
    ids: Any
    skip_special_tokens: bool = True


class OpenAIRequest(msgspec.Struct, frozen=True, kw_only=True):
    input: Any
    model: str | None = None
    user: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


# -- responses (the rest are serving's result Structs, encoded as they are) -----------------


class SparseValue(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    value: float


class OpenAIEmbedding(msgspec.Struct, frozen=True, kw_only=True):
    object: str
    embedding: list[float] | str
    index: int


class OpenAIUsage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class OpenAIResponse(msgspec.Struct, frozen=True, kw_only=True):
    object: str
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


# -- decoding --------------------------------------------------------------------------------

T = TypeVar("T")

DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (
        EmbedRequest, EmbedAllRequest, PredictRequest, RerankRequest, SimilarityRequest,
        TokenizeRequest, DecodeRequest, OpenAIRequest,
    )
}
ENCODER = msgspec.json.Encoder()


def decode(body: bytes, type_: type[T]) -> T:
    """Decode a request body; malformed JSON answers 400, a wrong shape 422 (as axum does)."""
    try:
        value: T = DECODERS[type_].decode(body)
    except msgspec.ValidationError as e:
        raise BodyError(f"Failed to deserialize the JSON body into the target type: {e}") from e
    except msgspec.DecodeError as e:
        raise BodyError(f"Failed to parse the request body as JSON: {e}", status=400) from e
    return value


def direction_of(value: WireDirection) -> Direction:
    return "left" if value.lower() == "left" else "right"


def _is_ids(value: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _one(value: Any) -> RawInput:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and _is_ids(value):
        if any(v < 0 for v in value):
            raise ValidationError("token ids must be non-negative")
        return value
    raise BodyError(
        "Failed to deserialize the JSON body into the target type: `inputs` must be a string, "
        "a list of token ids or a list of them"
    )


def parse_inputs(value: Any, *, field: str = "inputs") -> tuple[list[RawInput], bool]:
    """TEI's `Input`: returns (inputs, is_batch). `[1, 2, 3]` is one pre-tokenized input."""
    if isinstance(value, str):
        return [value], False
    if isinstance(value, list):
        if not value:
            raise EmptyError(f"`{field}` cannot be empty")
        if _is_ids(value):
            return [_one(value)], False
        return [_one(v) for v in value], True
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
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            if len(v) == 1:
                return str(v[0])
            if len(v) == 2:
                return (str(v[0]), str(v[1]))
        raise bad

    if isinstance(value, str):
        return [value], False
    if isinstance(value, list):
        if not value:
            raise EmptyError("`inputs` cannot be empty")
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
        return [value]
    if isinstance(value, list) and value and all(
        isinstance(v, list) and _is_ids(v) for v in value
    ):
        return value
    if value == [] or (isinstance(value, list) and any(v == [] for v in value)):
        raise EmptyError("`ids` cannot be empty")
    raise BodyError(
        "Failed to deserialize the JSON body into the target type: `ids` must be a list of "
        "token ids or a list of them"
    )
