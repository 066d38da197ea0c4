"""Tiny artifacts built in the test: onnx.helper graphs, a WordLevel tokenizer, a manifest.

The graph is a toy "transformer": token_embeddings = E[ids] (+ T[type_ids]) (+ P[position_ids])
plus half the masked mean of those over the sequence. Every token therefore depends on the
other real tokens and on none of the padding, so a runtime that pads, masks or numbers
positions wrongly gives different numbers than `reference_tokens`, the numpy twin that runs
one unpadded sequence.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from tei_runtime.checksum import sha256_file
from tei_runtime.manifest import (
    SCHEMA_VERSION,
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

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = [
    "hello", "world", "the", "a", "cat", "dog", "sat", "on", "mat", "query", "passage",
    "document", ":", "search", "fast", "slow", "red", "blue", "green", "one", "two", "three",
    "é", "naïve", "café",
] + [f"w{i}" for i in range(40)]  # fmt: skip
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
HIDDEN = 8
DENSE = 6
LABELS = 3
MAX_POSITIONS = 64
FloatArray = npt.NDArray[np.float32]


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])],
    )
    return tok


@dataclass(frozen=True)
class Weights:
    embed: FloatArray
    types: FloatArray
    positions: FloatArray
    dense: FloatArray
    head: FloatArray
    vocab: FloatArray


def make_weights(labels: int = LABELS, seed: int = 0) -> Weights:
    rng = np.random.default_rng(seed)
    v = len(VOCAB)
    f = np.float32
    return Weights(
        embed=rng.normal(size=(v, HIDDEN)).astype(f),
        types=rng.normal(size=(2, HIDDEN)).astype(f),
        positions=rng.normal(size=(MAX_POSITIONS, HIDDEN)).astype(f),
        dense=rng.normal(size=(HIDDEN, DENSE)).astype(f),
        head=rng.normal(size=(HIDDEN, labels)).astype(f),
        vocab=rng.normal(size=(HIDDEN, v)).astype(f),
    )


@dataclass(frozen=True)
class Spec:
    task: Task = Task.EMBED
    pooling: Pooling | None = Pooling.MEAN
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    pooling_in_graph: bool = False
    padding_side: str = "right"
    truncation_side: str = "right"
    manifest_inputs: tuple[str, ...] | None = None
    """io.inputs to write when it should differ from the graph's (to test the check)."""
    max_input_length: int = 16
    labels: int = LABELS
    precisions: tuple[Precision, ...] = (Precision.FP32,)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    fused_ops: dict[str, int] = field(default_factory=dict)
    """What each variant's manifest entry says the graph holds (the graph is the toy one)."""


def reference_tokens(
    w: Weights, spec: Spec, ids: Sequence[int], types: Sequence[int]
) -> FloatArray:
    """The graph's token_embeddings for one unpadded sequence."""
    x = w.embed[list(ids)]
    if "token_type_ids" in spec.inputs:
        x = x + w.types[list(types)]
    if "position_ids" in spec.inputs:
        x = x + w.positions[np.arange(len(ids))]
    if len(ids) == 0:
        return x.astype(np.float32)
    return (x + 0.5 * x.mean(axis=0, keepdims=True)).astype(np.float32)


def _graph(w: Weights, spec: Spec) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(w.embed, "E"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
    ]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in spec.inputs
    ]
    nodes.append(helper.make_node("Gather", ["E", "input_ids"], ["x0"]))
    last = "x0"
    if "token_type_ids" in spec.inputs:
        inits.append(numpy_helper.from_array(w.types, "T"))
        nodes += [
            helper.make_node("Gather", ["T", "token_type_ids"], ["t"]),
            helper.make_node("Add", [last, "t"], ["x1"]),
        ]
        last = "x1"
    if "position_ids" in spec.inputs:
        inits.append(numpy_helper.from_array(w.positions, "P"))
        nodes += [
            helper.make_node("Gather", ["P", "position_ids"], ["p"]),
            helper.make_node("Add", [last, "p"], ["x2"]),
        ]
        last = "x2"

    def masked_mean(src: str, out: str, keepdims: int) -> None:
        nodes.extend(
            [
                helper.make_node("Mul", [src, "m3"], [f"{out}_w"]),
                helper.make_node(
                    "ReduceSum", [f"{out}_w", "axis1"], [f"{out}_s"], keepdims=keepdims
                ),
                helper.make_node("ReduceSum", ["m3", "axis1"], [f"{out}_c0"], keepdims=keepdims),
                helper.make_node("Max", [f"{out}_c0", "one"], [f"{out}_c"]),
                helper.make_node("Div", [f"{out}_s", f"{out}_c"], [out]),
            ]
        )

    nodes += [
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "axis2"], ["m3"]),
    ]
    masked_mean(last, "ctx", 1)
    nodes += [
        helper.make_node("Mul", ["ctx", "half"], ["ctx_h"]),
        helper.make_node("Add", [last, "ctx_h"], ["token_embeddings"]),
    ]
    outputs = [
        helper.make_tensor_value_info(
            "token_embeddings", TensorProto.FLOAT, ["batch", "seq", HIDDEN]
        )
    ]
    if spec.task is Task.EMBED and spec.pooling_in_graph:
        inits.append(numpy_helper.from_array(w.dense, "D"))
        masked_mean("token_embeddings", "pooled", 0)
        nodes.append(helper.make_node("MatMul", ["pooled", "D"], ["sentence_embedding"]))
        outputs.append(
            helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", DENSE])
        )
    if spec.task in (Task.RERANK, Task.CLASSIFY):
        inits.append(numpy_helper.from_array(w.head[:, : spec.labels].copy(), "H"))
        masked_mean("token_embeddings", "pooled", 0)
        nodes.append(helper.make_node("MatMul", ["pooled", "H"], ["logits"]))
        outputs = [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", spec.labels])
        ]
    if spec.task is Task.SPARSE:
        inits.append(numpy_helper.from_array(w.vocab, "V"))
        nodes += [
            helper.make_node("MatMul", ["token_embeddings", "V"], ["vl"]),
            helper.make_node("Relu", ["vl"], ["vr"]),
            helper.make_node("Add", ["vr", "one"], ["v1"]),
            helper.make_node("Log", ["v1"], ["va"]),
            helper.make_node("Mul", ["va", "m3"], ["vm"]),
            helper.make_node("ReduceMax", ["vm"], ["sparse_embedding"], axes=[1], keepdims=0),
        ]
        outputs = [
            helper.make_tensor_value_info(
                "sparse_embedding", TensorProto.FLOAT, ["batch", len(VOCAB)]
            )
        ]
    graph = helper.make_graph(nodes, "toy", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@dataclass(frozen=True)
class Built:
    root: Path
    spec: Spec
    weights: Weights
    manifest: Manifest

    def tokens(self, ids: Sequence[int], types: Sequence[int] | None = None) -> FloatArray:
        return reference_tokens(self.weights, self.spec, ids, types or [0] * len(ids))


def write_artifact(root: Path, spec: Spec, seed: int = 0) -> Built:
    root.mkdir(parents=True, exist_ok=True)
    weights = make_weights(spec.labels, seed)
    build_tokenizer().save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text('{"model_max_length": 16}\n')
    onnx.save(_graph(weights, spec), str(root / "model.fp32.onnx"))
    variants = []
    for precision in spec.precisions:
        name = f"model.{precision.value}.onnx"
        if precision is not Precision.FP32:
            # Same graph under another name: enough to test variant choice and checksums.
            shutil.copy(root / "model.fp32.onnx", root / name)
        variants.append(
            Variant(
                name=precision.value,
                file=name,
                precision=precision,
                sha256=sha256_file(root / name),
                fused_ops=dict(spec.fused_ops),
                validation=Validation(
                    min_cosine=1.0, max_abs_err=0.0, tolerance=0.999, shapes=[(1, 4)]
                ),
            )
        )
    outputs = {
        Task.EMBED: ["token_embeddings"]
        + (["sentence_embedding"] if spec.pooling_in_graph else []),
        Task.RERANK: ["logits"],
        Task.CLASSIFY: ["logits"],
        Task.SPARSE: ["sparse_embedding"],
    }[spec.task]
    tokenizer_files = ["tokenizer.json", "tokenizer_config.json"]
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        source=Source(model_id="test/toy"),
        task=spec.task,
        architecture="ToyModel",
        model_type="toy",
        card="toy",
        pooling=spec.pooling,
        normalize=True,
        max_input_length=spec.max_input_length,
        hidden_size=HIDDEN,
        pooling_in_graph=spec.pooling_in_graph,
        io=IoNames(inputs=list(spec.manifest_inputs or spec.inputs), outputs=outputs),
        labels={i: f"LABEL_{i}" for i in range(spec.labels)}
        if spec.task in (Task.RERANK, Task.CLASSIFY)
        else {},
        prompts=Prompts(prompts=spec.prompts, default_prompt_name=spec.default_prompt_name),
        padding_side=spec.padding_side,
        truncation_side=spec.truncation_side,
        opset=17,
        toolchain=Toolchain(
            tei_onnx="0", torch="none", transformers="none", onnx=onnx.__version__, onnxruntime="x"
        ),
        tokenizer_files=tokenizer_files,
        tokenizer_sha256={f: sha256_file(root / f) for f in tokenizer_files},
        variants=variants,
    )
    (root / "manifest.json").write_bytes(encode_manifest(manifest))
    return Built(root=root, spec=spec, weights=weights, manifest=manifest)


ArtifactFactory = Callable[..., Built]
