"""Which served model answers a request: pure logic, shared by every front-end.

With one model, every request goes to it and any name the request carries is ignored (TEI
ignores OpenAI's `model` field; a wrong model type is the model's own 424, as in TEI).
With several:

- a request that names a model (the body's `model` field, the `x-model` header, or gRPC's
  `model` metadata key) goes to that one: a name that is not served is 404 (gRPC NOT_FOUND),
  a served model that cannot answer the route is 422 (INVALID_ARGUMENT);
- a request that names none goes to the one model whose task answers the route; where
  several could, it is 422 naming them; where none can, 422 listing what is served.

A route is answered by the tasks in `ANSWERS`: the dense-embedding routes by embedding
models, `/embed_sparse` by SPLADE models, `/predict` by classifiers and rerankers, `/rerank`
by rerankers, and `/tokenize`, `/decode`, `/info` and `/` (which dispatches by the chosen
model's task) by any model. A SPLADE model named by the request also answers `/embed` and
`/similarity` (with `normalize` off, as served alone).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import msgspec

from tei_runtime.manifest import Task
from tei_serve.errors import ModelChoiceError, UnknownModelError

__all__ = ("ANSWERS", "Candidate", "Route", "choose", "shown")


class Route(enum.StrEnum):
    """What a request asks for, whichever transport carried it (the value is TEI's handler name;
    `label` names it in errors)."""

    EMBED = "embed"
    EMBED_ALL = "embed_all"
    EMBED_SPARSE = "embed_sparse"
    SIMILARITY = "similarity"
    OPENAI = "openai_embed"
    PREDICT = "predict"
    RERANK = "rerank"
    TOKENIZE = "tokenize"
    DECODE = "decode"
    ANY = "any"
    """`/`, `/invocations`, `/vertex` and Info: whatever the chosen model does."""

    @property
    def label(self) -> str:
        """How errors name it to a client: the HTTP path, and the gRPC method where one."""
        return _LABELS[self]


_LABELS: dict[Route, str] = {
    Route.EMBED: "/embed (gRPC Embed)",
    Route.EMBED_ALL: "/embed_all (gRPC EmbedAll)",
    Route.EMBED_SPARSE: "/embed_sparse (gRPC EmbedSparse)",
    Route.SIMILARITY: "/similarity",
    Route.OPENAI: "/v1/embeddings",
    Route.PREDICT: "/predict (gRPC Predict)",
    Route.RERANK: "/rerank (gRPC Rerank)",
    Route.TOKENIZE: "/tokenize (gRPC Tokenize)",
    Route.DECODE: "/decode (gRPC Decode)",
    Route.ANY: "/, /invocations and /vertex (gRPC Info)",
}


_ALL = frozenset(Task)
ANSWERS: dict[Route, frozenset[Task]] = {
    Route.EMBED: frozenset({Task.EMBED}),
    Route.EMBED_ALL: frozenset({Task.EMBED}),
    Route.SIMILARITY: frozenset({Task.EMBED}),
    Route.OPENAI: frozenset({Task.EMBED}),
    Route.EMBED_SPARSE: frozenset({Task.SPARSE}),
    Route.PREDICT: frozenset({Task.CLASSIFY, Task.RERANK}),
    Route.RERANK: frozenset({Task.RERANK}),
    Route.TOKENIZE: _ALL,
    Route.DECODE: _ALL,
    Route.ANY: _ALL,
}
# A SPLADE model answers `/embed` and `/similarity` with `normalize` off, as it does served
# alone (TEI): when named, it gets them; unnamed, they go to dense models.
_ALSO_WHEN_NAMED: dict[Route, frozenset[Task]] = {
    Route.EMBED: frozenset({Task.SPARSE}),
    Route.SIMILARITY: frozenset({Task.SPARSE}),
}


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A served model as the router sees it."""

    name: str
    """Its served model name (what requests name it by)."""
    task: Task
    model_id: str = ""
    """Its --model-id (what /info shows): a request may name it so too, where no served name
    is the same and no other model has that id."""


NAME_SHOWN_CHARS = 100


def shown(name: str) -> str:
    """A model name from a request as errors and logs repeat it: a client may send a
    megabyte of it, and the answer and the log line should not carry it back whole."""
    if len(name) <= NAME_SHOWN_CHARS:
        return name
    return f"{name[:NAME_SHOWN_CHARS]}... ({len(name)} characters)"


def _listed(models: Sequence[Candidate]) -> str:
    return ", ".join(f"{m.name} ({m.task.value})" for m in models)


def choose(models: Sequence[Candidate], route: Route, requested: str | None) -> int:
    """The index in `models` of the model that answers `route` for a request naming
    `requested` (None or empty: no name given)."""
    if not models:
        raise ValueError("no models to choose from")
    if len(models) == 1:
        return 0
    able = ANSWERS[route]
    if requested:
        named = [i for i, m in enumerate(models) if m.name == requested]
        if not named:
            named = [i for i, m in enumerate(models) if m.model_id == requested]
            if len(named) > 1:
                names = ", ".join(f"`{models[i].name}`" for i in named)
                raise ModelChoiceError(
                    f"`{shown(requested)}` is the id of several served models: {names}; "
                    "name one by its served name"
                )
        if named:
            m = models[named[0]]
            if m.task not in able | _ALSO_WHEN_NAMED.get(route, frozenset()):
                raise ModelChoiceError(
                    f"model `{shown(requested)}` ({m.task.value}) cannot answer {route.label}"
                )
            return named[0]
        raise UnknownModelError(
            f"model `{shown(requested)}` is not served here; served models: {_listed(models)}"
        )
    fits = [i for i, m in enumerate(models) if m.task in able]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise ModelChoiceError(
            f"no served model can answer {route.label}; served models: {_listed(models)}"
        )
    names = ", ".join(f"`{models[i].name}`" for i in fits)
    raise ModelChoiceError(
        f"several models can answer {route.label}: {names}; name one in the request's "
        "`model` field, its `x-model` header or its gRPC `model` metadata"
    )
