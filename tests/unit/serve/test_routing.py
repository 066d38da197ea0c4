"""The router: which served model answers a route, and the errors when none or several do."""

from __future__ import annotations

import pytest

from tei_runtime.manifest import Task
from tei_serve.errors import GrpcCode, ModelChoiceError, UnknownModelError
from tei_serve.routing import ANSWERS, Candidate, Route, choose

EMBEDDER = Candidate(name="minilm", task=Task.EMBED)
RERANKER = Candidate(name="reranker", task=Task.RERANK)
CLASSIFIER = Candidate(name="sentiment", task=Task.CLASSIFY)
SPLADE = Candidate(name="splade", task=Task.SPARSE)
SERVED = (EMBEDDER, RERANKER)


@pytest.mark.parametrize(
    ("route", "expected"),
    [(Route.EMBED, 0), (Route.EMBED_ALL, 0), (Route.SIMILARITY, 0), (Route.OPENAI, 0),
     (Route.RERANK, 1), (Route.PREDICT, 1)],
)  # fmt: skip
def test_the_one_able_model_answers_without_a_name(route: Route, expected: int) -> None:
    assert choose(SERVED, route, None) == expected
    assert choose(SERVED, route, "") == expected  # an empty header is no name


def test_a_name_picks_among_several_able_models() -> None:
    models = (EMBEDDER, RERANKER, CLASSIFIER)
    assert choose(models, Route.PREDICT, "sentiment") == 2
    assert choose(models, Route.PREDICT, "reranker") == 1
    assert choose(models, Route.TOKENIZE, "minilm") == 0
    assert choose(models, Route.ANY, "reranker") == 1


@pytest.mark.parametrize("route", [Route.TOKENIZE, Route.DECODE, Route.ANY])
def test_several_able_models_and_no_name_is_422_naming_them(route: Route) -> None:
    with pytest.raises(ModelChoiceError) as info:
        choose(SERVED, route, None)
    err = info.value
    assert err.http_status == 422 and err.grpc_code is GrpcCode.INVALID_ARGUMENT
    assert "`minilm`" in err.message and "`reranker`" in err.message
    assert "`model`" in err.message and "x-model" in err.message


def test_two_classifiers_need_a_name_for_predict() -> None:
    with pytest.raises(ModelChoiceError, match="`reranker`, `sentiment`"):
        choose((EMBEDDER, RERANKER, CLASSIFIER), Route.PREDICT, None)


def test_an_unknown_name_is_404_listing_what_is_served() -> None:
    with pytest.raises(UnknownModelError) as info:
        choose(SERVED, Route.EMBED, "gpt-4")
    err = info.value
    assert err.http_status == 404 and err.grpc_code is GrpcCode.NOT_FOUND
    assert "`gpt-4`" in err.message
    assert "minilm (embed)" in err.message and "reranker (rerank)" in err.message


def test_a_huge_unknown_name_is_not_sent_back_whole() -> None:
    """A 1.5 MB `model` was echoed into a 1.5 MB 404 body and as long a log line."""
    with pytest.raises(UnknownModelError) as info:
        choose(SERVED, Route.EMBED, "m" * 1_500_000)
    message = info.value.message
    assert len(message) < 300 and "(1500000 characters)" in message
    assert message.startswith("model `" + "m" * 100 + "...")


def test_a_named_model_that_cannot_answer_is_422() -> None:
    named = r"`reranker` \(rerank\) cannot answer /embed \(gRPC Embed\)"
    with pytest.raises(ModelChoiceError, match=named):
        choose(SERVED, Route.EMBED, "reranker")
    with pytest.raises(ModelChoiceError, match="cannot answer /rerank"):
        choose((EMBEDDER, CLASSIFIER), Route.RERANK, "sentiment")


def test_no_able_model_is_422_listing_what_is_served() -> None:
    with pytest.raises(ModelChoiceError, match="no served model can answer /embed_sparse"):
        choose(SERVED, Route.EMBED_SPARSE, None)


def test_splade_answers_the_sparse_route_and_dense_ones_only_when_named() -> None:
    models = (EMBEDDER, SPLADE)
    assert choose(models, Route.EMBED_SPARSE, None) == 1
    assert choose(models, Route.EMBED, None) == 0
    # Served alone it answers /embed and /similarity with normalize off; named, it does too.
    assert choose(models, Route.EMBED, "splade") == 1
    assert choose(models, Route.SIMILARITY, "splade") == 1
    for route in (Route.EMBED_ALL, Route.OPENAI, Route.PREDICT):
        with pytest.raises(ModelChoiceError, match="`splade` \\(sparse\\) cannot answer"):
            choose(models, route, "splade")


@pytest.mark.parametrize("route", list(Route))
def test_one_model_answers_everything_and_names_are_ignored(route: Route) -> None:
    """TEI's single-model behaviour: no routing errors; a wrong model type is its own 424."""
    assert choose((RERANKER,), route, None) == 0
    assert choose((RERANKER,), route, "anything") == 0


def test_every_route_has_its_tasks() -> None:
    assert set(ANSWERS) == set(Route)
    assert all(ANSWERS[r] for r in Route)


def test_no_models_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no models"):
        choose((), Route.EMBED, None)


def test_the_model_id_names_a_model_where_no_served_name_is_it() -> None:
    """An OpenAI client configured with the id /info shows keeps working once a second model
    is served; a served name equal to that id still wins, and an id two models share is
    ambiguous."""
    ids = (Candidate(name="minilm", task=Task.EMBED, model_id="sentence-transformers/mini"),
           Candidate(name="bge", task=Task.EMBED, model_id="BAAI/bge"),
           Candidate(name="sentence-transformers/mini", task=Task.EMBED, model_id="x"))
    assert choose(ids[:2], Route.OPENAI, "sentence-transformers/mini") == 0
    assert choose(ids[:2], Route.EMBED, "BAAI/bge") == 1
    assert choose(ids, Route.OPENAI, "sentence-transformers/mini") == 2
    twice = (ids[0], Candidate(name="mini-int8", task=Task.EMBED,
                               model_id="sentence-transformers/mini"))  # fmt: skip
    with pytest.raises(ModelChoiceError, match="the id of several served models"):
        choose(twice, Route.EMBED, "sentence-transformers/mini")
    with pytest.raises(UnknownModelError):
        choose(ids[:2], Route.EMBED, "BAAI/other")
