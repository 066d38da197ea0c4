"""Hub checkpoints published in their authors' remote-code layout, mapped onto transformers'
native classes so that they export without running any hub code.

nomic-embed-text-v1 / v1.5 ship model_type "nomic_bert" with GPT-2 style keys (n_embd, n_head,
...) and fused Wqkv weights; gte-*-en-v1.5 and gte-multilingual-* ship model_type "new" (code
in Alibaba-NLP/new-impl) with fused qkv_proj / up_gate_proj weights. Both have native classes
in transformers 5 (`nomic_bert`, `gte`). `stage_native` writes a native copy of such a checkpoint
(config.json and model.safetensors rewritten, every other file linked) that the rest of the
export reads like any other folder. A config setting or weight that has no native counterpart
is an error naming it, never a silently different model.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tei_export.errors import ExportError

_SLOT = re.compile(r"\{(i|p)\}")
_SLOT_PATTERNS = {"i": r"(?P<i>\d+)", "p": r"(?P<p>weight|bias)"}


@dataclass(frozen=True)
class WeightRule:
    """One published weight name -> the native weight(s) it becomes. Several targets: the
    published tensor is the targets concatenated along dim 0 (fused projections), in order."""

    published: str
    native: tuple[str, ...]

    def match(self, name: str) -> dict[str, str] | None:
        found = _template_regex(self.published).fullmatch(name)
        return found.groupdict() if found else None


def _template_regex(template: str) -> re.Pattern[str]:
    """ "encoder.layer.{i}.attn_ln.{p}" -> a regex capturing the layer index and weight|bias."""
    parts = _SLOT.split(template)
    return re.compile(
        "".join(_SLOT_PATTERNS[part] if i % 2 else re.escape(part) for i, part in enumerate(parts))
    )


@dataclass(frozen=True)
class HubLayout:
    name: str
    """What the published layout is called in messages."""
    native_model_type: str
    architectures: dict[str, str]
    """Published architecture -> native class."""
    prefixes: tuple[str, ...]
    """Base-model prefixes published checkpoints may carry (stripped before mapping)."""
    rules: tuple[WeightRule, ...]
    config: Callable[[dict[str, Any]], dict[str, Any]]
    """Published config.json -> the native config's keys (model_type and architectures aside)."""


# Buffers some checkpoints saved with their weights: recomputed by the native classes.
_BUFFERS = re.compile(r"(^|.*\.)(position_ids|inv_freq|cos_cached|sin_cached)$")
# Weights that belong to heads the base model does not have (MLM pretraining heads).
_PRETRAINING_HEADS = ("cls.", "lm_head.")
# Native weights that sit outside the base-model prefix in a *ForSequenceClassification.
_TOP_LEVEL = ("classifier.",)


def _rule(published: str, *native: str) -> WeightRule:
    return WeightRule(published, native or (published,))


def _require(config: dict[str, Any], key: str, layout: str) -> Any:
    if config.get(key) is None:
        raise ExportError(f"config.json ({layout} layout) has no {key!r}")
    return config[key]


def _expect(config: dict[str, Any], key: str, wanted: object, default: object, layout: str) -> None:
    value = config.get(key, default)
    if value != wanted:
        raise ExportError(
            f"config.json ({layout} layout): {key}={value!r} has no counterpart in "
            f"transformers' native class (it needs {wanted!r}); this checkpoint cannot be mapped"
        )


_NOMIC_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu"}


def _nomic_config(config: dict[str, Any]) -> dict[str, Any]:
    layout = "nomic_bert"
    # The defaults are those of nomic's own config class, for keys a config.json may omit.
    _expect(config, "rotary_emb_fraction", 1.0, 0.0, layout)
    _expect(config, "rotary_emb_interleaved", False, False, layout)
    _expect(config, "rotary_scaling_factor", None, None, layout)
    _expect(config, "prenorm", False, False, layout)
    _expect(config, "parallel_block", False, False, layout)
    _expect(config, "use_rms_norm", False, False, layout)
    _expect(config, "causal", False, False, layout)
    for bias in ("qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias"):
        _expect(config, bias, False, True, layout)
    activation = config.get("activation_function", "gelu")
    if activation not in _NOMIC_ACTIVATIONS:
        raise ExportError(
            f"config.json ({layout} layout): activation_function={activation!r} has no "
            f"counterpart in transformers' native class (it has {sorted(_NOMIC_ACTIVATIONS)})"
        )
    return {
        "vocab_size": _require(config, "vocab_size", layout),
        "hidden_size": _require(config, "n_embd", layout),
        "num_attention_heads": _require(config, "n_head", layout),
        "num_hidden_layers": _require(config, "n_layer", layout),
        "intermediate_size": _require(config, "n_inner", layout),
        "max_position_embeddings": _require(config, "n_positions", layout),
        "type_vocab_size": config.get("type_vocab_size", 2),
        "layer_norm_eps": config.get("layer_norm_epsilon", 1e-12),
        "hidden_act": _NOMIC_ACTIVATIONS[activation],
        "pad_token_id": config.get("pad_token_id") or 0,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": float(_require(config, "rotary_emb_base", layout)),
        },
    }


_GTE_KEPT = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "initializer_range",
    "id2label",
    "label2id",
)


def _gte_rope(config: dict[str, Any]) -> dict[str, Any]:
    theta = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    kind, factor = scaling.get("type"), scaling.get("factor")
    if kind != "ntk" or not isinstance(factor, int | float) or scaling.get("mixed_b") is not None:
        raise ExportError(
            f"config.json (new layout): rope_scaling={scaling!r} has no counterpart in "
            f"transformers' native class (only fixed NTK scaling, type 'ntk', maps)"
        )
    # new-impl's fixed NTK rotary (used by gte-*-en-v1.5) builds its table at construction
    # for factor x the trained length, which takes its scaled branch: base x factor, then
    # every inverse frequency divided by factor^(2 / head_dim). That is linear scaling of the
    # frequencies of base x factor, which the native class has.
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    return {
        "rope_type": "linear",
        "rope_theta": theta * float(factor),
        "factor": float(factor) ** (2 / head_dim),
    }


def _gte_config(config: dict[str, Any]) -> dict[str, Any]:
    layout = "new"
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
    ):
        _require(config, key, layout)
    _expect(config, "position_embedding_type", "rope", "rope", layout)
    _expect(config, "layer_norm_type", "layer_norm", "layer_norm", layout)
    _expect(config, "pack_qkv", True, True, layout)
    _expect(config, "logn_attention_scale", False, False, layout)
    _expect(config, "logn_attention_clip1", False, False, layout)
    native = {key: config[key] for key in _GTE_KEPT if key in config}
    native["rope_parameters"] = _gte_rope(config)
    return native


_NOMIC_RULES = (
    _rule("embeddings.word_embeddings.weight"),
    _rule("embeddings.token_type_embeddings.weight"),
    _rule("emb_ln.{p}", "embeddings.LayerNorm.{p}"),
    _rule(
        "encoder.layers.{i}.attn.Wqkv.{p}",
        "layers.{i}.self_attn.q_proj.{p}",
        "layers.{i}.self_attn.k_proj.{p}",
        "layers.{i}.self_attn.v_proj.{p}",
    ),
    _rule("encoder.layers.{i}.attn.out_proj.{p}", "layers.{i}.self_attn.o_proj.{p}"),
    # nomic's gated MLP: fc2(fc11(x) * act(fc12(x))).
    _rule("encoder.layers.{i}.mlp.fc11.{p}", "layers.{i}.mlp.up_proj.{p}"),
    _rule("encoder.layers.{i}.mlp.fc12.{p}", "layers.{i}.mlp.gate_proj.{p}"),
    _rule("encoder.layers.{i}.mlp.fc2.{p}", "layers.{i}.mlp.down_proj.{p}"),
    _rule("encoder.layers.{i}.norm1.{p}", "layers.{i}.post_attention_layernorm.{p}"),
    _rule("encoder.layers.{i}.norm2.{p}", "layers.{i}.post_mlp_layernorm.{p}"),
    _rule("pooler.dense.{p}"),
    _rule("classifier.{p}"),
)

_GTE_RULES = (
    _rule("embeddings.word_embeddings.weight"),
    _rule("embeddings.token_type_embeddings.weight"),
    _rule("embeddings.LayerNorm.{p}"),
    _rule(
        "encoder.layer.{i}.attention.qkv_proj.{p}",
        "layers.{i}.self_attn.q_proj.{p}",
        "layers.{i}.self_attn.k_proj.{p}",
        "layers.{i}.self_attn.v_proj.{p}",
    ),
    _rule("encoder.layer.{i}.attention.o_proj.{p}", "layers.{i}.self_attn.o_proj.{p}"),
    # new-impl splits up_gate_proj's output into (up, gate) and computes down(up * act(gate)).
    _rule(
        "encoder.layer.{i}.mlp.up_gate_proj.{p}",
        "layers.{i}.mlp.up_proj.{p}",
        "layers.{i}.mlp.gate_proj.{p}",
    ),
    _rule("encoder.layer.{i}.mlp.down_proj.{p}", "layers.{i}.mlp.down_proj.{p}"),
    _rule("encoder.layer.{i}.attn_ln.{p}", "layers.{i}.post_attention_layernorm.{p}"),
    _rule("encoder.layer.{i}.mlp_ln.{p}", "layers.{i}.post_mlp_layernorm.{p}"),
    _rule("pooler.dense.{p}"),
    _rule("classifier.{p}"),
)

LAYOUTS = {
    "nomic_bert": HubLayout(
        name="nomic_bert",
        native_model_type="nomic_bert",
        architectures={
            "NomicBertModel": "NomicBertModel",
            "NomicBertForPreTraining": "NomicBertModel",
            "NomicBertForSequenceClassification": "NomicBertForSequenceClassification",
        },
        prefixes=("bert.",),
        rules=_NOMIC_RULES,
        config=_nomic_config,
    ),
    "new": HubLayout(
        name="new",
        native_model_type="gte",
        architectures={
            "NewModel": "GteModel",
            "NewForSequenceClassification": "GteForSequenceClassification",
        },
        prefixes=("new.",),
        rules=_GTE_RULES,
        config=_gte_config,
    ),
}


def detect(config: dict[str, Any]) -> HubLayout | None:
    """The published layout of this config.json, or None when transformers reads it as is."""
    model_type = config.get("model_type")
    if model_type == "nomic_bert" and "n_embd" in config:
        return LAYOUTS["nomic_bert"]
    if model_type == "new":
        return LAYOUTS["new"]
    return None


def native_config(layout: HubLayout, config: dict[str, Any]) -> dict[str, Any]:
    architectures = config.get("architectures") or []
    published = str(architectures[0]) if architectures else "unknown"
    if published not in layout.architectures:
        raise ExportError(
            f"config.json ({layout.name} layout): architecture {published} has no native "
            f"mapping (mapped: {', '.join(sorted(layout.architectures))})"
        )
    return {
        "model_type": layout.native_model_type,
        "architectures": [layout.architectures[published]],
        **layout.config(config),
    }


def _base_prefix(layout: HubLayout, architecture: str) -> str:
    """Native weights of a head model sit under the base model's attribute (gte., ...)."""
    return f"{layout.native_model_type}." if "For" in architecture else ""


def native_weight_names(
    layout: HubLayout, published: list[str], architecture: str
) -> dict[str, list[str]]:
    """Published weight name -> its native name(s), for the weights the native model reads.
    Raises on a weight that no rule maps."""
    prefix = _base_prefix(layout, architecture)
    head_model = bool(prefix)
    mapping: dict[str, list[str]] = {}
    for name in published:
        stripped = name
        for strip in layout.prefixes:
            if stripped.startswith(strip):
                stripped = stripped[len(strip) :]
        if _BUFFERS.fullmatch(stripped) or stripped.startswith(_PRETRAINING_HEADS):
            continue
        if not head_model and stripped.startswith(("pooler.", *_TOP_LEVEL)):
            continue  # the base model has no pooler or classifier
        for rule in layout.rules:
            slots = rule.match(stripped)
            if slots is None:
                continue
            targets = [target.format(**slots) for target in rule.native]
            mapping[name] = [t if t.startswith(_TOP_LEVEL) else prefix + t for t in targets]
            break
        else:
            raise ExportError(
                f"weight {name!r} ({layout.name} layout) has no counterpart in transformers' "
                f"native {layout.native_model_type} class; this checkpoint cannot be mapped"
            )
    return mapping


def _published_for(layout: HubLayout, native: str) -> str:
    """The published name a native weight is made from, for error messages."""
    bare = native.split(".", 1)[1] if native.startswith(f"{layout.native_model_type}.") else native
    for rule in layout.rules:
        for target in rule.native:
            found = _template_regex(target).fullmatch(bare)
            if found:
                return rule.published.format(**found.groupdict())
    return "?"


def _expected_native_names(config: dict[str, Any]) -> set[str]:
    """The weights the native model has, from a model built on the meta device (no memory)."""
    import torch
    import transformers

    native_config = transformers.AutoConfig.for_model(**config)
    model_class = getattr(transformers, config["architectures"][0])
    with torch.device("meta"):
        model = model_class(native_config)
    return set(model.state_dict())


def _read_weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ExportError(
            f"{path}: hub-layout checkpoints are mapped from model.safetensors, which this "
            f"folder does not have"
        )
    tensors: dict[str, Any] = {}
    for name in files:
        tensors.update(load_file(str(path / name)))
    return tensors


def native_state_dict(
    layout: HubLayout, tensors: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    """The published tensors renamed (and fused ones split) into the native model's names;
    every native weight accounted for."""
    architecture = config["architectures"][0]
    mapping = native_weight_names(layout, sorted(tensors), architecture)
    native: dict[str, Any] = {}
    for published, targets in mapping.items():
        tensor = tensors[published]
        if tensor.shape[0] % len(targets):
            raise ExportError(
                f"weight {published!r} ({layout.name} layout): dim 0 of {tuple(tensor.shape)} "
                f"does not split into {len(targets)} projections"
            )
        for target, part in zip(targets, tensor.chunk(len(targets), dim=0), strict=True):
            native[target] = part.contiguous().clone()
    expected = _expected_native_names(config)
    missing = sorted(expected - set(native))
    if missing:
        raise ExportError(
            f"the {layout.name} checkpoint lacks weight {_published_for(layout, missing[0])!r} "
            f"(native {missing[0]!r})"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    extra = sorted(set(native) - expected)
    if extra:
        raise ExportError(
            f"weight for {extra[0]!r} ({layout.name} layout) has no place in the native "
            f"{config['architectures'][0]} built from this config.json"
        )
    return native


# Files a native copy must not link: rewritten, or code the native class replaces.
_REPLACED = re.compile(r"config\.json|.*\.(safetensors|bin|py)|model\.safetensors\.index\.json")


def stage_native(path: Path, parent: Path) -> Path | None:
    """A native copy of the checkpoint at `path` in a new folder under `parent` (the caller
    removes it), or None when the checkpoint is already in a layout transformers reads."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None  # read_checkpoint reports a missing or broken config.json
    layout = detect(config)
    if layout is None:
        return None
    from safetensors.torch import save_file

    native = native_config(layout, config)
    weights = native_state_dict(layout, _read_weights(path), native)
    staged = Path(tempfile.mkdtemp(dir=parent, prefix=".tei-export-native-"))
    try:
        (staged / "config.json").write_text(json.dumps(native, indent=2))
        save_file(weights, str(staged / "model.safetensors"), metadata={"format": "pt"})
        for entry in path.iterdir():
            if not _REPLACED.fullmatch(entry.name):
                (staged / entry.name).symlink_to(entry.resolve())
    except OSError as e:
        import shutil

        shutil.rmtree(staged, ignore_errors=True)
        raise ExportError(f"cannot write the native copy of {path}: {e}") from e
    return staged
