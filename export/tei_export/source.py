"""Resolve MODEL (a local folder or a hub id) to a local checkpoint folder."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from tei_export.errors import ExportError

# What sentence-transformers and TEI read. Weights: safetensors wherever they are (the model's,
# a Dense module's); PyTorch's pickles only where a repository has no safetensors weights, as
# TEI does: a broad "*.bin" would also fetch a second copy of the weights that many repositories
# carry beside their safetensors, and their OpenVINO exports.
# Dense folders whole, named either way (`2_Dense`, stella's `2_Dense_256` that --dense-path
# picks), pickles included: a module folder holds one copy of its weights.
_METADATA_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "1_Pooling/*", "*_Dense/*",
                      "*_Dense_*/*"]
_SAFETENSORS_PATTERNS = ["*.safetensors"]
_PICKLE_PATTERNS = ["pytorch_model*.bin"]


def _has_safetensors_weights(folder: Path) -> bool:
    return any(folder.glob("model*.safetensors")) or (
        folder / "model.safetensors.index.json").is_file()  # fmt: skip


class ResolvedSource(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    model_id: str
    revision: str | None
    commit_sha: str | None
    adapter: str | None = None
    """The task LoRA adapter merged into a staged native copy (hub_layouts), if any."""


def resolve(
    model: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: Path | None = None,
    trust_remote_code: bool = False,
) -> ResolvedSource:
    """A folder that exists is used as is; anything else is a hub id fetched through
    huggingface_hub, which honours HF_TOKEN, HF_HUB_CACHE and HF_HUB_OFFLINE. The model's own
    Python files are fetched only with `trust_remote_code`."""
    local = Path(model).expanduser()
    if local.is_dir():
        # A folder is what it holds: a revision names nothing there (export API notes it).
        return ResolvedSource(
            path=local.resolve(), model_id=str(local.resolve()), revision=None, commit_sha=None
        )
    if local.exists():
        raise ExportError(f"{model}: a file, not a model folder (give the folder holding it)")
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ExportError(f"{model}: no such folder")

    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    # A pinned commit skips huggingface_hub's fast first request, and its file listing
    # retries an unreachable hub five times (~25 s of "Retrying" lines) before the cache is
    # looked at: an air-gapped site pinning its revisions would wait and read that noise.
    local_only = _is_commit(revision) and not _hub_answers(model, revision, token)

    def download(patterns: list[str]) -> Path:
        code = ["*.py"] if trust_remote_code else []
        return Path(snapshot_download(
            model, revision=revision, token=token, cache_dir=cache_dir,
            allow_patterns=[*patterns, *code], local_files_only=local_only,
        ))  # fmt: skip

    try:
        path = download([*_METADATA_PATTERNS, *_SAFETENSORS_PATTERNS])
        if not _has_safetensors_weights(path):
            path = download([*_METADATA_PATTERNS, *_PICKLE_PATTERNS])
    except LocalEntryNotFoundError as e:
        from huggingface_hub import constants

        where = cache_dir or constants.HF_HUB_CACHE  # the folder huggingface_hub looked in
        what = f"{model} at revision {revision}" if revision else model
        raise ExportError(
            f"{model}: no such local folder, and as a hub id {what} is not in the hub cache "
            f"({where}) and the hub cannot be reached (offline or no network); pass a local "
            f"folder or populate the cache"
        ) from e
    except HFValidationError as e:
        raise ExportError(f"{model}: neither a folder nor a valid hub id ({e})") from e
    except OSError as e:
        raise ExportError(f"{model}: no such local folder, and as a hub id: {e}") from e
    return ResolvedSource(path=path, model_id=model, revision=revision, commit_sha=path.name)


def _is_commit(revision: str | None) -> bool:
    return revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def _hub_answers(model: str, revision: str | None, token: str | None) -> bool:
    """Whether the hub can be reached: one request, no retries. An HTTP error (401, 404) is
    an answer, left to snapshot_download to report; offline mode is not."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        HfApi(token=token).repo_info(model, revision=revision)
    except HfHubHTTPError:
        return True
    except Exception:  # the transport's own error classes (httpx, httpx2) differ by version
        return False
    return True


def hub_commit(
    model: str, *, revision: str | None, token: str | None, cache_dir: Path | None
) -> str | None:
    """The commit a hub id at REVISION resolves to now: asked of the hub when it can be
    reached, else read from the hub cache; None when neither knows. Fetches config.json only."""
    if _is_commit(revision):
        return revision
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = snapshot_download(
            model, revision=revision, token=token, cache_dir=cache_dir,
            allow_patterns=["config.json"],
        )  # fmt: skip
    except (HFValidationError, OSError):  # LocalEntryNotFoundError is an OSError
        return None
    return Path(folder).name
