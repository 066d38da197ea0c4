"""Model cards: one TOML per model family, the data the exporter needs about that family."""

from __future__ import annotations

import enum
import tomllib
from functools import cache
from pathlib import Path

import msgspec

from tei_runtime.host import CpuClass
from tei_runtime.manifest import Pooling, Precision


class Head(enum.StrEnum):
    BASE = "base"
    SEQUENCE_CLASSIFICATION = "sequence-classification"
    MASKED_LM = "masked-lm"
    CAUSAL_LM = "causal-lm"
    """A generative reranker: the LM head's "yes" and "no" rows at the last position."""


class PlainGraphCpus(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per precision, the CPU classes on which the plain traced graph (onnxruntime fusing it
    at load) was measured faster than the offline-fused one. Unlisted classes keep the fused
    graph; fp16 is for GPUs, which always do."""

    fp32: list[CpuClass] = msgspec.field(default_factory=list)
    int8: list[CpuClass] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.int8 and not self.fp32:
            # int8-plain is quantized from fp32-plain, and a variant without hosts would read
            # as its precision's default.
            raise ValueError("plain_graph_cpus: int8 classes need fp32 classes too")

    def for_precision(self, precision: Precision) -> list[CpuClass]:
        if precision is Precision.FP16:
            return []
        return list(self.int8 if precision is Precision.INT8 else self.fp32)


class Fusion(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    optimizer: str
    """onnxruntime.transformers optimizer model_type ("bert", ...), or "none" to skip it."""
    expected_per_layer: dict[str, int] = msgspec.field(default_factory=dict)
    """Fused op counts per transformer layer that the optimized graph must reach."""
    expected: dict[str, int] = msgspec.field(default_factory=dict)
    """Fused op counts for the whole graph (embedding layer norm, ...)."""
    attention_unfused_reason: str | None = None
    """Set when this family's attention cannot be fused: why. Without it, an export whose graph
    holds no fused attention op fails."""
    min_opset: int | None = None
    """The lowest --opset at which the expected fusions happen; lower ones are refused."""
    min_opset_reason: str = ""
    """Why (shown with the refusal)."""
    plain_graph_cpus: PlainGraphCpus = msgspec.field(default_factory=PlainGraphCpus)
    """Where the plain graph runs instead of the fused one: the artifact then carries the
    plain fp32 graph, and the plain int8 one when int8 names a class."""


class Tolerance(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    fp32: float = 0.99999
    fp16: float = 0.999
    int8: float = 0.98

    def for_precision(self, precision: Precision) -> float:
        return float(getattr(self, precision.value))


class Aliases(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    hidden_size: str = "hidden_size"
    num_attention_heads: str = "num_attention_heads"
    num_hidden_layers: str = "num_hidden_layers"
    max_position_embeddings: str = "max_position_embeddings"


class RerankerPrompt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How this family's generative rerankers are prompted (their model card's code); the
    exporter resolves the answer tokens to ids with the checkpoint's tokenizer."""

    prefix: str
    template: str
    """With `{instruction}`, `{query}` and `{document}` placeholders."""
    suffix: str
    default_instruction: str
    yes_token: str = "yes"
    no_token: str = "no"
    prompt_tokens: list[str] = msgspec.field(default_factory=list)
    """Special tokens the prefix and suffix use, each one token in the family's tokenizer
    (Qwen's ChatML markers); a tokenizer without them is not this layout, and would score
    the prompt as ordinary text."""
    max_length: int | None = None
    """The model card's own length limit on a formatted pair (Qwen3-Reranker: 8192), kept
    as the artifact's input length where the model's positions allow more."""


class ModelCard(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    family: str
    model_types: list[str]
    remote_code_architectures: list[str] = msgspec.field(default_factory=list)
    """Architectures that exist only as a checkpoint's own modeling code (auto_map), run with
    --trust-remote-code; matched by name before model_type, which such configs often borrow
    (JinaBERT's says "bert")."""
    inputs: list[str]
    """Graph inputs, in order: input_ids, attention_mask, then token_type_ids and/or
    position_ids where the family uses them."""
    heads: list[Head]
    default_pooling: Pooling
    """Used when the checkpoint has no 1_Pooling/config.json and no --pooling is given."""
    position_offset: int = 0
    """Positions the model reserves (RoBERTa: padding index + 1), not usable by tokens."""
    padding_side: str = "right"
    decoder: bool = False
    """Decoders (causal, or bidirectional like EmbeddingGemma): traced without a KV cache,
    with positions counted over real tokens so either padding side gives the same vectors."""
    attn_implementation: str = "eager"
    """transformers attention implementation traced into the graph: the one whose ONNX pattern
    onnxruntime's optimizer fuses for this family (eager for BERT-likes, sdpa for DistilBERT)."""
    aliases: Aliases = msgspec.field(default_factory=Aliases)
    fusion: Fusion
    tolerance: Tolerance = msgspec.field(default_factory=Tolerance)
    generative_reranker: RerankerPrompt | None = None
    """Set for a family whose causal LMs serve as generative rerankers (`--task rerank` on a
    *ForCausalLM checkpoint); needs the causal-lm head."""


class CardError(Exception):
    pass


def cards_dir() -> Path:
    # In a wheel the cards are packaged inside tei_export; in a checkout they sit at the root.
    packaged = Path(__file__).parent / "model_cards"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "model_cards"


@cache
def load_cards() -> tuple[ModelCard, ...]:
    cards = []
    for path in sorted(cards_dir().glob("*.toml")):
        try:
            raw = tomllib.loads(path.read_text())
            cards.append(msgspec.convert(raw, ModelCard))
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
            raise CardError(f"model card {path}: {e}") from e
    if not cards:
        raise CardError(f"no model cards found in {cards_dir()}")
    return tuple(cards)


def supported_model_types() -> list[str]:
    return sorted(t for card in load_cards() for t in card.model_types)


def supported_families() -> str:
    """`bert, ..., gemma3 (gemma3_text), ...`: each family, with its config.json model_type
    where the two differ."""
    described = []
    for card in sorted(load_cards(), key=lambda c: c.family):
        types = [t for t in card.model_types if t != card.family]
        described.append(f"{card.family} ({', '.join(types)})" if types else card.family)
    return ", ".join(described)


def find_card(model_type: str, architecture: str, *, remote_code: bool = False) -> ModelCard:
    """The card for a model_type; for a checkpoint that runs its own code (`remote_code`), a
    card naming its architecture comes first."""
    if remote_code:
        for card in load_cards():
            if architecture in card.remote_code_architectures:
                return card
    for card in load_cards():
        if model_type in card.model_types:
            return card
    said = (f"model_type {model_type!r}" if model_type else
            "config.json has no model_type, which transformers reads the family from")  # fmt: skip
    raise CardError(
        f"unsupported architecture {architecture} ({said}); "
        f"supported families (model_type where it differs): {supported_families()}"
    )
