"""Read what sentence-transformers and TEI read from a checkpoint folder, nothing more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from tei_export.errors import ExportError
from tei_runtime.manifest import Pooling

# Tokenizer files copied into the artifact when present; tokenizer.json is required.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

# sentence-transformers 1_Pooling/config.json keys -> our pooling modes.
_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": Pooling.CLS,
    "pooling_mode_mean_tokens": Pooling.MEAN,
    "pooling_mode_lasttoken": Pooling.LAST_TOKEN,
}
_ST_UNSUPPORTED_POOLING = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    config: dict[str, Any]
    """config.json as transformers writes it (kept raw: its keys differ per family)."""
    model_type: str
    architecture: str
    st_pooling: Pooling | None
    """From 1_Pooling/config.json, when the checkpoint is a sentence-transformers model."""
    normalize: bool
    """modules.json lists a Normalize module."""
    dense_dirs: list[Path]
    """Dense module folders (2_Dense, ...) in modules.json order."""
    max_seq_length: int | None
    prompts: dict[str, str]
    default_prompt_name: str | None
    tokenizer_files: list[str]
    padding_side: str | None
    truncation_side: str | None
    labels: dict[int, str]
    trust_remote_code_needed: bool


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from e


def _optional_json(path: Path) -> Any:
    return _read_json(path) if path.is_file() else None


def _pooling(folder: Path) -> Pooling | None:
    cfg = _optional_json(folder / "config.json")
    if cfg is None:
        return None
    chosen = [mode for key, mode in _ST_POOLING_KEYS.items() if cfg.get(key)]
    unsupported = [key for key in _ST_UNSUPPORTED_POOLING if cfg.get(key)]
    if unsupported or len(chosen) != 1:
        raise ExportError(
            f"{folder / 'config.json'}: pooling {unsupported or chosen or 'none'} is not "
            f"supported; use one of cls, mean, last-token (or pass --pooling)"
        )
    return chosen[0]


def read_checkpoint(path: Path) -> Checkpoint:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{path}: no config.json; is this a Hugging Face model folder?")
    if not (path / "tokenizer.json").is_file():
        raise ExportError(
            f"{path}: no tokenizer.json; tei-onnx needs a fast tokenizer (save one with "
            f"AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(...))"
        )
    config = _read_json(config_path)
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures") or []
    architecture = str(architectures[0]) if architectures else "unknown"

    st_pooling: Pooling | None = None
    normalize = False
    dense_dirs: list[Path] = []
    modules = _optional_json(path / "modules.json") or []
    for module in modules:
        kind = str(module.get("type", ""))
        folder = path / str(module.get("path", ""))
        if kind.endswith("models.Pooling"):
            st_pooling = _pooling(folder)
        elif kind.endswith("models.Normalize"):
            normalize = True
        elif kind.endswith("models.Dense"):
            dense_dirs.append(folder)
    if not modules and (path / "1_Pooling").is_dir():
        st_pooling = _pooling(path / "1_Pooling")

    sbert = _optional_json(path / "sentence_bert_config.json") or {}
    st_config = _optional_json(path / "config_sentence_transformers.json") or {}
    tok_config = _optional_json(path / "tokenizer_config.json") or {}
    id2label = config.get("id2label") or {}
    if not id2label and isinstance(config.get("num_labels"), int):
        # transformers' default names for a config that gives only a count.
        id2label = {i: f"LABEL_{i}" for i in range(config["num_labels"])}
    return Checkpoint(
        path=path,
        config=config,
        model_type=model_type,
        architecture=architecture,
        st_pooling=st_pooling,
        normalize=normalize,
        dense_dirs=dense_dirs,
        max_seq_length=sbert.get("max_seq_length"),
        prompts={str(k): str(v) for k, v in (st_config.get("prompts") or {}).items()},
        default_prompt_name=st_config.get("default_prompt_name"),
        tokenizer_files=[name for name in TOKENIZER_FILES if (path / name).is_file()],
        padding_side=tok_config.get("padding_side"),
        truncation_side=tok_config.get("truncation_side"),
        labels={int(k): str(v) for k, v in id2label.items()},
        trust_remote_code_needed="auto_map" in config,
    )
