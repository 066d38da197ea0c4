"""export_model: the whole export, plan to atomic rename. The CLI and the server call this."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import msgspec
import onnx

from tei_export import (
    external,
    fuse,
    hub_layouts,
    precision,
    tokenizer_json,
    validate,
)
from tei_export.cards import CardError
from tei_export.checkpoint import Checkpoint, read_checkpoint
from tei_export.errors import ExportError, InterruptedAfterWriting, Terminated
from tei_export.plan import ExportPlan, make_plan
from tei_export.progress import Progress
from tei_export.source import ResolvedSource, resolve
from tei_runtime.checksum import sha256_file
from tei_runtime.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    GraphForm,
    IoNames,
    Manifest,
    Pooling,
    Precision,
    Prompts,
    Source,
    Task,
    Toolchain,
    Validation,
    Variant,
    encode_manifest,
)
from tei_runtime.permissions import publish_tree
from tei_runtime.staging import aside_path, remove_abandoned, staging_folder

# The artifact is built in `.<output name>.partial-<random>` beside the output.
PARTIAL_TAG = "partial-"
# Rewritten checkpoint copies (a hub layout's native weights, a converted tokenizer) go in
# `.<output name>.scratch-<random>`, removed when the export ends, however it ends.
SCRATCH_TAG = "scratch-"
# --overwrite moves the earlier artifact to `.<output name>.replaced-<random>` until the new
# one is in place.
REPLACED_TAG = "replaced-"


class _Graph(msgspec.Struct, frozen=True, kw_only=True):
    """One graph file the export wrote, before validation."""

    precision: Precision
    graph: GraphForm
    path: Path
    fused_ops: dict[str, int]

    @property
    def name(self) -> str:
        """The variant's name: its precision, with `-plain` for a plain graph."""
        suffix = "-plain" if self.graph is GraphForm.PLAIN else ""
        return f"{self.precision.value}{suffix}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def _toolchain() -> Toolchain:
    return Toolchain(
        tei_onnx=_version("tei-onnx"),
        torch=_version("torch"),
        transformers=_version("transformers"),
        onnx=_version("onnx"),
        onnxruntime=_version("onnxruntime"),
    )


def _prepare_output(output_dir: Path, overwrite: bool) -> Path | None:
    """Check OUTPUT_DIR can be written (and replaced, with --overwrite) before any work, and
    create its missing parents; returns the topmost folder created, to remove on failure."""
    if output_dir.exists():
        if not output_dir.is_dir():
            raise ExportError(f"{output_dir} is a file; the output is an artifact folder")
        if not overwrite:
            raise ExportError(f"{output_dir} already exists (pass --overwrite to replace it)")
        _check_replaceable(output_dir)
        _check_renamable(output_dir)
    parent = output_dir.parent
    if not_a_folder := next((p for p in (*reversed(parent.parents), parent)
                             if p.exists() and not p.is_dir()), None):  # fmt: skip
        raise ExportError(f"{not_a_folder} is a file, not a folder: {output_dir} cannot be made")
    created = next((p for p in (*reversed(parent.parents), parent) if not p.exists()), None)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".tei-export-probe-"):
            pass
    except OSError as e:
        raise ExportError(f"cannot write to {parent}: {e.strerror or e}") from e
    return created


def _check_replaceable(output_dir: Path) -> None:
    """--overwrite replaces an earlier artifact, never a folder of other things: an empty
    folder, or one whose manifest.json is a tei-onnx manifest (of any schema version: an
    upgrade re-exports over its older artifacts) and which holds nothing the manifest does not
    name. A `manifest.json` alone is no proof (a browser extension's or a web app's folder
    has one), and files a user added to an artifact are theirs."""
    entries = sorted(p.name for p in output_dir.iterdir())
    if not entries:
        return
    refusal = "--overwrite replaces only an earlier artifact or an empty folder"
    manifest = output_dir / MANIFEST_NAME
    if not manifest.is_file():
        raise ExportError(f"{output_dir} is not an artifact folder (no {MANIFEST_NAME}); "
                          f"{refusal}")  # fmt: skip
    try:
        fields = msgspec.json.decode(manifest.read_bytes())
    except (OSError, msgspec.DecodeError):
        fields = None
    if not isinstance(fields, dict) or not {"schema_version", "variants"} <= fields.keys():
        raise ExportError(
            f"{output_dir} is not an artifact folder (its {MANIFEST_NAME} is not a tei-onnx "
            f"manifest); {refusal}"
        )
    named = _strings_in(fields)
    others = [e for e in entries if e != MANIFEST_NAME and e not in named]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ExportError(
            f"{output_dir} holds what its artifact's manifest does not name ({shown}): "
            f"{refusal}; move those out first, or export elsewhere"
        )


def _strings_in(value: object) -> set[str]:
    """Every string in a decoded JSON value, keys too (external data files are keys): the
    file names a manifest of any version names."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return {s for k, v in value.items() for s in (k, *_strings_in(v))}
    if isinstance(value, list):
        return {s for v in value for s in _strings_in(v)}
    return set()


def _check_renamable(output_dir: Path) -> None:
    """The finished artifact is built beside OUTPUT_DIR and renamed into place, the old one set
    aside by a rename: one that cannot be renamed (a mount point, a container's `-v ...:/out`
    bind mount even from the same file system, an immutable folder) is found now, by trying
    it, rather than after hours of export."""
    # Not a tag the sweep of killed exports removes: this is the earlier artifact itself.
    probe = output_dir.with_name(f".{output_dir.name}.rename-probe-{secrets.token_hex(6)}")
    try:
        output_dir.rename(probe)
    except OSError as e:
        hint = (
            f"export into a folder inside it (e.g. {output_dir / 'model'})"
            if e.errno == errno.EBUSY or os.path.ismount(output_dir)
            else e.strerror or str(e)
        )
        raise ExportError(
            f"{output_dir} cannot be replaced (--overwrite renames it aside, and it cannot be "
            f"renamed: a mount point?): {hint}"
        ) from e
    probe.rename(output_dir)


def _remove_created(created: Path | None) -> None:
    """Take away the parent folders a failed export created, if they hold no file."""
    if created is not None and not any(p.is_file() for p in created.rglob("*")):
        shutil.rmtree(created, ignore_errors=True)


def export_model(
    model: str,
    output_dir: Path,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: Path | None = None,
    task: Task | None = None,
    pooling: Pooling | str | None = None,
    precisions: list[Precision] | list[str] | None = None,
    trust_remote_code: bool = False,
    opset: int = 17,
    overwrite: bool = False,
    quiet: bool = False,
    external_data: bool = False,
    dense_path: str | None = None,
    adapter: str | None = None,
    plain_graphs: bool = False,
) -> Path:
    """Export MODEL (a folder or hub id) into the artifact folder OUTPUT_DIR and return it.

    Work happens in a temporary folder beside OUTPUT_DIR that is renamed into place at the
    end, so a failure at any stage leaves nothing behind. Weights go into `<graph>.data`
    files when the model is too big for one protobuf (~2 GB) or `external_data` is set.
    `dense_path` picks the one Dense module folder put into the graph (default: the Dense
    modules modules.json lists, in order, as TEI does). `adapter` names the task LoRA
    adapter merged into the weights of a checkpoint that has some (jina-embeddings-v3:
    retrieval.query, retrieval.passage, separation, classification, text-matching; default:
    none, the base weights), and its task instruction becomes the default prompt.
    `plain_graphs` also writes the plain traced graph (fp32, and int8 when int8 is written)
    where the model card names no CPU class for it: no host loads it unless asked
    (`load(graph="plain")`), which is how a host class nobody measured compares the two.
    """
    output_dir = Path(output_dir).resolve()
    created = _prepare_output(output_dir, overwrite)
    try:
        progress = Progress(quiet=quiet)
        if quiet:
            _silence_library_progress()
        # What an export killed outright (SIGKILL, the OOM killer) left beside this output.
        for tag in (PARTIAL_TAG, SCRATCH_TAG, REPLACED_TAG):
            for stale in remove_abandoned(output_dir, tag):
                progress.note(f"removed {stale.name}, left by an export that was killed")
        with staging_folder(output_dir, SCRATCH_TAG) as scratch:
            # Rewritten copies of the checkpoint go in SCRATCH, removed however this ends.
            staged: Path | None = None
            checkpoint: Path | None = None
            try:
                with progress.stage("resolve", announce=False):
                    source = resolve(
                        model,
                        revision=revision,
                        token=token,
                        cache_dir=cache_dir,
                        trust_remote_code=trust_remote_code,
                    )
                    if revision is not None and source.commit_sha is None:
                        progress.warn(
                            f"--revision {revision} does nothing for a local folder: it is "
                            "exported as it is"
                        )
                    if source.path.resolve().is_relative_to(output_dir):
                        raise ExportError(
                            f"{output_dir} holds the checkpoint {source.path}; write the artifact "
                            f"elsewhere"
                        )
                    checkpoint = source.path
                    staged = hub_layouts.stage_native(source.path, scratch, adapter=adapter)
                if staged is not None:
                    progress.note(
                        "hub layout mapped onto transformers' native class; no hub code runs"
                    )
                    _note_adapters(progress, source.path, adapter)
                    source = msgspec.structs.replace(source, path=staged, adapter=adapter)
                if tokenizer_json.needs_conversion(source.path):
                    with progress.stage("tokenizer"):
                        if staged is None:
                            staged = tokenizer_json.stage_with_tokenizer_json(source.path, scratch)
                            source = msgspec.structs.replace(source, path=staged)
                        else:
                            tokenizer_json.convert(staged, staged)
                    progress.note(
                        "no tokenizer.json in the checkpoint: converted its tokenizer files with "
                        "transformers' fast tokenizer"
                    )
                if (source.path / tokenizer_json.TOKENIZER_JSON).is_file():
                    tokenizer_json.check_loads(source.path)
                return _export(
                    source, output_dir, progress, task=task, pooling=pooling,
                    precisions=precisions, trust_remote_code=trust_remote_code, opset=opset,
                    external_data=external_data, dense_path=dense_path, overwrite=overwrite,
                    plain_graphs=plain_graphs,
                )  # fmt: skip
            except (ExportError, CardError) as e:
                renamed = _naming_the_checkpoint(e, staged, checkpoint)
                if renamed is e:
                    raise
                raise renamed from e
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    except BaseException:
        _remove_created(created)
        raise


def _naming_the_checkpoint(
    error: ExportError | CardError, staged: Path | None, checkpoint: Path | None
) -> ExportError | CardError:
    """`error` with the rewritten copy's path replaced by the user's checkpoint: the copy sits
    in the scratch folder, which is gone by the time the user reads the message, and holds
    the checkpoint's files under the same names."""
    message = str(error)
    if staged is None or checkpoint is None or str(staged) not in message:
        return error
    return type(error)(message.replace(str(staged), str(checkpoint)))


def _note_adapters(progress: Progress, checkpoint: Path, adapter: str | None) -> None:
    """Say which task adapter went into the weights, or which the checkpoint offers."""
    if adapter is not None:
        progress.note(f"task LoRA adapter {adapter!r} merged into the weights")
        return
    offered = hub_layouts.offered_adapters(checkpoint)
    if offered:
        progress.note(
            f"no task LoRA adapter merged (the base weights); this checkpoint has "
            f"{', '.join(offered)}: pick one with --adapter"
        )


def _silence_library_progress() -> None:
    """--quiet also covers the bars transformers 5 ("Loading weights") and the hub draw, and
    transformers' warnings (its multi-line weight "LOAD REPORT"), and the notes onnxruntime's
    transformer optimizer logs as warnings (a vocabulary no larger than the position table)."""
    import logging

    from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]
    from onnxruntime.transformers import optimizer
    from transformers.utils import logging as transformers_logging

    # Its fusion modules import one another as top-level modules (fusion_embedlayer, ...),
    # so their loggers are named after those.
    folder = Path(optimizer.__file__).parent
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").parent == folder:
            logging.getLogger(name).setLevel(logging.ERROR)
    disable_progress_bars()
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    transformers_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def _export(
    source: ResolvedSource,
    output_dir: Path,
    progress: Progress,
    *,
    task: Task | None,
    pooling: Pooling | str | None,
    precisions: list[Precision] | list[str] | None,
    trust_remote_code: bool,
    opset: int,
    external_data: bool,
    dense_path: str | None,
    overwrite: bool,
    plain_graphs: bool,
) -> Path:
    with progress.stage("plan", announce=False):
        checkpoint = read_checkpoint(source.path)
        plan = make_plan(
            checkpoint,
            task=task,
            pooling=Pooling(pooling) if isinstance(pooling, str) else pooling,
            precisions=[Precision(p) for p in precisions] if precisions else None,
            trust_remote_code=trust_remote_code,
            opset=opset,
            dense_path=dense_path,
        )
        tokenizer_notes = tokenizer_json.check_fits_vocabulary(
            source.path, checkpoint.config.get("vocab_size")
        )
    if checkpoint.st_lowercases and not tokenizer_json.lowercases(source.path):
        tokenizer_notes.append(
            "sentence_bert_config.json sets do_lower_case but tokenizer.json keeps case: "
            "sentence-transformers lowercases each text first and this artifact does not (as "
            "TEI does not), so mixed-case text embeds differently from sentence-transformers; "
            "lowercase text before sending it"
        )
    for note in [*plan.notes, *tokenizer_notes]:
        progress.warn(note)
    if checkpoint.own_code_skipped and not trust_remote_code:
        progress.warn(
            f"config.json's auto_map (the model's own code) is not run: {checkpoint.architecture} "
            "is transformers' own class, traced as TEI runs its own implementation "
            "(--trust-remote-code runs the model's code instead)"
        )
    if plan.task is Task.EMBED and checkpoint.st_pooling is None and pooling is None:
        progress.warn(f"no 1_Pooling/config.json: using the card's default pooling {plan.pooling}")
    if (
        plan.task is Task.EMBED
        and plan.card.generative_reranker is not None
        and checkpoint.architecture.endswith("ForCausalLM")
        and checkpoint.st_pooling is None
    ):
        progress.warn(
            f"{checkpoint.architecture} exported as an embedder (last token); a generative "
            f"reranker of this family (Qwen3-Reranker) needs --task rerank"
        )
    for kind in checkpoint.ignored_modules:
        progress.warn(f"modules.json: {kind} is not a module tei-onnx runs; left out")
    if (
        not checkpoint.pools_prompt
        and checkpoint.prompts
        and plan.pooling in (Pooling.MEAN, Pooling.CLS)
    ):
        progress.warn(
            "1_Pooling/config.json has include_prompt: false; like TEI, tei-onnx pools the "
            "prompt's tokens too, so prompted vectors differ from sentence-transformers'"
        )
    if plan.card.fusion.attention_unfused_reason:
        progress.note(f"attention stays unfused: {plan.card.fusion.attention_unfused_reason}")

    with staging_folder(output_dir, PARTIAL_TAG) as work:
        try:
            manifest = _build(
                plan, source, checkpoint, work, progress, trust_remote_code, external_data,
                plain_graphs,
            )  # fmt: skip
            publish_tree(work)  # mkdtemp made it 0700: readable by the serving user too
            aside = _move_into_place(work, output_dir, overwrite)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    try:
        if aside is not None:  # the artifact it replaced: seconds for a big model
            shutil.rmtree(aside, ignore_errors=True)
        progress.summary(manifest, output_dir)
    except (KeyboardInterrupt, Terminated) as e:
        # Ctrl-C or the CLI's signal unwinding: not "nothing was written" (a SystemExit, the
        # server's export child stopping, stays what it is)
        raise InterruptedAfterWriting(str(output_dir), e) from e
    return output_dir


def _move_into_place(work: Path, output_dir: Path, overwrite: bool) -> Path | None:
    """Rename WORK to OUTPUT_DIR; an artifact already there (--overwrite) is set aside first
    and put back if the rename fails, so an interrupted export leaves the old one whole.
    What appeared at OUTPUT_DIR while the export ran is checked again as at the start: without
    --overwrite nothing there is replaced, with it only an artifact or an empty folder.
    Returns where the replaced artifact was set aside, for the caller to remove."""
    try:
        if not output_dir.exists():
            try:
                work.rename(output_dir)  # an empty folder made meanwhile is replaced; no other
                return None
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        if not overwrite:
            raise ExportError(
                f"{output_dir} appeared while the export ran and is left as it is (pass "
                f"--overwrite to replace it)"
            )
        _check_replaceable(output_dir)
        aside = aside_path(output_dir, REPLACED_TAG)
        output_dir.rename(aside)
        try:
            work.rename(output_dir)
        except BaseException:
            aside.rename(output_dir)
            raise
    except OSError as e:
        raise ExportError(f"cannot move the artifact into {output_dir}: {e.strerror or e}") from e
    return aside


def _build(
    plan: ExportPlan,
    source: ResolvedSource,
    checkpoint: Checkpoint,
    work: Path,
    progress: Progress,
    trust_remote_code: bool,
    force_external_data: bool,
    plain_graphs: bool,
) -> Manifest:
    from tei_export.reference import load_module
    from tei_export.trace import trace

    vocab_size = int(str(checkpoint.config.get("vocab_size", 0))) or 1000
    tokenizer_files = checkpoint.tokenizer_files
    # Its own folder: over 2 GB the tracer writes one external file per weight beside it.
    raw = work / "trace" / "traced.onnx"
    raw.parent.mkdir()
    with progress.stage("load PyTorch model"):
        module = load_module(plan, source.path, trust_remote_code=trust_remote_code)
    with progress.stage("trace to ONNX"):
        trace(module, plan, raw, vocab_size)
        del module
    external_data = external.needs_external_data(raw, force=force_external_data)
    if external_data:
        progress.note("weights go to one external <graph>.data file per variant")
    fp32 = work / "model.fp32.onnx"
    plain_cpus = plan.card.fusion.plain_graph_cpus

    def plain_of(precision: Precision) -> bool:
        """Whether `precision` gets a plain graph: the card names a CPU class for it (or
        plain_graphs asks for one); never fp16, which is for GPUs (fused attention)."""
        if precision is Precision.FP16:
            return False
        return plain_graphs or bool(plain_cpus.for_precision(precision))

    # The plain fp32 graph is also the source of the plain int8 one.
    plain_wanted = any(plain_of(p) for p in plan.precisions)
    if plain_graphs and not plain_wanted:
        progress.warn("--plain-graphs does nothing here: plain graphs are fp32 and int8, and "
                      "neither is exported")  # fmt: skip
    with progress.stage(f"fuse ({plan.card.fusion.optimizer})"):
        fused_counts = fuse.fuse(plan, raw, fp32, external_data=external_data)
        built = [
            _Graph(
                precision=Precision.FP32, graph=GraphForm.FUSED, path=fp32, fused_ops=fused_counts
            )
        ]
        if plain_wanted:
            plain = work / "model.fp32.plain.onnx"
            external.save(onnx.load(str(raw)), plain, external=external_data)
            built.append(
                _Graph(
                    precision=Precision.FP32,
                    graph=GraphForm.PLAIN,
                    path=plain,
                    fused_ops=fuse.count_fused_ops(plain),
                )
            )
        shutil.rmtree(raw.parent)
    for wanted in plan.precisions:
        if wanted is Precision.FP32:
            continue
        for source_graph in [g for g in built if g.precision is Precision.FP32]:
            if source_graph.graph is GraphForm.PLAIN and not plain_of(wanted):
                continue
            path = source_graph.path.with_name(
                source_graph.path.name.replace("fp32", wanted.value)
            )
            label = f"{wanted.value} variant" + (
                f" ({source_graph.graph.value} graph)" if plain_wanted else ""
            )
            with progress.stage(label):
                if wanted is Precision.FP16:
                    precision.to_fp16(source_graph.path, path, external_data=external_data)
                else:
                    int8 = precision.to_int8(
                        plan, source.path / "tokenizer.json", source_graph.path, path,
                        vocab_size=vocab_size, external_data=external_data,
                    )  # fmt: skip
                    progress.note(
                        f"{path.name}: {int8.quantized} weight products "
                        "(MatMul, Attention) static int8, "
                        f"{len(int8.kept_fp32)} kept fp32 by measured sensitivity, "
                        f"{int8.widened} activation ranges widened for the stress texts, "
                        f"{int8.split_channels} outlier channels multiplied in fp32; "
                        f"calibration texts' min cosine against fp32 "
                        f"{int8.calibration_min_cosine:.4f}"
                    )
            built.append(
                _Graph(
                    precision=wanted,
                    graph=source_graph.graph,
                    path=path,
                    fused_ops=fuse.count_fused_ops(path),
                )
            )

    with progress.stage(f"validate {', '.join(g.name for g in built)} against PyTorch"):
        results = validate.validate(
            validate.ValidationRequest(
                plan=plan,
                checkpoint=str(source.path),
                vocab_size=vocab_size,
                trust_remote_code=trust_remote_code,
                variants=[
                    validate.VariantFile(name=g.name, precision=g.precision, path=str(g.path))
                    for g in built
                ],
            ),
            work,
        )
    by_name = {g.name: g for g in built}
    variants = []
    for result in results:
        graph = by_name[result.name]
        tolerance = plan.card.tolerance.for_precision(result.precision)
        if result.min_cosine < tolerance:
            raise ExportError(
                f"{result.name} variant is off: min cosine {result.min_cosine:.6f} "
                f"< {tolerance} against PyTorch (max abs err {result.max_abs_err:.3g})"
            )
        variants.append(
            Variant(
                name=result.name,
                file=graph.path.name,
                precision=result.precision,
                sha256=sha256_file(graph.path),
                external_data={
                    name: sha256_file(work / name) for name in external.data_files(graph.path)
                },
                fused_ops=graph.fused_ops,
                validation=Validation(
                    min_cosine=result.min_cosine,
                    max_abs_err=result.max_abs_err,
                    tolerance=tolerance,
                    shapes=result.shapes,
                ),
                graph=graph.graph,
                hosts=(
                    plain_cpus.for_precision(graph.precision)
                    if graph.graph is GraphForm.PLAIN
                    else []
                ),
            )
        )
    if Precision.FP32 not in plan.precisions:
        for graph in built:
            if graph.precision is Precision.FP32:
                for name in external.data_files(graph.path):
                    (work / name).unlink()
                graph.path.unlink()
        variants = [v for v in variants if v.precision is not Precision.FP32]

    for name in tokenizer_files:
        shutil.copyfile(source.path / name, work / name)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        source=Source(
            model_id=source.model_id, revision=source.revision, commit_sha=source.commit_sha,
            adapter=source.adapter,
        ),
        task=plan.task,
        architecture=checkpoint.architecture,
        model_type=checkpoint.model_type,
        card=plan.card.family,
        pooling=plan.pooling,
        normalize=plan.normalize,
        max_input_length=plan.max_input_length,
        hidden_size=plan.hidden_size,
        pooling_in_graph=plan.pooling_in_graph,
        io=IoNames(inputs=list(plan.inputs), outputs=list(plan.outputs)),
        labels=plan.labels,
        prompts=Prompts(
            prompts=checkpoint.prompts, default_prompt_name=checkpoint.default_prompt_name
        ),
        padding_side=plan.padding_side,
        truncation_side=plan.truncation_side,
        opset=plan.opset,
        toolchain=_toolchain(),
        tokenizer_files=list(tokenizer_files),
        tokenizer_sha256={name: sha256_file(work / name) for name in tokenizer_files},
        variants=variants,
        generative_rerank=plan.generative_rerank,
    )
    (work / MANIFEST_NAME).write_bytes(encode_manifest(manifest))
    return manifest
