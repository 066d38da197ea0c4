"""Prometheus metrics with TEI's names, labels and buckets (`router/src/prometheus.rs`).

TEI's exporter writes counters under their plain name (`te_request_count`, no `_total`), which
prometheus-client cannot do, so counters are kept here and rendered by hand beside the
registry's histograms and gauges. Everything is updated from the event loop thread.

One process has one `MetricFamilies` (what /metrics and --prometheus-port render); each served
model records through its own `Metrics` view of it. With several models every series carries
a `model` label (the served model name); with one it carries none, exactly as TEI's.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np
import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, Histogram

if TYPE_CHECKING:
    from tei_serve.serving import Metadata

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"



def _geometric(first: float, ratio: float, n: int) -> tuple[float, ...]:
    """`n` bounds, each the one before times `ratio`, multiplied step by step as TEI's
    exporter builds them: `1e-5 * 1.5**k` differs from it in the last bits of 34 of 35
    bounds, and `le` values that differ by a bit are separate series to Prometheus."""
    bounds, value = [], first
    for _ in range(n):
        value *= ratio
        bounds.append(value)
    return tuple(bounds)


DURATION_BUCKETS = _geometric(1e-5, 1.5, 35)
BATCH_SIZE_BUCKETS = tuple(float(2**k) for k in range(13))
BATCH_TOKENS_BUCKETS = tuple(float(2**k) for k in range(21))

Family = Literal["embed", "predict"]
"""TEI's per-capability metric families; tokenize and decode count in neither."""
Method = Literal["single", "batch"]
M = TypeVar("M", Histogram, Gauge)

_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "te_request_count": ("Requests received", ("method",)),
    "te_request_success": ("Requests answered successfully", ("method",)),
    "te_request_failure": ("Requests that failed", ("err",)),
    "te_embed_count": ("Embed inputs received", ()),
    "te_embed_success": ("Embed inputs answered", ()),
    "te_predict_count": ("Predict inputs received", ()),
    "te_predict_success": ("Predict inputs answered", ()),
    # Ours, not TEI's: how busy the model is, which no te_* family says (request durations
    # overlap, and a batch serves many requests).
    "tei_onnx_model_busy_seconds": ("Seconds the model spent running forwards (batches and "
                                    "health probes); its rate is the model's utilization, 1 "
                                    "when it is never idle", ()),
}


class MetricFamilies:
    """The te_* families of one process; `model_label` adds the `model` label to each."""

    def __init__(self, max_input_length: int, *, model_label: bool = False) -> None:
        self.model_label = model_label
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = {
            name: defaultdict(float) for name in _COUNTERS
        }
        r = self.registry
        labels = ("model",) if model_label else ()

        def duration(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=DURATION_BUCKETS, registry=r)

        self.request_duration = duration("te_request_duration", "Request duration")
        self.request_tokenization = duration(
            "te_request_tokenization_duration", "Tokenization duration per request"
        )
        self.request_queue = duration("te_request_queue_duration", "Queue duration per request")
        self.request_inference = duration(
            "te_request_inference_duration", "Inference duration per request"
        )
        self.embed_duration = duration("te_embed_duration", "Embed duration")
        self.embed_tokenization = duration("te_embed_tokenization_duration", "Embed tokenization")
        self.embed_queue = duration("te_embed_queue_duration", "Embed queue time")
        self.embed_inference = duration("te_embed_inference_duration", "Embed inference time")
        self.predict_duration = duration("te_predict_duration", "Predict duration")
        self.predict_tokenization = duration(
            "te_predict_tokenization_duration", "Predict tokenization"
        )
        self.predict_queue = duration("te_predict_queue_duration", "Predict queue time")
        self.predict_inference = duration("te_predict_inference_duration", "Predict inference")
        length_buckets = tuple(float(2**k) for k in range(20) if 2**k <= max_input_length)
        self.input_length = Histogram(
            "te_request_input_length", "Input length in tokens", labels,
            buckets=length_buckets or (1.0,), registry=r,
        )
        self.queue_size = Gauge("te_queue_size", "Entries waiting in the queue", labels,
                                registry=r)  # fmt: skip
        self.batch_next_size = Histogram(
            "te_batch_next_size", "Entries per batch", labels, buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_next_tokens = Histogram(
            "te_batch_next_tokens", "Tokens per batch (without padding)", labels,
            buckets=BATCH_TOKENS_BUCKETS, registry=r,
        )

    def _key(self, name: str, model: str | None, labels: Sequence[str]) -> tuple[
        tuple[str, str], ...
    ]:
        pairs = list(zip(_COUNTERS[name][1], labels, strict=True))
        if self.model_label and model is not None:
            pairs.insert(0, ("model", model))
        return tuple(pairs)

    def inc(self, name: str, *labels: str, model: str | None = None, by: float = 1.0) -> None:
        key = self._key(name, model, labels)
        with self._lock:
            self._counters[name][key] += by

    def failure(self, err: str, *, model: str | None = None) -> None:
        """A failed request, under the model it was for (None: it failed before one was
        picked, and carries no `model` label)."""
        self.inc("te_request_failure", err, model=model)

    def counter_value(self, name: str, *labels: str, model: str | None = None) -> float:
        key = self._key(name, model, labels)
        with self._lock:
            return self._counters[name].get(key, 0.0)

    def view(self, model: str) -> Metrics:
        return Metrics(families=self, model=model)

    def render(self) -> bytes:
        lines: list[str] = []
        with self._lock:
            for name, (doc, _) in _COUNTERS.items():
                values = self._counters[name]
                if not values:
                    continue
                lines.append(f"# HELP {name} {doc}")
                lines.append(f"# TYPE {name} counter")
                for labels, value in sorted(values.items()):
                    if labels:
                        inner = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels)
                        lines.append(f"{name}{{{inner}}} {_number(value)}")
                    else:
                        lines.append(f"{name} {_number(value)}")
        text = "\n".join(lines) + ("\n" if lines else "")
        histograms = prometheus_client.generate_latest(self.registry)
        return text.encode() + _BUCKET_BOUND.sub(_rust_bound, histograms)


_BUCKET_BOUND = re.compile(rb'le="(?!\+Inf")([^"]+)"')


def _rust_bound(match: re.Match[bytes]) -> bytes:
    """A bucket's `le` as TEI's exporter writes it (Rust's float Display: `32`, `1048576`,
    `0.000015000000000000002`), where prometheus_client writes `32.0`, `1.048576e+06` and
    `1.5000000000000002e-05`: Prometheus 2 stores each spelling as a series of its own, so a
    dashboard or rule naming TEI's `le` would find nothing."""
    return b'le="' + _rust_spelling(match.group(1)) + b'"'


@functools.lru_cache(maxsize=1024)
def _rust_spelling(bound: bytes) -> bytes:
    # The buckets are fixed when the server starts: each spelling is worked out once, not
    # on every scrape.
    return np.format_float_positional(float(bound), trim="-").encode()


def _number(value: float) -> str:
    """Counts as integers, as TEI's exporter writes its u64 counters; never rounded."""
    return str(int(value)) if value.is_integer() else repr(value)


def _escaped(label_value: str) -> str:
    """A label value as the text format writes it (a served model name may hold anything)."""
    return label_value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """One served model's view of the process's `MetricFamilies` (its own families when built
    alone, as a single-model server and the tests do)."""

    def __init__(
        self,
        max_input_length: int = 512,
        *,
        families: MetricFamilies | None = None,
        model: str | None = None,
    ) -> None:
        self.families = families if families is not None else MetricFamilies(max_input_length)
        f = self.families
        self.model = model if f.model_label else None
        child = self._child
        self.request_duration = child(f.request_duration)
        self.request_tokenization = child(f.request_tokenization)
        self.request_queue = child(f.request_queue)
        self.request_inference = child(f.request_inference)
        self.embed_duration = child(f.embed_duration)
        self.embed_tokenization = child(f.embed_tokenization)
        self.embed_queue = child(f.embed_queue)
        self.embed_inference = child(f.embed_inference)
        self.predict_duration = child(f.predict_duration)
        self.predict_tokenization = child(f.predict_tokenization)
        self.predict_queue = child(f.predict_queue)
        self.predict_inference = child(f.predict_inference)
        self.input_length = child(f.input_length)
        self.queue_size = child(f.queue_size)
        self.batch_next_size = child(f.batch_next_size)
        self.batch_next_tokens = child(f.batch_next_tokens)

    def _child(self, metric: M) -> M:
        return metric if self.model is None else metric.labels(self.model)

    def inc(self, name: str, *labels: str, by: float = 1.0) -> None:
        self.families.inc(name, *labels, model=self.model, by=by)

    def model_busy(self, seconds: float) -> None:
        """The model ran a forward for `seconds`."""
        self.inc("tei_onnx_model_busy_seconds", by=seconds)

    def received(self, method: Method) -> None:
        """A request arrived (counted before it is validated, as TEI does)."""
        self.inc("te_request_count", method)

    def inputs_received(self, family: Family, n: int) -> None:
        """`n` inputs passed the request's checks and hold their permits: TEI counts them in
        `te_embed_count` / `te_predict_count` there, just before it tokenizes them (so a
        refused batch, an overloaded request or a call the model does not serve counts none)."""
        self.inc(f"te_{family}_count", by=n)

    def record(self, method: Method, family: Family | None, n: int, meta: Metadata) -> None:
        """A request of `n` inputs was answered: success counters and duration histograms."""
        total = meta.total_time_ns / 1e9
        tokenization = meta.tokenization_time_ns / 1e9
        queue = meta.queue_time_ns / 1e9
        inference = meta.inference_time_ns / 1e9
        self.inc("te_request_success", method)
        self.request_duration.observe(total)
        self.request_tokenization.observe(tokenization)
        self.request_queue.observe(queue)
        self.request_inference.observe(inference)
        if family == "embed":
            self.inc("te_embed_success", by=n)
            histograms = (self.embed_duration, self.embed_tokenization, self.embed_queue,
                          self.embed_inference)  # fmt: skip
        elif family == "predict":
            self.inc("te_predict_success", by=n)
            histograms = (self.predict_duration, self.predict_tokenization, self.predict_queue,
                          self.predict_inference)  # fmt: skip
        else:
            return
        # TEI records these once per input (its batch handlers call `embed` per input), so
        # their counts equal te_*_success; each input gets the request's per-input figures.
        for histogram, seconds in zip(
            histograms, (total, tokenization, queue, inference), strict=True
        ):
            for _ in range(n):
                histogram.observe(seconds)

    def failure(self, err: str, *, by: int = 1) -> None:
        """`by` failed requests (TEI's `dropped` counts the inputs of one, each apart)."""
        self.families.inc("te_request_failure", err, model=self.model, by=by)

    def counter_value(self, name: str, *labels: str) -> float:
        return self.families.counter_value(name, *labels, model=self.model)

    def render(self) -> bytes:
        """Every model's metrics: the process's families."""
        return self.families.render()
