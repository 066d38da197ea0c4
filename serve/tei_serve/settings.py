"""Server settings: every flag of TEI's `text-embeddings-router`, same names, env vars, defaults.

Each option is declared once in `_OPTIONS` (flag, type, default, doc); the env var is the
UPPER_SNAKE form of the flag, as clap's `#[clap(long, env)]` makes it. Precedence is TEI's:
command line, then environment, then default. Secrets are redacted in `repr`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from tei_runtime.errors import ProviderError
from tei_runtime.manifest import Pooling, Task
from tei_runtime.providers import parse_device, parse_dtype

log = logging.getLogger("tei_serve")

_SECRETS = frozenset({"hf_token", "api_key"})
# Flags of TEI's router that are accepted so its command lines start unchanged, and do nothing.
_COMPATIBILITY_ONLY = ("uds_path",)
AUTO_TASK = "auto"
"""--task's value for: detect the task from the architecture (TEI's rule)."""
AUTO_DENSE = "auto"
"""--dense-path's value for: the Dense modules modules.json lists (TEI's default)."""
NO_ADAPTER = "none"
"""--adapter's value for: the base weights, no task adapter merged."""
SHUTDOWN_GRACE_SECONDS = 25
# Queued work is refused this long before the grace period ends (HTTP and gRPC): time for the
# batch already running to finish and for every refused request's answer to be written.
SHED_MARGIN_SECONDS = 3.0
"""After SIGTERM, how long calls in flight (HTTP and gRPC) may take before they are cut:
inside Kubernetes' default 30 s grace period, so the pod exits before it is killed."""
KEEP_ALIVE_SECONDS = 620
"""How long an idle HTTP connection is kept (TEI: forever); above common client and load
balancer idle timeouts, so a pooled client never sends on a connection being closed."""
SIMILARITY_TASK = "sentence-similarity"
"""TEI's own value of the TASK env var: an embedding model's `/` and `/invocations` answer
/similarity. It is not a --task value, so TASK keeps that meaning here too."""
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off", ""})


class SettingsError(ValueError):
    """A flag or env var has a value the server cannot start with."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model_ids: tuple[str, ...] = ()
    """--model-id, repeated to serve several models (empty: the bundled default)."""
    tokenization_workers: int | None = None
    revisions: tuple[str, ...] = ()
    """--revision: one for every --model-id, or one per --model-id in the same order (`auto`:
    the default branch), or none."""
    dtypes: tuple[str, ...] = ()
    """--dtype: one for every --model-id, or one per --model-id in order (`auto`: the host's
    pick), or none."""
    served_model_names: tuple[str, ...] = ()
    """--served-model-name, one per --model-id in the same order (or none)."""
    poolings: tuple[str, ...] = ()
    """--pooling: one for every --model-id, or one per --model-id in order (`auto`: the
    model's own), or none."""
    tasks: tuple[str, ...] = ()
    """--task, one per --model-id in the same order (or none): what a checkpoint exported on
    first start becomes; `auto` detects it from the architecture."""
    dense_paths: tuple[str, ...] = ()
    """--dense-path, one per --model-id in the same order (or none): the Dense module folder a
    checkpoint exported on first start puts into its graph; `auto` follows modules.json."""
    adapters: tuple[str, ...] = ()
    """--adapter, one per --model-id in the same order (or none): the task LoRA adapter merged
    into a checkpoint exported on first start (jina-embeddings-v3); `none` keeps the base."""
    trust_remote_code: bool = False
    max_concurrent_requests: int = 512
    max_batch_tokens: int = 16384
    max_batch_requests: int | None = None
    max_client_batch_size: int = 32
    auto_truncate: bool = True
    default_prompt_name: str | None = None
    default_prompt: str | None = None
    hf_token: str | None = None
    hostname: str = "0.0.0.0"
    port: int = 3000
    uds_path: str = "/tmp/text-embeddings-inference-server"
    huggingface_hub_cache: str | None = None
    payload_limit: int = 2_000_000
    api_key: str | None = None
    json_output: bool = False
    disable_spans: bool = False
    otlp_endpoint: str | None = None
    otlp_service_name: str = "text-embeddings-inference.server"
    prometheus_port: int = 9000
    cors_allow_origin: tuple[str, ...] | None = None
    grpc: bool = False
    similarity_root: bool = False
    """TASK=sentence-similarity (env only, as in TEI): `/` and `/invocations` of an embedding
    model answer like /similarity."""
    # ours
    device: str = "auto"
    intra_op_threads: int | None = None
    max_queue_wait_ms: float = 50.0
    log_level: str = "info"

    def __repr__(self) -> str:
        parts = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in _SECRETS and value is not None:
                value = "<redacted>"
            parts.append(f"{name}={value!r}")
        return f"Settings({', '.join(parts)})"

    __str__ = __repr__

    @property
    def model_id(self) -> str | None:
        """The first --model-id (the only one of a single-model server)."""
        return self.model_ids[0] if self.model_ids else None

    @property
    def served_model_name(self) -> str | None:
        """The first --served-model-name."""
        return self.served_model_names[0] if self.served_model_names else None

    @property
    def dtype(self) -> str | None:
        """The first model's --dtype (None: the host's pick)."""
        return self.dtype_of(0)

    @property
    def revision(self) -> str | None:
        """The first model's --revision."""
        return self.revision_of(0)

    @property
    def pooling(self) -> str | None:
        """The first model's --pooling."""
        return self.pooling_of(0)

    def dtype_of(self, index: int) -> str | None:
        """The --dtype of the index-th --model-id; None: the host's pick."""
        return _one_of(self.dtypes, index)

    def revision_of(self, index: int) -> str | None:
        """The --revision of the index-th --model-id; None: the default branch."""
        return _one_of(self.revisions, index)

    def pooling_of(self, index: int) -> str | None:
        """The --pooling of the index-th --model-id; None: the model's own."""
        return _one_of(self.poolings, index)

    def task_of(self, index: int) -> Task | None:
        """The --task given for the index-th --model-id; None: detect it."""
        if not self.tasks or self.tasks[index] == AUTO_TASK:
            return None
        return Task(self.tasks[index])

    def dense_path_of(self, index: int) -> str | None:
        """The --dense-path given for the index-th --model-id; None: modules.json's."""
        if not self.dense_paths or self.dense_paths[index] == AUTO_DENSE:
            return None
        return self.dense_paths[index]

    def adapter_of(self, index: int) -> str | None:
        """The --adapter given for the index-th --model-id; None: the base weights."""
        if not self.adapters or self.adapters[index] == NO_ADAPTER:
            return None
        return self.adapters[index]

    def compatibility_only(self) -> list[str]:
        """Flags set to something other than their default that change nothing here."""
        defaults = Settings()
        return [
            f"--{name.replace('_', '-')}"
            for name in _COMPATIBILITY_ONLY
            if getattr(self, name) != getattr(defaults, name)
        ]

    def start_warnings(self) -> list[str]:
        """What is logged once at start about settings that do less than they seem to."""
        out = [f"{flag} is accepted for compatibility with TEI and has no effect"
               for flag in self.compatibility_only()]  # fmt: skip
        if self.disable_spans and self.otlp_endpoint:
            out.append(f"--disable-spans is set: no request spans go to {self.otlp_endpoint}")
        if self.max_client_batch_size > self.max_concurrent_requests:
            # One permit per input, as in TEI: such a request can never be admitted.
            out.append(
                f"--max-client-batch-size {self.max_client_batch_size} is above "
                f"--max-concurrent-requests {self.max_concurrent_requests}: a request with more "
                f"inputs than {self.max_concurrent_requests} is always answered 429 (as in "
                "TEI); raise --max-concurrent-requests too"
            )
        return out

    def effective_tokenization_workers(self) -> int:
        if self.tokenization_workers is not None:
            return self.tokenization_workers
        return max(1, min(64, (_cpu_count() - 1)))


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value {value!r}")


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _port(value: str) -> int:
    n = int(value)
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {n}")
    return n


def _pooling(value: str) -> str:
    if value == AUTO:
        return value
    try:
        return Pooling.named(value).value
    except ValueError:
        names = ", ".join(p.value for p in Pooling)
        raise argparse.ArgumentTypeError(f"pooling must be one of {names}") from None


def _device(value: str) -> str:
    try:
        parse_device(value)
    except ProviderError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _task(value: str) -> str:
    v = value.strip().lower()
    choices = [AUTO_TASK, *(t.value for t in Task)]
    if v not in choices:
        raise argparse.ArgumentTypeError(f"task must be one of {', '.join(choices)}")
    return v


def _dtype(value: str) -> str:
    """The runtime's name for the variant (`tei_runtime.load` takes the same names)."""
    try:
        return parse_dtype(value).value
    except ProviderError as e:
        raise argparse.ArgumentTypeError(
            "dtype must be one of float32, float16, int8, auto"
        ) from e


AUTO = "auto"
"""In a per-model list of --dtype, --revision or --pooling: nothing given for that model."""


def _one_of(values: tuple[str, ...], index: int) -> str | None:
    """A flag given once applies to every model; given per model, the index-th."""
    if not values:
        return None
    value = values[0] if len(values) == 1 else values[index]
    return None if value == AUTO else value


@dataclass(frozen=True)
class _Option:
    flag: str
    kind: Callable[[str], Any] | None
    """Value parser; None for a presence flag (`--json-output`)."""
    doc: str
    aliases: tuple[str, ...] = ()
    optional_value: bool = False
    """`--auto-truncate` takes an optional value, like clap's num_args 0..=1."""
    multiple: bool = False
    field: str | None = None
    """The Settings field, where it is not the flag's snake_case name."""
    env_may_be_foreign: bool = False
    """Ours alone, under an env name so common that the environment may hold it for
    something else (a hosting platform's TASK): TEI, which never reads it, starts whatever it
    holds, so an unreadable value there is ignored with a warning, not a failed start."""

    @property
    def dest(self) -> str:
        return self.field or self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return self.flag.lstrip("-").replace("-", "_").upper()


_OPTIONS: tuple[_Option, ...] = (
    _Option("--model-id", str, "Artifact folder, checkpoint folder or hub id (exported on first "
            "start); repeat it (or comma-separate MODEL_ID) to serve several models from one "
            "process. Default: the bundled all-MiniLM-L6-v2.", multiple=True, field="model_ids"),
    _Option("--revision", str, "Hub revision (branch, tag or commit) of --model-id; with "
            "several models one for all, or repeat it in --model-id order (auto: the default "
            "branch).", multiple=True, field="revisions"),
    _Option("--tokenization-workers", _positive_int,
            "Tokenizer threads. Default: CPU cores - 1, clamped to 1..64."),
    _Option("--dtype", _dtype, "Variant to load: float32, float16, int8 (or fp32, fp16) or "
            "auto, the default (fp32 on a CPU, fp16 on a GPU, each in the graph form the "
            "host runs fastest). With several models one for all, or repeat it in --model-id "
            "order.", multiple=True, field="dtypes"),
    _Option("--served-model-name", str, "Name requests pick the model by and OpenAI responses "
            "return; with several models repeat it, in --model-id order. Default: the model id "
            "(several models: its last path part).", multiple=True, field="served_model_names"),
    _Option("--pooling", _pooling, "Override the model's pooling: cls, mean, splade, "
            "last-token. A checkpoint is exported with it; an artifact that pools outside its "
            "graph pools this way instead (one that pools inside, or SPLADE, fails with how "
            "to re-export). Classifier and reranker heads ignore it, as in TEI. With several "
            "models one for all, or repeat it in --model-id order (auto: the model's own).",
            multiple=True, field="poolings"),
    _Option("--task", _task, "What a checkpoint exported on first start becomes: auto (from "
            "its architecture, as TEI does), embed, classify, rerank or sparse; `rerank` on a "
            "*ForCausalLM is a generative reranker (Qwen3-Reranker). With several models repeat "
            "it in --model-id order. Checked against an artifact's own task.", multiple=True,
            field="tasks", env_may_be_foreign=True),
    _Option("--max-concurrent-requests", _positive_int,
            "Admission permits (one per input); none left answers 429."),
    _Option("--max-batch-tokens", _positive_int,
            "Token budget of one batch, counted as padded cost (longest x count)."),
    _Option("--max-batch-requests", _positive_int, "Most entries in one batch."),
    _Option("--max-client-batch-size", _positive_int, "Most inputs in one request."),
    _Option("--auto-truncate", parse_bool, "Default for per-request `truncate`.",
            optional_value=True),
    _Option("--default-prompt-name", str, "Prompt name applied when a request names none."),
    _Option("--default-prompt", str, "Raw prompt prefix applied when a request names none."),
    _Option("--dense-path", str, "The Dense module folder (e.g. 2_Dense_1024) a checkpoint "
            "exported on first start puts into its graph; auto (the default) follows "
            "modules.json, as TEI does. With several models repeat it in --model-id order.",
            multiple=True, field="dense_paths"),
    _Option("--adapter", str, "The task LoRA adapter merged into a checkpoint exported on "
            "first start (jina-embeddings-v3: retrieval.query, retrieval.passage, separation, "
            "classification, text-matching); none (the default) keeps the base weights. With "
            "several models repeat it in --model-id order. Checked against an artifact's own.",
            multiple=True, field="adapters"),
    _Option("--trust-remote-code", None, "Let the first-start export run the modeling code a "
            "checkpoint ships (JinaBERT: jina-embeddings-v2-*); review it first."),
    _Option("--hf-token", str, "Hugging Face token (secret).", aliases=("--hf-api-token",)),
    _Option("--hostname", str, "IP address to listen on."),
    _Option("--port", _port, "Port to listen on.", aliases=("-p",)),
    _Option("--uds-path", str, "Accepted for compatibility; unused."),
    _Option("--huggingface-hub-cache", str, "Hub cache; exported artifacts go in "
            "<cache>/tei-onnx/."),
    _Option("--payload-limit", _positive_int, "Largest request body in bytes (413 above)."),
    _Option("--api-key", str, "Require `Authorization: Bearer <key>` (secret)."),
    _Option("--json-output", None, "Log JSON lines."),
    _Option("--disable-spans", None, "Create no request spans (nothing is exported to "
            "--otlp-endpoint)."),
    _Option("--otlp-endpoint", str, "OTLP/gRPC collector for request spans, e.g. "
            "http://localhost:4317. Default: no tracing."),
    _Option("--otlp-service-name", str, "service.name of the exported spans."),
    _Option("--prometheus-port", _port, "Port serving the te_* Prometheus metrics, in both "
            "modes (HTTP also keeps /metrics); 0 picks a free port."),
    _Option("--cors-allow-origin", str, "Allowed CORS origins (repeat or comma-separate). "
            "Default: any.", multiple=True),
    _Option("--grpc", None, "Serve TEI's gRPC API (tei.v1 services, grpc.health.v1, "
            "reflection) on --port instead of HTTP.", env_may_be_foreign=True),
    _Option("--device", _device, "Execution provider: auto, cpu, cuda, tensorrt, rocm, "
            "openvino (cuda:1, openvino:GPU pick one device).", aliases=("--providers",),
            env_may_be_foreign=True),
    _Option("--intra-op-threads", _positive_int, "ONNX Runtime intra-op threads of each model. "
            "Default: the usable cores, split evenly between the models."),
    _Option("--max-queue-wait-ms", float, "Longest an entry waits before batches are packed "
            "strictly first-come first-served."),
    _Option("--log-level", str, "Log level (also LOG_LEVEL)."),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tei-serve",
        description="Text Embeddings Inference, served from ONNX Runtime. Every flag also "
        "reads the env var of the same name in UPPER_SNAKE case.",
        argument_default=argparse.SUPPRESS,
    )
    defaults = Settings()
    for opt in _OPTIONS:
        default = getattr(defaults, opt.dest)
        help_text = f"{opt.doc} [env: {opt.env}]"
        if default is not None and opt.kind is not None:
            help_text += f" [default: {default}]"
        names = [opt.flag, *opt.aliases]
        if opt.kind is None:
            parser.add_argument(*names, dest=opt.dest, action="store_true", help=help_text)
        elif opt.optional_value:
            parser.add_argument(*names, dest=opt.dest, nargs="?", const=True, type=opt.kind,
                                help=help_text)
        elif opt.multiple:
            parser.add_argument(*names, dest=opt.dest, nargs="+", action="extend",
                                type=opt.kind, metavar=opt.env, help=help_text)
        else:
            parser.add_argument(*names, dest=opt.dest, type=opt.kind, help=help_text)
    return parser


def _from_env(opt: _Option, raw: str) -> Any:
    try:
        if opt.kind is None:
            return parse_bool(raw)
        if opt.multiple:
            entries = [v.strip() for v in raw.split(",")]
            if len(entries) > 1 and not all(entries):
                # `a,,b`: dropping the gap would shift every later entry onto another model
                raise ValueError(f"entry {entries.index('') + 1} is empty; give every entry, "
                                 "comma-separated")  # fmt: skip
            return [opt.kind(v) for v in entries if v]
        return opt.kind(raw)
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise SettingsError(f"env {opt.env}={raw!r}: {e}") from e


def _check_models(values: dict[str, Any]) -> None:
    """One --served-model-name, --task, --dense-path and --adapter per --model-id (or none),
    no name twice."""
    models = max(1, len(values.get("model_ids", [])))
    names = values.get("served_model_names", [])
    per_model = (
        ("--served-model-name", names),
        ("--task", values.get("tasks", [])),
        ("--dense-path", values.get("dense_paths", [])),
        ("--adapter", values.get("adapters", [])),
    )
    for flag, given in per_model:
        if given and len(given) != models:
            raise SettingsError(
                f"{flag} is given {len(given)} times for {models} --model-id: give one per "
                "model, in the same order, or none"
            )
    for flag, key in (("--revision", "revisions"), ("--dtype", "dtypes"),
                      ("--pooling", "poolings")):  # fmt: skip
        given = values.get(key, [])
        if len(given) > 1 and len(given) != models:
            raise SettingsError(
                f"{flag} is given {len(given)} times for {models} --model-id: give one for "
                "every model, or one per model in the same order"
            )
    if any(not m.strip() for m in values.get("model_ids", [])):
        raise SettingsError(
            "--model-id is empty: name a model (with no --model-id at all, all-MiniLM-L6-v2 "
            "is served)"
        )
    if any(not n.strip() for n in names):
        raise SettingsError("--served-model-name is empty: give each model a name, or none")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SettingsError(f"--served-model-name {repeated[0]!r} is given twice")


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Parse `argv` (default: sys.argv[1:]) over `env` (default: os.environ)."""
    env = os.environ if env is None else env
    args = vars(build_parser().parse_args(argv))
    similarity_root = env.get("TASK", "").strip().lower() == SIMILARITY_TASK
    values: dict[str, Any] = {"similarity_root": similarity_root}
    for opt in _OPTIONS:
        if opt.dest in args:
            values[opt.dest] = args[opt.dest]
        elif opt.dest == "tasks" and similarity_root:
            continue
        elif opt.env in env:
            try:
                values[opt.dest] = _from_env(opt, env[opt.env])
            except SettingsError as e:
                if not opt.env_may_be_foreign:
                    raise
                log.warning("%s: not read as %s, which TEI does not have; ignored", e, opt.flag)
        elif opt.dest == "hf_token" and "HF_API_TOKEN" in env:
            values[opt.dest] = env["HF_API_TOKEN"]
    if "cors_allow_origin" in values:
        values["cors_allow_origin"] = tuple(values["cors_allow_origin"])
    _check_models(values)
    if values.get("default_prompt_name") and values.get("default_prompt"):
        raise SettingsError("--default-prompt-name and --default-prompt cannot both be set")
    hostname = values.get("hostname")
    if hostname is not None:
        try:
            ipaddress.ip_address(hostname)
        except ValueError:
            # Docker sets HOSTNAME to the container id; TEI warns and listens everywhere.
            log.warning("invalid hostname %r, defaulting to 0.0.0.0", hostname)
            values["hostname"] = "0.0.0.0"
    return msgspec.convert(values, Settings)
