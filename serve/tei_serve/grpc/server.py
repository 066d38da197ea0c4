"""`tei-serve --grpc`: TEI's `tei.v1` services on a grpc.aio server, with the standard health
service, server reflection, `--api-key` and a message limit, stopped gracefully on SIGTERM.

Health (`grpc.health.v1`): `tei.v1.Info` and `tei.v1.Tokenize` are always SERVING; the
services of the loaded model (Embed for an embedding model, Predict for a classifier, Predict
and Rerank for a reranker) follow the backend's health, as TEI's do, and so does the server as
a whole (""), which is what Kubernetes' gRPC probe and the image's HEALTHCHECK ask (TEI leaves
"" SERVING). The other services are NOT_SERVING: every call to them fails. A Check on the
model's services (or "") while the backend is unhealthy runs a probe forward first, as
HTTP's /health does, so a recovered backend is seen again. With several models, the services
of every model's task are followed, each SERVING while every model that answers it is healthy
(a failed reranker leaves Embed SERVING beside a healthy embedder), and "" while every model is.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any, cast

import grpc
from google.protobuf import descriptor_pool
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tei_runtime.manifest import Task
from tei_serve.errors import UnhealthyError
from tei_serve.grpc import tei_pb2
from tei_serve.grpc.auth import BearerAuth
from tei_serve.grpc.reflection_pool import MethodSymbolPool
from tei_serve.grpc.services import TeiServices, transport_limit
from tei_serve.metrics_port import MetricsPort
from tei_serve.models import Models
from tei_serve.serving import Serving
from tei_serve.settings import SHED_MARGIN_SECONDS, SHUTDOWN_GRACE_SECONDS

log = logging.getLogger("tei_serve")

_TEI = tei_pb2.DESCRIPTOR.services_by_name
ALWAYS_SERVING = (_TEI["Info"].full_name, _TEI["Tokenize"].full_name)
MODEL_SERVICES = (_TEI["Embed"].full_name, _TEI["Predict"].full_name, _TEI["Rerank"].full_name)


class GrpcStartError(OSError):
    """The gRPC port could not be bound."""


def model_services(task: Task) -> tuple[str, ...]:
    """The services a model of `task` answers (TEI: a reranker also answers Predict)."""
    embed, predict, rerank = MODEL_SERVICES
    match task:
        case Task.EMBED | Task.SPARSE:
            return (embed,)
        case Task.CLASSIFY:
            return (predict,)
        case Task.RERANK:
            return (predict, rerank)


def listen_address(hostname: str, port: int) -> str:
    return f"[{hostname}]:{port}" if ":" in hostname else f"{hostname}:{port}"


class ModelHealth(health.aio.HealthServicer):
    """The standard health service, with the model's services checked against the backend."""

    def __init__(self, models: Models) -> None:
        super().__init__()
        self.registered = {""}
        """The services given a status: the server's ("") and those `set` names."""
        self.models = models
        served = {name for s in models.servings for name in model_services(s.task)}
        self.followed = ("", *(name for name in MODEL_SERVICES if name in served))

    async def refresh(self) -> None:
        """Set the followed services from the backends' health (probing those unhealthy)."""
        outcomes = await asyncio.gather(*(s.health() for s in self.models.servings),
                                        return_exceptions=True)  # fmt: skip
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, UnhealthyError):
                raise outcome
        await self._follow([not isinstance(o, BaseException) for o in outcomes])

    async def mirror(self) -> None:
        """Set the followed services from the backends' flags as batches leave them, with no
        probe: Watch sees a failed batch as TEI's health channel reports it."""
        await self._follow([s.worker.healthy for s in self.models.servings])

    async def _follow(self, healthy: Sequence[bool]) -> None:
        """Each followed service from the health of the models that answer it (`healthy`, in
        the servings' order); "" from every model's."""
        for name in self.followed:
            answering = [ok for s, ok in zip(self.models.servings, healthy, strict=True)
                         if not name or name in model_services(s.task)]  # fmt: skip
            await self.set(name, health_pb2.HealthCheckResponse.SERVING if all(answering)
                           else health_pb2.HealthCheckResponse.NOT_SERVING)  # fmt: skip

    async def set(self, service: str, status: Any) -> None:
        self.registered.add(service)
        await super().set(service, status)

    async def _known(self, service: str, context: aio.ServicerContext[Any, Any]) -> None:
        """A service nobody registered fails NOT_FOUND in tonic-health's words, Watch as well
        as Check (grpcio's Watch would stream SERVICE_UNKNOWN and stay open: a TEI client
        watching a misspelled name would wait forever)."""
        if service not in self.registered:
            await context.abort(grpc.StatusCode.NOT_FOUND, "service not registered")

    async def Check(  # noqa: N802 (the gRPC method's name)
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        await self._known(request.service, context)
        if request.service in self.followed:
            await self.refresh()
        return await super().Check(request, context)

    async def Watch(  # noqa: N802 (the gRPC method's name)
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext[Any, Any]
    ) -> None:
        await self._known(request.service, context)
        await super().Watch(request, context)


METADATA_LIMIT = 1 << 20


class GrpcServer:
    """The running gRPC front-end of the served models: start, serve, stop."""

    def __init__(self, front: Serving | Models) -> None:
        self.models = Models.of(front)
        s = self.models.settings
        self.health = ModelHealth(self.models)
        self.services = TeiServices(self.models)
        self.metrics_port = MetricsPort(self.models.families.render, s.hostname,
                                        s.prometheus_port)  # fmt: skip
        self.port = 0
        self._grpc: aio.Server | None = None
        self._mirroring: set[asyncio.Task[None]] = set()

    def _health_changed(self, _healthy: bool) -> None:
        task = asyncio.get_running_loop().create_task(self.health.mirror())
        self._mirroring.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._mirroring.discard)

    def _build(self) -> aio.Server:
        """The grpc.aio server, built inside the running loop (it binds to the loop)."""
        s = self.models.settings
        server = aio.server(
            interceptors=[BearerAuth(s.api_key)] if s.api_key is not None else [],
            options=[
                ("grpc.max_receive_message_length", transport_limit(s.payload_limit)),
                # Identity only, as tonic without `accept_compressed`: a gzip message that
                # inflates 1000x would have the server hold 64 MiB for 62 KiB sent.
                ("grpc.compression_enabled_algorithms_bitset", 1),
                # grpc sets SO_REUSEPORT by default: a second server would share a taken port
                # silently instead of failing to start.
                ("grpc.so_reuseport", 0),
                # Keepalive pings are answered however often they come, as tonic (hyper's h2)
                # answers them: grpc-core's default would GOAWAY a client pinging more than
                # once in 5 minutes without data (grpc-go, Java and Envoy keepalives of 10-30
                # s), failing every call open on its connection.
                ("grpc.http2.max_ping_strikes", 0),
                ("grpc.keepalive_permit_without_calls", 1),
                # Request metadata up to 1 MiB (grpc-core refuses past 8 KiB at random and past
                # 16 KiB always; large JWTs or tracing baggage pass TEI's 16 MiB header list).
                ("grpc.max_metadata_size", METADATA_LIMIT),
                ("grpc.absolute_max_metadata_size", METADATA_LIMIT),
            ],
        )
        for service, handlers in self.services.handlers().items():
            server.add_registered_method_handlers(service, handlers)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [*ALWAYS_SERVING, *MODEL_SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME]
        # Reflection only calls the pool's lookups, which MethodSymbolPool has (delegated).
        pool = cast(descriptor_pool.DescriptorPool, MethodSymbolPool())
        reflection.enable_server_reflection(names, server, pool=pool)
        return server

    async def start(self) -> None:
        s = self.models.settings
        address = listen_address(s.hostname, s.port)
        self._grpc = self._build()
        try:
            self.port = self._grpc.add_insecure_port(address)
        except RuntimeError as e:
            raise GrpcStartError(f"cannot listen on {address}: {e}") from e
        await self.metrics_port.start()
        self.models.start()
        await self._grpc.start()
        await self._set_health()
        for serving in self.models.servings:
            serving.worker.health_listeners.append(self._health_changed)
        log.info("serving gRPC (tei.v1, grpc.health.v1, reflection) on %s", address)

    async def _set_health(self) -> None:
        for name in ALWAYS_SERVING:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        for name in MODEL_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.refresh()

    async def stop(self, grace: float | None = SHUTDOWN_GRACE_SECONDS) -> None:
        """Refuse new calls, let those in flight finish (up to `grace`; what is still queued
        near its end is answered UNAVAILABLE rather than cancelled), drain the queue."""
        await self.health.enter_graceful_shutdown()
        self.services.stopping = True
        if self._grpc is not None:
            stop_watching = None
            if grace is not None:
                stop_watching = self.models.watch_the_deadline(grace, SHED_MARGIN_SECONDS)
            await self._grpc.stop(grace)
            if stop_watching is not None:
                stop_watching()
        await self.models.stop()
        await self.metrics_port.close()


async def serve_grpc(
    served: Serving | Models, on_ready: Callable[[], None] = lambda: None
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    front = GrpcServer(served)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await front.start()
    on_ready()
    await stopping.wait()
    log.info("shutting down: finishing calls in flight")
    await front.stop()
