"""Hub checkpoints published in their authors' remote-code layout, mapped onto transformers'
native classes so that they export without running any hub code.

nomic-embed-text-v1 / v1.5 ship model_type "nomic_bert" with GPT-2 style keys (n_embd, n_head,
...) and fused Wqkv weights; gte-*-en-v1.5 and gte-multilingual-* ship model_type "new" (code
in Alibaba-NLP/new-impl) with fused qkv_proj / up_gate_proj weights. Both have native classes
in transformers 5 (`nomic_bert`, `gte`). jinaai/jina-embeddings-v3 ships model_type
"xlm-roberta" with rotary positions (code in jinaai/xlm-roberta-flash-implementation), fused
Wqkv weights and five task LoRA adapters stored as weight parametrizations; its native class is
`jina_embeddings_v3`, and one adapter (or none) is merged into the weights (`merge_lora`).
`stage_native` writes a native copy of such a checkpoint
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
    adapters: bool = False
    """Its weights may carry task LoRA adapters (`lora_adaptations` in config.json)."""


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
    if config.get("moe_every_n_layers") or config.get("num_experts"):
        # nomic-embed-text-v2-moe: transformers' nomic_bert has no expert layers.
        raise ExportError(
            f"config.json ({layout} layout): mixture-of-experts layers (num_experts="
            f"{config.get('num_experts')}, moe_every_n_layers={config.get('moe_every_n_layers')})"
            f" have no counterpart in transformers' native nomic_bert class; "
            f"nomic-embed-text-v2-moe cannot be exported"
        )
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


_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)
"""The config keys every BERT-style published layout must have."""
# Config keys a BERT-style published layout shares with its native class, as they are.
_ENCODER_KEPT = (
    *_SIZES,
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "initializer_range",
)
_GTE_KEPT = (*_ENCODER_KEPT, "id2label", "label2id")


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
    for key in _SIZES:
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

_JINA_V3_KEPT = (*_ENCODER_KEPT, "bos_token_id", "eos_token_id")


def _jina_v3_config(config: dict[str, Any]) -> dict[str, Any]:
    layout = "jina-embeddings-v3"
    for key in _SIZES:
        _require(config, key, layout)
    _expect(config, "rotary_emb_interleaved", False, False, layout)
    native = {key: config[key] for key in _JINA_V3_KEPT if key in config}
    native["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": float(_require(config, "rotary_emb_base", layout)),
    }
    return native


_JINA_V3_RULES = (
    _rule("embeddings.word_embeddings.weight"),
    _rule("embeddings.token_type_embeddings.weight"),
    _rule("emb_ln.{p}", "embeddings.LayerNorm.{p}"),
    _rule(
        "encoder.layers.{i}.mixer.Wqkv.{p}",
        "layers.{i}.self_attn.q_proj.{p}",
        "layers.{i}.self_attn.k_proj.{p}",
        "layers.{i}.self_attn.v_proj.{p}",
    ),
    _rule("encoder.layers.{i}.mixer.out_proj.{p}", "layers.{i}.self_attn.o_proj.{p}"),
    _rule("encoder.layers.{i}.mlp.fc1.{p}", "layers.{i}.mlp.fc1.{p}"),
    _rule("encoder.layers.{i}.mlp.fc2.{p}", "layers.{i}.mlp.fc2.{p}"),
    # post-norm blocks, as the native class
    _rule("encoder.layers.{i}.norm1.{p}", "layers.{i}.post_attention_layernorm.{p}"),
    _rule("encoder.layers.{i}.norm2.{p}", "layers.{i}.post_mlp_layernorm.{p}"),
    _rule("pooler.dense.{p}"),
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
    "jina-embeddings-v3": HubLayout(
        name="jina-embeddings-v3",
        native_model_type="jina_embeddings_v3",
        architectures={
            "XLMRobertaModel": "JinaEmbeddingsV3Model",
            "XLMRobertaLoRA": "JinaEmbeddingsV3Model",
        },
        prefixes=("roberta.",),
        rules=_JINA_V3_RULES,
        config=_jina_v3_config,
        adapters=True,
    ),
}


def detect(config: dict[str, Any]) -> HubLayout | None:
    """The published layout of this config.json, or None when transformers reads it as is."""
    model_type = config.get("model_type")
    if model_type == "nomic_bert" and "n_embd" in config:
        return LAYOUTS["nomic_bert"]
    if model_type == "new":
        return LAYOUTS["new"]
    if model_type in ("xlm-roberta", "xlm_roberta") and (
        config.get("position_embedding_type") == "rotary"
    ):
        # Native XLM-RoBERTa has learned absolute positions: read as is, this would load.
        return LAYOUTS["jina-embeddings-v3"]
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
    layout: HubLayout, published: list[str], architecture: str, *, base_pooler: bool = False
) -> dict[str, list[str]]:
    """Published weight name -> its native name(s), for the weights the native model reads
    (`base_pooler`: the native base model has a pooler too). Raises on a weight that no rule
    maps."""
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
        if not head_model and stripped.startswith(_TOP_LEVEL):
            continue  # the base model has no classifier
        if not head_model and not base_pooler and stripped.startswith("pooler."):
            continue  # nor, mostly, a pooler
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
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({str(v) for v in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ExportError(
                f"{index}: not a readable weight index ({type(e).__name__}: {e})"
            ) from e
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ExportError(
            f"{path}: hub-layout checkpoints are mapped from model.safetensors, which this "
            f"folder does not have"
        )
    tensors: dict[str, Any] = {}
    for name in files:
        try:
            tensors.update(load_file(str(path / name)))
        except Exception as e:  # safetensors' errors share no base with OSError
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ExportError(f"{path / name}: cannot read the weights: {reason}") from e
    return tensors


def native_state_dict(
    layout: HubLayout, tensors: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    """The published tensors renamed (and fused ones split) into the native model's names;
    every native weight accounted for."""
    architecture = config["architectures"][0]
    expected = _expected_native_names(config)
    # A base model's pooler is never part of the graph (it exports the token states): a
    # checkpoint published without one keeps the native model's initial pooler.
    head_model = "For" in architecture
    unused = set() if head_model else {n for n in expected if n.startswith("pooler.")}
    mapping = native_weight_names(
        layout, sorted(tensors), architecture, base_pooler=bool(unused)
    )
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
    missing = sorted(expected - set(native) - unused)
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


_PARAMETRIZED = re.compile(
    r"(?P<module>.+)\.parametrizations\.weight\.(?P<part>original|0\.lora_A|0\.lora_B)"
)
_ST_CONFIG = "config_sentence_transformers.json"


@dataclass(frozen=True)
class Adapters:
    """Task LoRA adapters as jina-embeddings-v3's config.json declares them."""

    names: tuple[str, ...]
    rank: int
    alpha: float
    instructions: dict[str, str]
    """Each task's instruction, which its `encode(task=...)` puts before every text."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def read_adapters(config: dict[str, Any]) -> Adapters | None:
    names = config.get("lora_adaptations")
    if not names:
        return None
    layout = "jina-embeddings-v3"
    rank = int(_require(config, "lora_rank", layout))
    if rank <= 0:
        raise ExportError(f"config.json ({layout} layout): lora_rank={rank} must be positive")
    instructions = config.get("task_instructions") or {}
    return Adapters(
        names=tuple(str(n) for n in names),
        rank=rank,
        alpha=float(config.get("lora_alpha", 1)),
        instructions={str(k): str(v) for k, v in instructions.items()},
    )


def offered_adapters(path: Path) -> tuple[str, ...]:
    """The task adapters the checkpoint at `path` has (none when its layout has none)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return ()
    layout = detect(config)
    adapters = read_adapters(config) if layout is not None and layout.adapters else None
    return adapters.names if adapters is not None else ()


def choose_adapter(adapters: Adapters | None, wanted: str | None, path: Path) -> str | None:
    """`wanted` checked against the checkpoint's adapters (None: merge none)."""
    if wanted is None:
        return None
    if adapters is None:
        raise ExportError(f"--adapter {wanted}: {path} has no task LoRA adapters")
    if wanted not in adapters.names:
        raise ExportError(
            f"--adapter {wanted}: {path} has the adapters {', '.join(adapters.names)}"
        )
    return wanted


def merge_lora(
    tensors: dict[str, Any], adapters: Adapters | None, chosen: str | None
) -> dict[str, Any]:
    """Weights stored as parametrizations (`<module>.parametrizations.weight.original` with
    per-task `0.lora_A` / `0.lora_B` stacks) become plain `<module>.weight`: the original plus
    the chosen adapter's update scaled by alpha / rank, or the original alone. A Linear's
    update is B @ A (A: rank x in, B: out x rank); an Embedding's is A @ B (A: rows x rank,
    B: rank x width), as jina's LoRAParametrization lays them out."""
    import torch

    plain: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        found = _PARAMETRIZED.fullmatch(name)
        if found is None:
            plain[name] = tensor
        else:
            groups.setdefault(found["module"], {})[found["part"]] = tensor
    for module, parts in sorted(groups.items()):
        if "original" not in parts:
            raise ExportError(
                f"weight {module}.parametrizations.weight.0.lora_A has no "
                f"{module}.parametrizations.weight.original beside it"
            )
        weight = parts["original"]
        if chosen is not None:
            assert adapters is not None
            if "0.lora_A" not in parts or "0.lora_B" not in parts:
                raise ExportError(f"weight {module}: adapter {chosen!r} asked for, no lora_A/B")
            index = adapters.names.index(chosen)
            a, b = (parts[f"0.lora_{x}"] for x in "AB")
            if a.shape[0] != len(adapters.names) or b.shape[0] != len(adapters.names):
                raise ExportError(
                    f"weight {module}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do "
                    f"not hold {len(adapters.names)} adapters (lora_adaptations)"
                )
            a, b = a[index].to(torch.float32), b[index].to(torch.float32)
            update = a @ b if module.endswith("_embeddings") else b @ a
            if update.shape != weight.shape:
                raise ExportError(
                    f"weight {module}: the LoRA update {tuple(update.shape)} does not fit the "
                    f"weight {tuple(weight.shape)}"
                )
            # In float32 whatever the checkpoint's dtype: a bf16 sum would round the update away.
            weight = weight.to(torch.float32) + update * adapters.scaling
        plain[f"{module}.weight"] = weight
    return plain


def _adapter_prompts(staged: Path, source: Path, adapters: Adapters, chosen: str) -> None:
    """The chosen task's instruction becomes the default prompt, as `encode(task=...)` puts
    it before every text; the checkpoint's own prompts are kept."""
    instruction = adapters.instructions.get(chosen, "")
    if not instruction:
        return
    st_config: dict[str, Any] = {}
    if (source / _ST_CONFIG).is_file():
        st_config = json.loads((source / _ST_CONFIG).read_text(encoding="utf-8"))
    st_config["prompts"] = {**(st_config.get("prompts") or {}), chosen: instruction}
    st_config["default_prompt_name"] = chosen
    target = staged / _ST_CONFIG
    target.unlink(missing_ok=True)
    target.write_text(json.dumps(st_config, indent=2))


# Files a native copy must not link: rewritten, or code the native class replaces.
_REPLACED = re.compile(r"config\.json|.*\.(safetensors|bin|py)|model\.safetensors\.index\.json")


def stage_native(path: Path, parent: Path, *, adapter: str | None = None) -> Path | None:
    """A native copy of the checkpoint at `path` in a new folder under `parent` (the caller
    removes it), or None when the checkpoint is already in a layout transformers reads.
    `adapter` names the task LoRA adapter to merge (jina-embeddings-v3; None: none)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None  # read_checkpoint reports a missing or broken config.json
    if not isinstance(config, dict):
        return None  # and one that is not an object
    layout = detect(config)
    if layout is None:
        if adapter is not None:
            raise ExportError(f"--adapter {adapter}: {path} has no task LoRA adapters")
        return None
    from safetensors.torch import save_file

    adapters = read_adapters(config) if layout.adapters else None
    chosen = choose_adapter(adapters, adapter, path)
    native = native_config(layout, config)
    weights = native_state_dict(layout, merge_lora(_read_weights(path), adapters, chosen), native)
    staged = Path(tempfile.mkdtemp(dir=parent, prefix=".tei-export-native-"))
    try:
        (staged / "config.json").write_text(json.dumps(native, indent=2))
        save_file(weights, str(staged / "model.safetensors"), metadata={"format": "pt"})
        for entry in path.iterdir():
            if not _REPLACED.fullmatch(entry.name):
                (staged / entry.name).symlink_to(entry.resolve())
        if adapters is not None and chosen is not None:
            _adapter_prompts(staged, path, adapters, chosen)
    except OSError as e:
        import shutil

        shutil.rmtree(staged, ignore_errors=True)
        raise ExportError(f"cannot write the native copy of {path}: {e}") from e
    return staged
