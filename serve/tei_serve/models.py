"""The models one server serves: a registry of `Serving`s, and the one place a request is
routed to one of them (the rules are `tei_serve.routing`'s).

Every front-end is built over a `Models`. A single-model server is `Models.of(serving)`;
`build_models` makes the several-model one: each model its own `Serving` (token-budget queue,
batcher, permits and model thread), all of them over one `Shared` (one tokenizer thread pool,
one set of te_* metric families with a `model` label, one span exporter), in one process and
so one onnxruntime environment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import msgspec

from tei_serve.errors import TeiError, UnhealthyError
from tei_serve.metrics import Method, MetricFamilies
from tei_serve.model import ServedModel
from tei_serve.routing import Candidate, Route, choose
from tei_serve.serving import ClassifierModel, EmbeddingModel, ModelInfo, Serving, Shared
from tei_serve.settings import Settings

log = logging.getLogger("tei_serve")

SHED_CHECK_SECONDS = 0.25
"""How often a stopping server looks again at how much of its grace is left."""

__all__ = ("ListedModel", "LoadedModel", "Models", "ServerInfo", "build_models")


class ListedModel(msgspec.Struct, frozen=True, kw_only=True):
    """One served model in /info's `models` list."""

    model_id: str
    served_model_name: str
    model_type: dict[str, EmbeddingModel | ClassifierModel]
    model_dtype: str
    max_input_length: int


class ServerInfo(ModelInfo, frozen=True, kw_only=True):
    """/info of a several-model server: TEI's fields describe the first model; `models` lists
    every model served, the first included, in --model-id order (TEI's clients ignore it)."""

    models: list[ListedModel]


class LoadedModel(msgspec.Struct, frozen=True, kw_only=True):
    """A model ready to serve: what `build_models` needs of each."""

    model: ServedModel
    model_id: str
    served_model_name: str
    revision: str | None = None
    """Its --revision (what /info reports as `model_sha`, as TEI does)."""


class Models:
    """The served models, in --model-id order; the first is the one /info describes."""

    def __init__(self, servings: Sequence[Serving], *, shared: Shared | None = None) -> None:
        if not servings:
            raise ValueError("a server needs at least one model")
        names = [s.served_model_name for s in servings]
        if len(set(names)) != len(names):
            raise ValueError(f"served model names must differ: {names}")
        self.servings = tuple(servings)
        self._shared = shared
        """Closed by `stop` when given (the servings do not own it)."""
        self.candidates = tuple(Candidate(name=s.served_model_name, task=s.task,
                                          model_id=s.info.model_id)
                                for s in servings)  # fmt: skip
        self.info: ModelInfo = self._info()

    @classmethod
    def of(cls, front: Serving | Models) -> Models:
        """A front-end's models: one `Serving` is a single-model server."""
        return front if isinstance(front, Models) else cls([front])

    @property
    def first(self) -> Serving:
        return self.servings[0]

    @property
    def settings(self) -> Settings:
        """The server's settings (shared by every model)."""
        return self.first.settings

    @property
    def families(self) -> MetricFamilies:
        """The te_* metrics of the whole process (what /metrics renders)."""
        return self.first.metrics.families

    @property
    def several(self) -> bool:
        return len(self.servings) > 1

    # -- routing --------------------------------------------------------------------------

    def pick(self, route: Route, requested: str | None, method: Method | None = None) -> Serving:
        """The model that answers `route` for a request naming `requested` (None: none named);
        `ModelChoiceError` (422) or `UnknownModelError` (404) when there is no such one.

        A request counted in `te_request_count` (its `method` given) that no model can take
        is counted there with no `model` label, as its failure is: TEI counts a request before
        anything can fail it, so failures never outnumber requests."""
        try:
            return self.servings[choose(self.candidates, route, requested)]
        except TeiError:
            self.count_unrouted(method)
            raise

    def count_unrouted(self, method: Method | None) -> None:
        """A request no model takes, counted in `te_request_count` with no `model` label (as
        its failure is) where its route counts requests (`method` given)."""
        if method is not None:
            self.families.inc("te_request_count", method)

    def described(self, requested: str | None) -> Serving:
        """The model an Info call describes: the named one, else the first."""
        if not requested or not self.several:
            return self.first
        return self.pick(Route.ANY, requested)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for s in self.servings:
            s.start()

    def watch_the_deadline(self, grace: float, margin: float) -> Callable[[], None]:
        """From now until the returned function is called: once less than `margin` plus a
        model's longest batch (run or running: the one running then must still finish) is
        left of `grace`, refuse what that model has queued, and again at every tick after (a
        request still arriving on an open connection). Each model by its own batches: a slow
        reranker does not cut short a fast embedder's queue. The bound is read again at
        every tick: a batch that runs long after the signal moves the moment earlier."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal handle
            due = [s for s in self.servings
                   if loop.time() >= end - (margin + s.worker.batch_bound_s)]  # fmt: skip
            if due:
                self.shed_at_the_deadline(due)
            handle = loop.call_later(SHED_CHECK_SECONDS, check)

        check()
        return lambda: handle.cancel() if handle is not None else None

    def shed_at_the_deadline(self, servings: Sequence[Serving]) -> None:
        """The shutdown's grace is nearly over for these models (HTTP and gRPC alike): what
        they still have queued is answered Unhealthy now, rather than cancelled with no
        answer when it ends."""
        message = "server is shutting down: its grace period is over"
        refused = sum(s.worker.shed(message) for s in servings)
        if refused:
            log.warning("shutdown grace period over: %d queued inputs refused with 503", refused)

    async def stop(self) -> None:
        """Drain every model's queue, then close what they share."""
        await asyncio.gather(*(s.stop() for s in self.servings))
        if self._shared is not None:
            self._shared.close()

    async def health(self) -> None:
        """Return when every model answers; `UnhealthyError` naming those that do not."""
        if not self.several:
            await self.first.health()
            return
        outcomes = await asyncio.gather(*(s.health() for s in self.servings),
                                        return_exceptions=True)  # fmt: skip
        failed = []
        for serving, outcome in zip(self.servings, outcomes, strict=True):
            if isinstance(outcome, UnhealthyError):
                failed.append(serving.served_model_name)
            elif isinstance(outcome, BaseException):
                raise outcome
        if failed:
            raise UnhealthyError(f"unhealthy: {', '.join(failed)}")

    # -- description ----------------------------------------------------------------------

    def _info(self) -> ModelInfo:
        first = self.first.info
        if not self.several:
            return first
        listed = [
            ListedModel(
                model_id=s.info.model_id, served_model_name=s.info.served_model_name,
                model_type=s.info.model_type, model_dtype=s.info.model_dtype,
                max_input_length=s.info.max_input_length,
            )
            for s in self.servings
        ]  # fmt: skip
        fields = {name: getattr(first, name) for name in first.__struct_fields__}
        return ServerInfo(**fields, models=listed)


def build_models(settings: Settings, loaded: Sequence[LoadedModel]) -> Models:
    """The servings of `loaded` over one `Shared`; one model is served exactly as alone."""
    if len(loaded) == 1:
        [one] = loaded
        return Models.of(Serving(settings=settings, model=one.model, model_id=one.model_id,
                                 served_model_name=one.served_model_name,
                                 revision=one.revision))  # fmt: skip
    shared = Shared(
        settings,
        max_input_length=max(m.model.max_input_length for m in loaded),
        model_label=True,
    )
    servings = [
        Serving(settings=settings, model=m.model, model_id=m.model_id,
                served_model_name=m.served_model_name, revision=m.revision, shared=shared)
        for m in loaded
    ]  # fmt: skip
    return Models(servings, shared=shared)
