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

# sentence-transformers 1_Pooling/config.json: before 6.x one boolean key per mode, from 6.x
# one `pooling_mode` key naming the mode (or a list of them, concatenated).
_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_ST_POOLING_MODES = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "lasttoken": Pooling.LAST_TOKEN}
# modules.json types are named by class: `sentence_transformers.models.Pooling` before 6.x,
# `sentence_transformers.sentence_transformer.modules.pooling.Pooling` from it.
_UNDERSTOOD_MODULES = {"Transformer", "MLMTransformer", "Pooling", "Dense", "Normalize",
                       "SpladePooling"}  # fmt: skip
# A tokenizer with no length of its own says so with a huge model_max_length (1e30).
_NO_TOKENIZER_LIMIT = 1_000_000


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    config: dict[str, Any]
    """config.json as transformers writes it (kept raw: its keys differ per family)."""
    model_type: str
    architecture: str
    st_pooling: Pooling | None
    """From 1_Pooling/config.json, when the checkpoint is a sentence-transformers model."""
    st_pooling_unsupported: str | None = None
    """1_Pooling/config.json's mode when tei-onnx has no such pooling (--pooling overrides)."""
    st_pooling_file: Path | None = None
    """The Pooling module's config.json (its folder is whatever modules.json says)."""
    pools_prompt: bool = True
    """1_Pooling/config.json's include_prompt: false leaves the prompt's tokens out of the
    pooling in sentence-transformers (TEI, and so tei-onnx, pool them)."""
    ignored_modules: list[str] = []
    """modules.json types tei-onnx does not know, so leaves out of the graph."""
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
    st_lowercases: bool = False
    """sentence_bert_config.json's do_lower_case: sentence-transformers lowercases each text
    before its tokenizer sees it."""
    labels: dict[int, str]
    trust_remote_code_needed: bool
    """config.json has an auto_map and its architecture is no class of transformers."""
    own_code_skipped: bool = False
    """config.json has an auto_map, but its architecture is transformers' own class: that
    class is traced (as TEI runs its own implementation), the model's code only with
    --trust-remote-code."""


def is_native_class(architecture: str) -> bool:
    """Whether transformers itself has the class config.json's `architectures` names."""
    import transformers

    return architecture.isidentifier() and hasattr(transformers, architecture)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from e


def _optional_json(path: Path) -> Any:
    return _read_json(path) if path.is_file() else None


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    return "a string" if isinstance(value, str) else "a value"


def _read_object(path: Path) -> dict[str, Any]:
    value = _read_json(path)
    if not isinstance(value, dict):
        raise ExportError(f"{path}: expected a JSON object, found {_json_kind(value)}")
    return value


def _optional_object(path: Path) -> dict[str, Any]:
    return _read_object(path) if path.is_file() else {}


def _modules(path: Path) -> list[dict[str, Any]]:
    """modules.json: sentence-transformers' list of modules, each an object."""
    file = path / "modules.json"
    modules = _optional_json(file)
    if modules is None:
        return []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ExportError(f"{file}: expected a list of modules (JSON objects)")
    return modules


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ExportError(f"{where}: expected an object of names to strings")
    return {str(k): v for k, v in value.items()}


class _PoolingConfig(msgspec.Struct, frozen=True):
    mode: Pooling | None
    unsupported: str | None
    include_prompt: bool


def _pooling(folder: Path) -> _PoolingConfig | None:
    cfg = _optional_json(folder / "config.json")
    if not isinstance(cfg, dict):
        return None
    named = cfg.get("pooling_mode")
    if named is None:
        modes = [mode for key, mode in _ST_POOLING_KEYS.items() if cfg.get(key)]
    else:
        modes = [str(m) for m in named] if isinstance(named, list) else [str(named)]
    include_prompt = cfg.get("include_prompt") is not False
    if len(modes) == 1 and modes[0] in _ST_POOLING_MODES:
        return _PoolingConfig(_ST_POOLING_MODES[modes[0]], None, include_prompt)
    return _PoolingConfig(None, " + ".join(modes) or "none", include_prompt)


def _splade_pooling(folder: Path) -> _PoolingConfig:
    """A SpladePooling module: max over the tokens of log(1 + relu(logits)) is TEI's SPLADE
    (and the module's defaults when it saved no config); another strategy or activation is
    a pooling tei-onnx does not have."""
    cfg = _optional_json(folder / "config.json")
    cfg = cfg if isinstance(cfg, dict) else {}
    strategy = str(cfg.get("pooling_strategy", "max"))
    activation = str(cfg.get("activation_function", "relu"))
    if (strategy, activation) == ("max", "relu"):
        return _PoolingConfig(Pooling.SPLADE, None, True)
    return _PoolingConfig(None, f"SpladePooling {strategy}/{activation}", True)


def _tokenizer_json_sides(path: Path) -> tuple[str | None, str | None]:
    """(padding side, truncation side) tokenizer.json itself sets: transformers takes them
    where tokenizer_config.json names none (so sentence-transformers pads and cuts so)."""
    data = _optional_json(path / "tokenizer.json")
    sides: list[str | None] = []
    for key in ("padding", "truncation"):
        part = data.get(key) if isinstance(data, dict) else None
        direction = part.get("direction") if isinstance(part, dict) else None
        sides.append(direction.lower() if isinstance(direction, str) else None)
    return sides[0], sides[1]


def _max_seq_length(sbert: dict[str, Any], tok_config: dict[str, Any]) -> int | None:
    """sentence-transformers' limit: sentence_bert_config.json's, else (as 6.x saves it) the
    tokenizer's model_max_length, which transformers truncates at too."""
    for value in (sbert.get("max_seq_length"), tok_config.get("model_max_length")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value if value < _NO_TOKENIZER_LIMIT else None
    return None


def read_checkpoint(path: Path) -> Checkpoint:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{path}: no config.json; is this a Hugging Face model folder?")
    if not (path / "tokenizer.json").is_file():
        raise ExportError(
            f"{path}: no tokenizer.json; tei-onnx needs a fast tokenizer (save one with "
            f"AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(...))"
        )
    config = _read_object(config_path)
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures") or []
    architecture = str(architectures[0]) if architectures else "unknown"

    pooling: _PoolingConfig | None = None
    pooling_folder: Path | None = None
    normalize = False
    dense_dirs: list[Path] = []
    ignored: list[str] = []
    modules = _modules(path)
    for module in modules:
        kind = str(module.get("type", ""))
        folder = path / str(module.get("path", ""))
        match kind.rsplit(".", 1)[-1]:
            case "Pooling":
                pooling, pooling_folder = _pooling(folder), folder
                if pooling is None:  # sentence-transformers itself refuses such a folder
                    raise ExportError(
                        f"{folder / 'config.json'}: modules.json lists a Pooling module there, "
                        f"but it has no config.json"
                    )
            case "SpladePooling":  # a SparseEncoder's: the SPLADE TEI serves, or another
                pooling, pooling_folder = _splade_pooling(folder), folder
            case "Normalize":
                normalize = True
            case "Dense":
                dense_dirs.append(folder)
            case name if name not in _UNDERSTOOD_MODULES:
                ignored.append(kind)
    if not modules and (path / "1_Pooling").is_dir():
        pooling, pooling_folder = _pooling(path / "1_Pooling"), path / "1_Pooling"

    sbert = _optional_object(path / "sentence_bert_config.json")
    st_path = path / "config_sentence_transformers.json"
    st_config = _optional_object(st_path)
    prompts = _string_map(st_config.get("prompts") or {}, f"{st_path}: `prompts`")
    default_prompt_name = st_config.get("default_prompt_name")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        # sentence-transformers refuses this checkpoint as it loads; served, every request
        # would fail on a prompt that is not there.
        known = ", ".join(prompts) or "none"
        raise ExportError(
            f"{st_path}: default_prompt_name {default_prompt_name!r} is not one of its prompts "
            f"({known})"
        )
    tok_config = _optional_object(path / "tokenizer_config.json")
    own_padding, own_truncation = _tokenizer_json_sides(path)
    id2label = _string_map(config.get("id2label") or {}, f"{config_path}: `id2label`")
    native = "auto_map" in config and is_native_class(architecture)
    if not id2label and isinstance(config.get("num_labels"), int):
        # transformers' default names for a config that gives only a count.
        id2label = {str(i): f"LABEL_{i}" for i in range(config["num_labels"])}
    elif not id2label and architecture.endswith("ForSequenceClassification"):
        # transformers 5 leaves its default, two labels, out of the config it saves.
        id2label = {"0": "LABEL_0", "1": "LABEL_1"}
    if not all(k.lstrip("-").isdigit() for k in id2label):
        raise ExportError(f"{config_path}: `id2label` keys must be class numbers")
    return Checkpoint(
        path=path,
        config=config,
        model_type=model_type,
        architecture=architecture,
        st_pooling=pooling.mode if pooling else None,
        st_pooling_unsupported=pooling.unsupported if pooling else None,
        st_pooling_file=pooling_folder / "config.json" if pooling and pooling_folder else None,
        pools_prompt=pooling.include_prompt if pooling else True,
        ignored_modules=ignored,
        normalize=normalize,
        dense_dirs=dense_dirs,
        max_seq_length=_max_seq_length(sbert, tok_config),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        tokenizer_files=[name for name in TOKENIZER_FILES if (path / name).is_file()],
        padding_side=tok_config.get("padding_side") or own_padding,
        truncation_side=tok_config.get("truncation_side") or own_truncation,
        st_lowercases=sbert.get("do_lower_case") is True,
        labels={int(k): str(v) for k, v in id2label.items()},
        trust_remote_code_needed="auto_map" in config and not native,
        own_code_skipped="auto_map" in config and native,
    )
