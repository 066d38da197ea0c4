"""The artifact contract: manifest.json, written by tei-export and read by everything else.

The manifest forbids unknown fields so that a reader never silently ignores something a newer
writer meant; `schema_version` is checked before anything else is decoded.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import msgspec

from tei_runtime.errors import ManifestError
from tei_runtime.host import CpuClass

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


class Task(enum.StrEnum):
    EMBED = "embed"
    RERANK = "rerank"
    CLASSIFY = "classify"
    SPARSE = "sparse"


class Pooling(enum.StrEnum):
    CLS = "cls"
    MEAN = "mean"
    LAST_TOKEN = "last-token"
    SPLADE = "splade"

    @classmethod
    def named(cls, name: str) -> Pooling:
        """The pooling a flag names, TEI's spelling (`last_token`) or ours, any case;
        ValueError for any other name."""
        return cls(name.strip().lower().replace("_", "-"))


class Precision(enum.StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class GraphForm(enum.StrEnum):
    FUSED = "fused"
    """The transformer optimizer's fusions (Attention, SkipLayerNorm ...) applied offline."""
    PLAIN = "plain"
    """The graph as traced; onnxruntime applies its own fusions when it loads it."""


class Source(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model_id: str
    """Hub id or the local folder the artifact was exported from."""
    revision: str | None = None
    commit_sha: str | None = None
    adapter: str | None = None
    """The task LoRA adapter merged into the weights (jina-embeddings-v3), if any."""


# A file of the artifact: a bare name in its folder, never a path out of it (a manifest
# edited to say `../elsewhere.onnx` is refused, not followed).
FileName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")]
Positive = Annotated[int, msgspec.Meta(ge=1)]


class Validation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    min_cosine: float
    """Worst row's cosine against PyTorch; for single-score models (rerankers), the cosine of
    all the validated scores as one vector, centred on PyTorch's mean score."""
    max_abs_err: float
    tolerance: float
    """The minimum cosine this variant had to reach to be written."""
    shapes: list[tuple[int, int]]
    """(batch, sequence length) pairs compared against the PyTorch reference."""


class Variant(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    file: FileName
    precision: Precision
    sha256: str
    fused_ops: dict[str, int]
    """Operator type -> count in the graph, for the fused ops the exporter looks for."""
    validation: Validation
    external_data: dict[FileName, str] = msgspec.field(default_factory=dict)
    """External-data files the graph loads (graphs over ~1.5 GB): file name -> sha256.
    Added by the runtime's owner; the runtime verifies each before loading the graph."""
    graph: GraphForm = GraphForm.FUSED
    hosts: list[CpuClass] = msgspec.field(default_factory=list)
    """CPU classes on which this variant runs instead of its precision's default (measured
    faster there); empty for the default, which every other host and every GPU runs, and for
    a plain graph written to be compared (`tei-export --plain-graphs`), which runs only when
    asked for."""


class IoNames(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    inputs: list[str]
    """Graph inputs in order; a subset of input_ids, attention_mask, token_type_ids,
    position_ids."""
    outputs: list[str]
    """Graph outputs: `token_embeddings` [batch, seq, hidden] for every embed model, plus
    `sentence_embedding` [batch, dim] when pooling and Dense layers run in the graph;
    `logits` [batch, labels] for classifier/reranker heads; `sparse_embedding` [batch, vocab]
    (SPLADE, max-pooled in the graph) for sparse models."""


class Prompts(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    prompts: dict[str, str] = msgspec.field(default_factory=dict)
    default_prompt_name: str | None = None


class AnswerPrompt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A generative reranker's prompt (Qwen3-Reranker's layout): each (query, document) pair
    becomes `prefix + template + suffix`, and the relevance is the model's next-token
    preference for the "yes" answer over the "no" one at the last position."""

    prefix: str
    """Tokenized as it is before the formatted pair: the system prompt and the user turn's
    opening."""
    template: str
    """The pair, with `{instruction}`, `{query}` and `{document}` placeholders; this part alone
    is truncated to fit the model's input length, as the model card does."""
    suffix: str
    """Tokenized as it is after the pair: the end of the user turn and the answer's opening."""
    default_instruction: str
    """Used when a request gives no `instruction`."""
    yes_token: str
    no_token: str
    yes_token_id: int
    no_token_id: int


class GenerativeRerank(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Set on a rerank artifact exported from a causal LM: its `logits` output is the last
    position's logit of `yes_token` minus that of `no_token` ([batch, 1]); its sigmoid is the
    model card's softmax over the (no, yes) pair."""

    prompt: AnswerPrompt


class Toolchain(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tei_onnx: str
    torch: str
    transformers: str
    onnx: str
    onnxruntime: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    schema_version: int
    source: Source
    task: Task
    architecture: str
    """The transformers class the graph was traced from, e.g. BertModel."""
    model_type: str
    """config.json's model_type, e.g. bert."""
    card: str
    """The model card (model_cards/<card>.toml) used for the export."""
    pooling: Pooling | None
    """How token embeddings become one vector (None for classifier/reranker heads)."""
    normalize: bool
    max_input_length: Positive
    hidden_size: Positive
    pooling_in_graph: bool = False
    """True when the graph already pools (Dense modules, SPLADE): read its pooled output."""
    io: IoNames
    labels: dict[int, str] = msgspec.field(default_factory=dict)
    """id2label for classifier and reranker heads."""
    prompts: Prompts = msgspec.field(default_factory=Prompts)
    padding_side: str = "right"
    truncation_side: str = "right"
    opset: int
    toolchain: Toolchain
    tokenizer_files: list[FileName]
    tokenizer_sha256: dict[FileName, str]
    variants: Annotated[list[Variant], msgspec.Meta(min_length=1)]
    generative_rerank: GenerativeRerank | None = None
    """A generative reranker (a causal LM answering yes/no): how pairs become its prompt.
    Absent in every other artifact (and in artifacts written before it existed)."""

    def variant(
        self, precision: Precision, cpu: CpuClass | None = None, graph: GraphForm | None = None
    ) -> Variant:
        """The variant of `precision` to run: the one measured best on CPU class `cpu` when
        the artifact has one, else the precision's default (None: a GPU, always the default).
        `graph` asks for one graph form whatever the host (benchmarks, an unmeasured host)."""
        found = [v for v in self.variants if v.precision is precision]
        if not found:
            have = ", ".join(v.precision.value for v in self.variants)
            raise ManifestError(f"artifact has no {precision.value} variant (it has: {have})")
        if graph is not None:
            for v in found:
                if v.graph is graph:
                    return v
            have = ", ".join(sorted(v.graph.value for v in found))
            raise ManifestError(
                f"artifact has no {graph.value} {precision.value} graph (it has: {have})"
            )
        if cpu is not None:
            for v in found:
                if cpu in v.hosts:
                    return v
        # A plain graph no class was measured on (`tei-export --plain-graphs`) is there to be
        # asked for, never the default.
        defaults = [v for v in found if not v.hosts]
        fused = [v for v in defaults if v.graph is GraphForm.FUSED]
        return (fused or defaults or found)[0]


class _VersionOnly(msgspec.Struct):
    schema_version: int


def encode_manifest(manifest: Manifest) -> bytes:
    fields = msgspec.to_builtins(manifest)
    for variant in fields["variants"]:
        # Defaults are left out, so an artifact with one graph per precision reads as before
        # these fields existed (readers refuse unknown fields).
        if variant["graph"] == GraphForm.FUSED.value:
            del variant["graph"]
        if not variant["hosts"]:
            del variant["hosts"]
    if manifest.generative_rerank is None:
        # Every other artifact is written as before the field existed, so readers that
        # predate it (unknown fields are refused) still read them.
        del fields["generative_rerank"]
    return msgspec.json.format(msgspec.json.encode(fields), indent=2) + b"\n"


def decode_manifest(data: bytes, *, where: str = MANIFEST_NAME) -> Manifest:
    try:
        version = msgspec.json.decode(data, type=_VersionOnly).schema_version
    except msgspec.DecodeError as e:
        raise ManifestError(f"{where}: not a tei-onnx manifest ({e})") from e
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{where}: schema_version {version} is not supported (this tei-onnx reads "
            f"{SCHEMA_VERSION}); re-export the model or upgrade tei-onnx"
        )
    try:
        return msgspec.json.decode(data, type=Manifest)
    except msgspec.ValidationError as e:
        raise ManifestError(f"{where}: {e}") from e


def read_manifest(artifact_dir: Path) -> Manifest:
    path = artifact_dir / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise ManifestError(f"{path}: missing; is {artifact_dir} a tei-export artifact?") from e
    return decode_manifest(data, where=str(path))
