"""`tei-serve`: parse settings, resolve and load the models, warm them up, serve with uvicorn
(or, with --grpc, TEI's gRPC API on grpc.aio: tei_serve.grpc.server).

Several --model-id load in order into one process (`tei_serve.models`); the first that
cannot load stops the start with one error line naming it. Each gets the usable cores
divided by the number of models as its onnxruntime intra-op threads (unless
--intra-op-threads is given), so models running at once do not oversubscribe the cores.

uvicorn owns SIGTERM/SIGINT: it stops accepting, waits for every accepted request to be
answered, then runs the app's shutdown (which drains the batch queue), and `main` exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.handlers
import resource
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import PurePosixPath
from types import FrameType

import msgspec
import uvicorn

from tei_runtime.backend import output_for_task
from tei_runtime.errors import TeiRuntimeError
from tei_runtime.host import Host
from tei_runtime.manifest import Manifest, Precision, Task
from tei_runtime.model import Model
from tei_runtime.packing import length_sorted_groups
from tei_serve.dual_stack import dual_stack_listener
from tei_serve.http.app import build_app
from tei_serve.http.connection import KeepAliveHttp10Protocol
from tei_serve.log_filter import parse_log_filter
from tei_serve.low_ports import prepare_bind
from tei_serve.metrics_port import MetricsPortError
from tei_serve.model import Input, ServedModel
from tei_serve.model_source import ExportOptions, ModelSourceError, held_while_read, resolve
from tei_serve.models import LoadedModel, Models, build_models
from tei_serve.observe import RequestSpan
from tei_serve.serving import Serving
from tei_serve.settings import (
    KEEP_ALIVE_SECONDS,
    SHED_MARGIN_SECONDS,
    SHUTDOWN_GRACE_SECONDS,
    Settings,
    SettingsError,
    load_settings,
)
from tei_serve.worker import forward_in_pieces

log = logging.getLogger("tei_serve")


_TEI_LEVELS = {"WARNING": "WARN", "CRITICAL": "ERROR"}
"""Python's level names that tracing's differ from (TRACE, DEBUG, INFO, WARN, ERROR)."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line, in the shape of TEI's tracing JSON layer (flattened event,
    file and line, the request's span where there is one)."""

    def __init__(self, *, spans: bool = True) -> None:
        super().__init__()
        self.spans = spans

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            # RFC 3339 in UTC with microseconds, as TEI's tracing JSON layer writes it
            "timestamp": datetime.fromtimestamp(record.created, UTC).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ"
            ),
            "level": _TEI_LEVELS.get(record.levelname, record.levelname),
            "message": record.getMessage(),
            "target": record.name,
            "filename": f"{PurePosixPath(record.pathname).parent.name}/{record.filename}",
            "line_number": record.lineno,
        }
        span = getattr(record, "span", None)
        if self.spans and isinstance(span, RequestSpan):
            fields = span.fields()
            entry["span"] = fields
            entry["spans"] = [fields]
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: Settings) -> None:
    if settings.json_output:
        # TEI writes its logs to stdout; JSON lines are read by collectors, so there too.
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(JsonFormatter(spans=not settings.disable_spans))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    levels = parse_log_filter(settings.log_level)
    levels.apply()
    if levels.problem:
        log.warning("%s", levels.problem)


def check_limits(settings: Settings, model_max_length: int, model_id: str = "") -> None:
    """TEI's rule: a model longer than --max-batch-tokens is cut down, or refused. The
    warning names the model (one of several, maybe)."""
    if model_max_length <= settings.max_batch_tokens:
        return
    if not settings.auto_truncate:
        raise SettingsError(
            f"`max_input_length` must be smaller than `max_batch_tokens` when `auto_truncate` "
            f"is disabled ({model_max_length} > {settings.max_batch_tokens})"
        )
    log.warning(
        "%smax_input_length %d is larger than max_batch_tokens %d; inputs are truncated to %d",
        f"{model_id}: " if model_id else "", model_max_length, settings.max_batch_tokens,
        settings.max_batch_tokens,
    )  # fmt: skip


class ModelLoadError(RuntimeError):
    """One of several models could not load; the text names it."""


def export_options(settings: Settings, index: int) -> ExportOptions:
    """What the index-th --model-id is exported with if it is a checkpoint."""
    return ExportOptions(
        pooling=settings.pooling_of(index),
        task=settings.task_of(index),
        dense_path=settings.dense_path_of(index),
        adapter=settings.adapter_of(index),
        trust_remote_code=settings.trust_remote_code,
    )


def load_model(
    settings: Settings,
    model_id: str | None = None,
    *,
    intra_op_threads: int | None = None,
    options: ExportOptions | None = None,
    index: int = 0,
    shared_with: Sequence[Precision] = (),
    host: Host | None = None,
) -> tuple[Model, str]:
    """Resolve and load one model (`model_id`, default the first --model-id) with the flags of
    the index-th --model-id; `options` are what it is exported with on first start (default:
    that model's flags), with the precision it runs and `shared_with` (those other
    --model-id entries of the same checkpoint run); `host`: this host as probed (default:
    probed here)."""
    import tei_runtime
    from tei_runtime.host import probe
    from tei_runtime.loader import precision_for

    options = options or export_options(settings, index)
    dtype = settings.dtype_of(index) or "auto"
    # Before any export: flags this host cannot run fail here, not after minutes of work,
    # and a first start exports only the precision it loads.
    host = host or probe()
    precision = precision_for(host, device=settings.device, dtype=dtype)
    artifact, model_id = resolve(
        model_id if model_id is not None else settings.model_id,
        revision=settings.revision_of(index),
        token=settings.hf_token,
        cache_dir=settings.huggingface_hub_cache,
        options=options,
        precisions=[p for p in Precision if p is precision or p in shared_with],
    )
    from tei_runtime.manifest import read_manifest

    with held_while_read(artifact):
        manifest = read_manifest(artifact)
        check_artifact_matches(model_id, manifest, options)
        check_limits(settings, manifest.max_input_length, model_id)
        # As TEI, --pooling overrides an embedder's pooling and means nothing to a head.
        embeds = manifest.task in (Task.EMBED, Task.SPARSE)
        pooling = settings.pooling_of(index) if embeds else None
        model = tei_runtime.load(
            artifact,
            device=settings.device,
            dtype=dtype,
            intra_op_threads=intra_op_threads or settings.intra_op_threads,
            max_batch_tokens=settings.max_batch_tokens,
            cache_dir=None,
            host=host,
            # TEI cuts the model's length to the batch budget (check_limits allowed it).
            max_input_length=settings.max_batch_tokens,
            pooling=pooling,
        )
    return model, model_id


def check_artifact_matches(model_id: str, manifest: Manifest, options: ExportOptions) -> None:
    """An artifact (or bundle) exported already cannot become another task or adapter."""
    task = options.task
    if task is not None and manifest.task is not task:
        raise SettingsError(
            f"{model_id} is a `{manifest.task.value}` artifact and --task asks for "
            f"`{task.value}`: export the checkpoint again with `tei-export ... --task "
            f"{task.value}`, or drop --task"
        )
    merged = manifest.source.adapter
    if options.adapter is not None and merged != options.adapter:
        has = f"has the `{merged}` adapter merged" if merged else "has no adapter merged"
        raise SettingsError(
            f"{model_id} {has} and --adapter asks for `{options.adapter}`: export the "
            f"checkpoint again with `tei-export ... --adapter {options.adapter}`, or drop "
            "--adapter"
        )


def warm_up(model: ServedModel, settings: Settings) -> None:
    """Run the largest piece a full batch is cut into (TEI runs the full batch itself).

    A full batch is max_batch_tokens split into max_input_length sequences; the worker runs
    it as equal pieces of the model's device budget, so one piece sizes the arena and checks
    the graph as well as all of them would. Running all 16 CPU pieces of TEI's default batch
    took 1.7 s of a 2.4 s start (all-MiniLM-L6-v2, 2 cores); GPUs get the whole batch.
    No sequence is longer than the budget: on the CPU's 1024 tokens that is the pieces short
    requests make, where one max-length text of a long-context model would be the slowest
    and largest forward it can run (the Qwen3-0.6B shape at 16384 tokens: over 50 GB of
    attention scores, which ended the start on a 24 GB host).
    """
    length = min(model.max_input_length, settings.max_batch_tokens, model.packing.budget)
    count = max(1, settings.max_batch_tokens // max(1, length))
    if settings.max_batch_requests is not None:
        count = min(count, settings.max_batch_requests)
    text = "warm up " * length
    # Rerankers get a pair: a generative one takes nothing else.
    item: Input = (text, text) if model.manifest.task is Task.RERANK else text
    [one] = model.encode([item], truncate=True)
    if len(one) > length:  # the text is ~2 tokens a word; truncation stops at max_input_length
        one = msgspec.structs.replace(one, ids=one.ids[:length], type_ids=one.type_ids[:length],
                                      offsets=one.offsets[:length])  # fmt: skip
    pieces = length_sorted_groups([len(one)] * count, model.packing)
    forward_in_pieces(model, output_for_task(model.manifest.task), [one] * len(pieces[0]))


def served_name(model_id: str) -> str:
    """A model's default served name beside others: its id's last path part."""
    return PurePosixPath(model_id.rstrip("/")).name or model_id


def split_threads(settings: Settings, count: int, host: Host) -> int | None:
    """Each model's intra-op threads: --intra-op-threads, else (several models) the usable
    cores divided among them, at least one each; None lets one model take every core."""
    if settings.intra_op_threads is not None or count == 1:
        return settings.intra_op_threads
    return max(1, host.usable_cores // count)


def load_models(settings: Settings) -> list[tuple[Model, LoadedModel]]:
    """Every --model-id loaded and warmed up, in order; `ModelLoadError` names the first
    that fails."""
    ids: Sequence[str | None] = settings.model_ids or (None,)
    from tei_runtime.host import probe

    several = len(ids) > 1
    host = probe()  # once: it reads /proc and asks the loader for TensorRT's library
    threads = split_threads(settings, len(ids), host)
    if several and not settings.served_model_names:
        # Default names come from the ids as given (a model is reported under the id it was
        # given), so a clash is known before minutes of loading; given names are checked
        # with the settings.
        names = [served_name(str(wanted)) for wanted in ids]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ModelLoadError(
                f"two models would be served as {twice[0]!r}: name them with "
                "--served-model-name"
            )
    loaded: list[tuple[Model, LoadedModel]] = []
    shared = shared_precisions(settings, ids, host)
    for i, wanted in enumerate(ids):
        try:
            model, model_id = load_model(
                settings, wanted, intra_op_threads=threads, index=i, shared_with=shared[i],
                host=host,
            )
            warm_up(model, settings)
        except (ModelSourceError, SettingsError, TeiRuntimeError) as e:
            if not several:
                raise
            raise ModelLoadError(f"model {wanted} could not load: {e}") from e
        if settings.served_model_names:
            name = settings.served_model_names[i]
        else:
            name = served_name(model_id) if several else model_id
        loaded.append((model, LoadedModel(model=model, model_id=model_id, served_model_name=name,
                                          revision=settings.revision_of(i))))  # fmt: skip
    check_default_prompt_name(settings, [m for _, m in loaded])
    return loaded


def shared_precisions(
    settings: Settings, ids: Sequence[str | None], host: Host
) -> list[list[Precision]]:
    """Per --model-id, the precisions the other --model-id entries exporting the same
    checkpoint with the same flags (one cache folder) run, so that its first-start export
    writes them all at once instead of once per precision. Flags a host cannot run give
    nothing here: that model's own load says what is wrong."""
    from tei_runtime.loader import precision_for

    if len(ids) < 2:
        return [[] for _ in ids]
    runs: list[Precision | None] = []
    for i in range(len(ids)):
        try:
            dtype = settings.dtype_of(i) or "auto"
            runs.append(precision_for(host, device=settings.device, dtype=dtype))
        except TeiRuntimeError:
            runs.append(None)
    keys = [(ids[i], settings.revision_of(i), export_options(settings, i)) for i in range(len(ids))]
    return [
        [p for j, p in enumerate(runs) if p is not None and j != i and keys[j] == keys[i]]
        for i in range(len(ids))
    ]


def check_default_prompt_name(settings: Settings, loaded: Sequence[LoadedModel]) -> None:
    """--default-prompt-name must name a prompt of the model (TEI refuses to start without
    it); with several models, of at least one, and the others serve without it."""
    name = settings.default_prompt_name
    if name is None:
        return
    lacking = [m for m in loaded if name not in m.model.manifest.prompts.prompts]
    if len(lacking) < len(loaded):
        for m in lacking:
            log.warning("--default-prompt-name `%s` is not a prompt of model %s: its requests "
                        "get no default prompt", name, m.served_model_name)  # fmt: skip
        return
    if len(loaded) > 1:
        raise SettingsError(f"--default-prompt-name `{name}` is not a prompt of any model served")
    prompts = sorted(loaded[0].model.manifest.prompts.prompts)
    if not prompts:
        raise SettingsError(
            f"`default-prompt-name` is set to `{name}` but no prompts were found in the "
            "Sentence Transformers configuration"
        )
    raise SettingsError(
        f"`default-prompt-name` is set to `{name}` but it was not found in the Sentence "
        f"Transformers prompts. Available prompts: {prompts}"
    )


def uvicorn_config(front: Serving | Models) -> uvicorn.Config:
    s = front.settings
    return uvicorn.Config(
        build_app(front),
        host=s.hostname,
        port=s.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # Named, not "auto": a missing one fails the start instead of quietly costing ~1 ms
        # a request (both are dependencies of the serving install). The protocol is
        # httptools', keeping HTTP/1.0 keep-alive connections as TEI does.
        loop="uvloop",
        http=KeepAliveHttp10Protocol,
        server_header=False,
        backlog=max(2048, s.max_concurrent_requests * 2),
        # TEI (hyper) never closes an idle connection; uvicorn's 5 s default races pooled
        # clients and proxies, whose request sent as the server closes is lost. 620 s is
        # longer than the usual client and load-balancer idle timeouts (60-600 s).
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        # Requests in flight get this long after SIGTERM, inside Kubernetes' default 30 s.
        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
    )


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard one, as servers do (Go and
    Rust runtimes, nginx): every connection is a descriptor, and a soft limit of 1024 (a
    common default) would refuse clients at ~1000 connections. Returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        return soft if soft != resource.RLIM_INFINITY else hard
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:  # a sandbox may refuse; the old limit stands
            log.debug("could not raise the open-file limit from %d to %d: %s", soft, hard, e)
            return soft
        return hard
    return soft


def serve(served: Serving | Models, on_ready: Callable[[], None] = lambda: None) -> bool:
    """Serve until SIGTERM/SIGINT; False when the server could not start.

    uvicorn re-raises the signal it caught once it has shut down gracefully, to the handler
    that was there before it; that handler is a no-op here, so the process exits 0 as TEI's
    does after a graceful shutdown.
    """
    models = Models.of(served)
    uv = GracefulServer(
        uvicorn_config(served),
        on_exit=lambda: models.watch_the_deadline(SHUTDOWN_GRACE_SECONDS, SHED_MARGIN_SECONDS),
        on_ready=on_ready,
    )
    s = models.settings
    try:
        listener = dual_stack_listener(s.hostname, s.port, backlog=uv.config.backlog)
    except OSError as e:
        log.error("cannot listen on [%s]:%d: %s", s.hostname.strip("[]"), s.port, e.strerror)
        return False
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _after_shutdown)
    try:
        uv.run(sockets=None if listener is None else [listener])
    except SystemExit:  # uvicorn exits 3 where it cannot bind; the CLI says 1, as with --grpc
        return False
    return bool(uv.started)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which at the end of its shutdown grace period cancels the requests
    still running: their clients get a bare 500 and the log a traceback each. Just before
    that, `shed` refuses the work still queued, so those clients read TEI's 503 instead."""

    def __init__(
        self, config: uvicorn.Config, *, on_exit: Callable[[], object],
        on_ready: Callable[[], None],
    ) -> None:  # fmt: skip
        super().__init__(config)
        self._on_exit = on_exit
        self._on_ready = on_ready
        self._deadline_set = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # listening: "ready" is true only now (a taken port ends above)
            self._on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            # uvicorn force-quits on a second Ctrl-C: every request in flight then gets a
            # bare 500. TEI ignores it and finishes the graceful shutdown; so do we (SIGKILL
            # stops the process at once where that is what is wanted).
            log.info("already shutting down; a second SIGINT is ignored (SIGKILL forces it)")
            return
        super().handle_exit(sig, frame)
        if not self._deadline_set:
            self._deadline_set = True
            # A signal lands on the main thread, where the serving loop runs; the watch
            # starts inside the loop. It ends with the process.
            asyncio.get_event_loop().call_soon_threadsafe(self._on_exit)


def serve_grpc(served: Serving | Models, on_ready: Callable[[], None] = lambda: None) -> bool:
    """`--grpc`: serve TEI's gRPC API until SIGTERM/SIGINT, then stop gracefully (calls in
    flight finish, the queue drains); False when the server could not start."""
    from tei_serve.grpc.server import GrpcStartError
    from tei_serve.grpc.server import serve_grpc as run

    try:
        asyncio.run(run(served, on_ready))
    except (GrpcStartError, MetricsPortError) as e:
        log.error("%s", e)
        return False
    return True


def _after_shutdown(signum: int, _frame: object) -> None:
    log.info("shut down after %s", signal.Signals(signum).name)


class StoppedWhileStarting(BaseException):
    """SIGTERM or SIGINT before the server listens (a model still exporting, unpacking or
    loading). A BaseException, so that no `except Exception` on the way takes it for a
    failure; unwinding stops an export child and removes what it had written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_while_starting(signum: int, _frame: object) -> None:
    # Without a handler, a SIGTERM to PID 1 (the server in its container) is ignored: `docker
    # stop` of a server still starting would wait out its grace period and kill it.
    raise StoppedWhileStarting(signum)


def main(argv: Sequence[str] | None = None) -> int:
    # What reading the settings logs (an invalid HOSTNAME, as Docker sets it) waits for the
    # log format the settings choose, so JSON_OUTPUT's lines are all JSON.
    early = logging.handlers.BufferingHandler(capacity=1000)
    logging.getLogger().addHandler(early)
    try:
        settings = load_settings(argv)
    except SettingsError as e:
        for record in early.buffer:
            print(f"tei-serve: {record.getMessage()}", file=sys.stderr)
        print(f"tei-serve: {e}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger().removeHandler(early)
    configure_logging(settings)
    for record in early.buffer:
        logging.getLogger(record.name).handle(record)
    log.info("args: %r", settings)
    # Before any thread starts: threads inherit the capability (see low_ports).
    if not prepare_bind(settings.port):
        log.warning(
            "port %d is below 1024 and this process may not bind it: set --port/PORT to 1024 "
            "or above, or grant NET_BIND_SERVICE (or the net.ipv4.ip_unprivileged_port_start "
            "sysctl)", settings.port,
        )
    raise_open_file_limit()
    for warning in settings.start_warnings():
        log.warning("%s", warning)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):  # serve() and serve_grpc() set their own
            signal.signal(sig, _stop_while_starting)
    try:
        return _start_and_serve(settings)
    except StoppedWhileStarting as e:
        log.info("stopped by %s while starting", signal.Signals(e.signum).name)
        return 0


def _start_and_serve(settings: Settings) -> int:
    try:
        loaded = load_models(settings)
    except (ModelSourceError, SettingsError, TeiRuntimeError, ModelLoadError) as e:
        log.error("%s", e)
        return 1
    models = build_models(settings, [m for _, m in loaded])

    def announce() -> None:
        for model, m in loaded:
            log.info(
                "ready: model=%s task=%s provider=%s variant=%s max_input_length=%d "
                "max_batch_tokens=%d max_batch_requests=%s max_concurrent_requests=%d "
                "max_client_batch_size=%d listening on %s:%d%s",
                m.model_id, model.manifest.task.value, model.provider,
                model.variant.name, model.max_input_length,
                settings.max_batch_tokens, settings.max_batch_requests,
                settings.max_concurrent_requests, settings.max_client_batch_size,
                settings.hostname, settings.port,
                f" served_model_name={m.served_model_name}" if models.several else "",
            )

    ok = serve_grpc(models, announce) if settings.grpc else serve(models, announce)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
