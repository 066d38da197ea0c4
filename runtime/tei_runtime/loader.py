"""`load()`: artifact folder -> verified files -> provider choice -> a ready Model."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from tei_runtime.artifact import Artifact, open_artifact, verify_tokenizer, verify_variant
from tei_runtime.errors import ManifestError, ProviderError
from tei_runtime.host import Host, probe
from tei_runtime.manifest import GraphForm, Manifest, Pooling, Precision, Task, Variant
from tei_runtime.model import Model
from tei_runtime.providers import (
    Device,
    Preference,
    ProviderChoice,
    choose,
    graph_cpu_class,
)
from tei_runtime.session import OrtBackend
from tei_runtime.tokenization import Tokenizer

log = logging.getLogger("tei_runtime")

# Fused residual norms whose onnxruntime CPU kernels are per-element loops, 3.4-5.3x slower
# than Add + LayerNormalization (1.2-1.7x for the simplified one); tei-export leaves them
# unfused since 2026-12-06 and CPU sessions do not fuse them at load, but an artifact
# exported before carries them in its graph.
SLOW_CPU_OPS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")


def _check_count(name: str, value: object) -> None:
    """A count argument: an int of at least 1 (a str or float from a config file is a clear
    error here, not a TypeError from deep inside)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProviderError(f"{name} must be an integer of at least 1, got {value!r}")
    if value < 1:
        raise ProviderError(f"{name} must be at least 1, got {value}")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tei-onnx"


def default_shas(manifest: Manifest) -> dict[Precision, str]:
    """Each precision's default graph's sha256 (host-specific graphs only run on CPUs, and
    the sha keys GPU engine caches): the graph `Manifest.variant` gives a GPU."""
    return {v.precision: manifest.variant(v.precision).sha256 for v in manifest.variants}


def with_pooling(manifest: Manifest, pooling: str | None) -> Manifest:
    """The manifest with its pooling replaced, as TEI's `--pooling` overrides a model's: only
    where the graph hands out token embeddings (an embedding artifact that pools outside its
    graph); anything else asks for a re-export, which ManifestError says how to do."""
    if pooling is None:
        return manifest
    try:
        wanted = Pooling.named(pooling)
    except ValueError:
        names = ", ".join(p.value for p in Pooling)
        raise ManifestError(f"unknown pooling {pooling!r}; use one of {names}") from None
    if wanted is manifest.pooling:
        return manifest
    again = f"export the checkpoint again with `tei-export ... --pooling {wanted.value}`"
    if manifest.task not in (Task.EMBED, Task.SPARSE) or manifest.pooling is None:
        raise ManifestError(
            f"pooling {wanted.value} does not apply to a `{manifest.task.value}` artifact"
        )
    if manifest.pooling_in_graph:
        raise ManifestError(
            f"this artifact pools ({manifest.pooling.value}) inside its graph (ahead of its "
            f"Dense layers, or SPLADE's reduction), so pooling {wanted.value} cannot replace "
            f"it at load time: {again}"
        )
    if Pooling.SPLADE in (wanted, manifest.pooling):
        raise ManifestError(
            f"SPLADE pools a masked-LM head's vocabulary logits and {manifest.pooling.value} "
            f"pools hidden states: one graph cannot give both; {again}"
        )
    return msgspec.structs.replace(manifest, pooling=wanted)


def graph_form(graph: str) -> GraphForm | None:
    """`load(graph=...)`: None for auto, else the form asked for (ProviderError if unknown)."""
    wanted = graph.lower() if isinstance(graph, str) else graph  # as dtype and device read
    if wanted == "auto":
        return None
    try:
        return GraphForm(wanted)
    except ValueError:
        known = ", ".join(["auto", *(g.value for g in GraphForm)])
        raise ProviderError(f"unknown graph {graph!r}; known: {known}") from None


def pick_variant(
    manifest: Manifest, choice: ProviderChoice, host: Host, forced: GraphForm | None
) -> Variant:
    """The variant a load runs: the graph form asked for (`graph_form`), else the one
    measured for the host's CPU class."""
    if forced is not None and choice.device is not Device.CPU:
        raise ProviderError(
            f"graph {forced.value} is for the CPU provider; {choice.provider} runs the default "
            "graph"
        )
    return manifest.variant(choice.precision, graph_cpu_class(choice, host), forced)


def planned_variant(
    artifact_dir: str | Path, *, device: str = "auto", dtype: str = "auto", graph: str = "auto"
) -> tuple[Device, Variant]:
    """The device and variant `load` with these arguments would run on this host, found
    without loading a session (a driver that fans the work out to other processes pins its
    workers to this graph). ProviderError / ManifestError as `load` raises them."""
    forced = graph_form(graph)
    artifact = open_artifact(artifact_dir)
    host = probe()
    choice = plan(artifact, host, device=device, dtype=dtype)
    return choice.device, pick_variant(artifact.manifest, choice, host, forced)


def slow_cpu_graph(variant: Variant, device: Device) -> str | None:
    """Why VARIANT runs slower on the CPU than a fresh export of it would, or None."""
    slow = [op for op in SLOW_CPU_OPS if variant.fused_ops.get(op)]
    if device is not Device.CPU or not slow:
        return None
    return (
        f"{variant.file} carries {' and '.join(slow)}, whose CPU kernels are slower than the "
        f"unfused norms: export the model again with this tei-export for a faster CPU graph"
    )


def plan(
    artifact: Artifact,
    host: Host,
    *,
    device: str = "auto",
    dtype: str = "auto",
    intra_op_threads: int | None = None,
    max_batch_tokens: int = 16384,
    cache_dir: Path | None = None,
) -> ProviderChoice:
    """The provider choice for this artifact on this host, without loading anything."""
    if intra_op_threads is not None:
        _check_count("intra_op_threads", intra_op_threads)
    _check_count("max_batch_tokens", max_batch_tokens)
    manifest = artifact.manifest
    return choose(
        host,
        Preference(
            device=device,
            dtype=dtype,
            variants=default_shas(manifest),
            cache_dir=cache_dir if cache_dir is not None else default_cache_dir(),
            max_batch_tokens=max_batch_tokens,
            max_input_length=manifest.max_input_length,
            input_names=tuple(manifest.io.inputs),
            intra_op_threads=intra_op_threads,
        ),
    )


def precision_for(host: Host, *, device: str = "auto", dtype: str = "auto") -> Precision:
    """The precision `load` runs on HOST with these flags, for an artifact that has every
    variant: what a first start has to export (ProviderError where the flags cannot run
    here, as `load` would raise)."""
    every = dict.fromkeys(Precision, "")
    return choose(host, Preference(device=device, dtype=dtype, variants=every)).precision


def load(
    artifact_dir: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    intra_op_threads: int | None = None,
    max_batch_tokens: int = 16384,
    cache_dir: Path | None = None,
    host: Host | None = None,
    max_input_length: int | None = None,
    graph: str = "auto",
    pooling: str | None = None,
) -> Model:
    """Load an artifact written by tei-export.

    device: auto|cpu|cuda|tensorrt|rocm|openvino (cuda:1 picks a GPU, openvino:GPU a device
    type). dtype: auto|float32|float16|int8 (or the manifest's names fp32, fp16); auto is fp32
    on CPU, fp16 on GPUs when the artifact has it. A device or dtype that cannot run here
    raises ProviderError; the files loaded are checked against the manifest's sha256
    (ManifestError naming the file).
    `host` replaces the live probe (tests, or a caller that probed already).
    `max_input_length` lowers the manifest's tokens per input (TEI's server cuts it to
    --max-batch-tokens); inputs are truncated, or refused, at the lower length.
    `graph`: auto (the graph measured best on this CPU class, else the default), fused or
    plain (CPU provider only: GPU engine caches are keyed by the default graph).
    `pooling`: cls|mean|last-token replaces an embedding artifact's pooling where its graph
    outputs token embeddings (ManifestError where it pools inside the graph, or for SPLADE).
    """
    forced = graph_form(graph)  # an unknown name fails before anything is read
    if max_input_length is not None:
        _check_count("max_input_length", max_input_length)
    artifact = open_artifact(artifact_dir)
    resolved = host if host is not None else probe()
    choice = plan(
        artifact,
        resolved,
        device=device,
        dtype=dtype,
        intra_op_threads=intra_op_threads,
        max_batch_tokens=max_batch_tokens,
        cache_dir=cache_dir,
    )
    manifest = with_pooling(artifact.manifest, pooling)
    variant = pick_variant(manifest, choice, resolved, forced)
    if slower := slow_cpu_graph(variant, choice.device):
        log.warning("%s: %s", artifact.root, slower)
    length = manifest.max_input_length
    if max_input_length is not None:
        length = min(length, max_input_length)
    tokenizer = Tokenizer(
        verify_tokenizer(artifact), max_input_length=length, name=manifest.source.model_id
    )
    model_path = verify_variant(artifact, variant)
    if choice.device is Device.TENSORRT:
        # TensorRT writes its engine and timing caches here; it does not create the folder.
        for _, options in choice.providers:
            if "trt_engine_cache_path" in options:
                Path(options["trt_engine_cache_path"]).mkdir(parents=True, exist_ok=True)
    backend = OrtBackend(model_path, choice)
    return Model(
        manifest=manifest,
        variant=variant,
        tokenizer=tokenizer,
        backend=backend,
        choice=choice,
        max_batch_tokens=max_batch_tokens,
        artifact_dir=artifact.root,
    )
