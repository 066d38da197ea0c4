"""Every model card, exported from a tiny random-weight checkpoint and run through tei_runtime,
against PyTorch: sentence-transformers for embedders, transformers for the heads.

The reference runs one text at a time (no padding at all), the runtime in one padded batch, so
these also check that padding, position ids and pooling masks are right for each family.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.loopback_server import served_embeddings, served_logits
from support.parity_inputs import MIN_COSINE, PAIRS, TEXTS, cosines
from support.tiny_models import DECODERS, FAMILIES, build_checkpoint
from tei_export.cards import find_card
from tei_export.fuse import expected_counts
from tei_runtime.manifest import (
    MANIFEST_NAME,
    GraphForm,
    Precision,
    Task,
    encode_manifest,
    read_manifest,
)

pytestmark = pytest.mark.slow



def _export(checkpoint: Path, out: Path, **options: Any) -> Path:
    from tei_export.api import export_model

    return export_model(str(checkpoint), out, quiet=True, **options)


GRAPHS = (("float32", "fused"), ("float16", "fused"), ("int8", "fused"), ("float32", "plain"),
          ("int8", "plain"))
"""Every (dtype, graph) an export with plain_graphs holds: the plain ones no card loads by
default, so only these tests run them against the reference."""


def _check_manifest(artifact: Path, model_type: str, task: Task) -> None:
    manifest = read_manifest(artifact)
    assert manifest.task is task
    assert {v.precision for v in manifest.variants} == set(Precision)
    card = find_card(model_type, manifest.architecture)
    layers = 2
    plain = {v.precision for v in manifest.variants if v.graph is GraphForm.PLAIN}
    # Exported with plain_graphs: the plain traced fp32 and int8 graphs beside the fused ones.
    assert plain == {Precision.FP32, Precision.INT8}
    for variant in manifest.variants:
        assert variant.validation.min_cosine >= MIN_COSINE[variant.precision]
        if variant.graph is GraphForm.PLAIN:  # onnxruntime fuses it at load
            # The CPU classes that load it by default are the card's, whoever asked for it.
            assert variant.hosts == card.fusion.plain_graph_cpus.for_precision(variant.precision)
            continue
        if variant.precision is Precision.INT8:
            continue  # int8 keeps the fused ops but also reads QDQ pairs
        for op, per_layer in card.fusion.expected_per_layer.items():
            assert variant.fused_ops.get(op, 0) >= per_layer * layers, (variant.file, op)
        for op, count in card.fusion.expected.items():
            assert variant.fused_ops.get(op, 0) >= count, (variant.file, op)


def _st_reference(checkpoint: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(checkpoint), device="cpu")
    return np.concatenate(
        [model.encode([t], normalize_embeddings=True, convert_to_numpy=True) for t in texts]
    )


ST_POOLING = {"cls": "cls", "mean": "mean", "last-token": "last-token"}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_embedder_matches_sentence_transformers(tmp_path: Path, model_type: str) -> None:
    import tei_runtime

    card_type = "gemma3_text" if model_type == "gemma3_text" else model_type
    pooling = find_card(card_type, "?").default_pooling.value
    checkpoint = build_checkpoint(tmp_path / "ck", model_type, st_pooling=ST_POOLING[pooling])
    artifact = _export(checkpoint, tmp_path / "art", plain_graphs=True)
    _check_manifest(artifact, model_type, Task.EMBED)

    reference = _st_reference(checkpoint, TEXTS)
    for dtype, graph in GRAPHS:
        model = tei_runtime.load(artifact, device="cpu", dtype=dtype, graph=graph)
        found = cosines(model.embed(TEXTS), reference)
        assert found.min() >= MIN_COSINE[model.precision], (dtype, graph, found)
    served = served_embeddings(tei_runtime.load(artifact, device="cpu"), TEXTS)
    assert cosines(served, reference).min() >= MIN_COSINE[Precision.FP32], "served /embed"
    if model_type in DECODERS:
        # One graph, padded either way by the runtime, gives the unpadded vectors.
        for side in ("left", "right"):
            padded = _with_padding_side(artifact, side, tmp_path / f"art-{side}")
            got = tei_runtime.load(padded, device="cpu").embed(TEXTS)
            assert cosines(got, reference).min() >= MIN_COSINE[Precision.FP32], side
        # The decoder's mask is additive and finite (reference.additive_mask): no NaN guard
        # (IsNaN + Where) on every layer's attention weights.
        import onnx

        for variant in read_manifest(artifact).variants:
            graph = onnx.load(str(artifact / variant.file), load_external_data=False).graph
            assert "IsNaN" not in {node.op_type for node in graph.node}, variant.file


def _with_padding_side(artifact: Path, side: str, dest: Path) -> Path:
    import shutil

    import msgspec

    shutil.copytree(artifact, dest)
    manifest = msgspec.structs.replace(read_manifest(artifact), padding_side=side)
    (dest / MANIFEST_NAME).write_bytes(encode_manifest(manifest))
    return dest


def test_dense_and_prompts_match_sentence_transformers(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    import tei_runtime

    checkpoint = build_checkpoint(
        tmp_path / "ck", "bert", st_pooling="mean", dense_out=16,
        prompts={"query": "query: ", "passage": "passage: "},
    )
    artifact = _export(checkpoint, tmp_path / "art", precisions=[Precision.FP32])
    model = tei_runtime.load(artifact, device="cpu")
    assert model.dimension == 16
    st = SentenceTransformer(str(checkpoint), device="cpu")
    reference = np.concatenate(
        [st.encode([t], prompt_name="query", normalize_embeddings=True) for t in TEXTS]
    )
    got = model.embed(TEXTS, prompt_name="query")
    assert cosines(got, reference).min() >= 0.99999


def _hf_logits(checkpoint: Path, inputs: list[tuple[str, str]] | list[str]) -> np.ndarray:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(checkpoint), attn_implementation="eager"
    ).eval()
    rows = []
    with torch.no_grad():
        for item in inputs:
            encoded = (tokenizer(*item, return_tensors="pt") if isinstance(item, tuple)
                       else tokenizer(item, return_tensors="pt"))
            rows.append(model(**encoded).logits[0].numpy())
    return np.stack(rows)


HEAD_CASES = [
    ("bert", 1), ("roberta", 1), ("xlm-roberta", 3), ("modernbert", 1), ("modernbert", 3),
    ("bert", 3), ("roberta", 3),
]


@pytest.mark.parametrize(("model_type", "labels"), HEAD_CASES)
def test_sequence_classification_matches_transformers(
    tmp_path: Path, model_type: str, labels: int
) -> None:
    import tei_runtime

    checkpoint = build_checkpoint(
        tmp_path / "ck", model_type, head="sequence-classification", num_labels=labels
    )
    artifact = _export(checkpoint, tmp_path / "art", plain_graphs=True)
    task = Task.RERANK if labels == 1 else Task.CLASSIFY
    _check_manifest(artifact, model_type, task)
    inputs: list[Any] = PAIRS if labels == 1 else TEXTS
    reference = _hf_logits(checkpoint, inputs)
    plain = tei_runtime.load(artifact, device="cpu", graph="plain")
    np.testing.assert_allclose(plain.predict(inputs, raw_scores=True), reference, atol=1e-4,
                               rtol=1e-4)
    model = tei_runtime.load(artifact, device="cpu")
    raw = model.predict(inputs, raw_scores=True)
    np.testing.assert_allclose(raw, reference, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(served_logits(model, inputs), reference, atol=1e-4, rtol=1e-4)
    scores = model.predict(inputs)
    expected: Callable[[np.ndarray], np.ndarray]
    if labels == 1:
        expected = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    else:
        expected = lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose(scores, expected(reference), atol=1e-4)
    if labels > 1:
        assert read_manifest(artifact).labels == {i: f"label_{i}" for i in range(labels)}


def test_splade_matches_transformers(tmp_path: Path) -> None:
    import torch
    import transformers

    import tei_runtime

    checkpoint = build_checkpoint(tmp_path / "ck", "bert", head="masked-lm")
    artifact = _export(checkpoint, tmp_path / "art", pooling="splade", plain_graphs=True)
    _check_manifest(artifact, "bert", Task.SPARSE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(
        str(checkpoint), attn_implementation="eager"
    ).eval()
    expected = []
    for text in TEXTS:
        with torch.no_grad():
            logits = mlm(**tokenizer(text, return_tensors="pt")).logits[0]
        expected.append(torch.log1p(torch.relu(logits)).max(dim=0).values.numpy())
    for graph in ("fused", "plain"):
        got = tei_runtime.load(artifact, device="cpu", graph=graph).embed_sparse(TEXTS)
        for want, sparse in zip(expected, got, strict=True):
            dense = np.zeros_like(want)
            dense[sparse.indices] = sparse.values
            np.testing.assert_allclose(dense, want, atol=1e-4, err_msg=graph)
            assert set(sparse.indices) == set(np.flatnonzero(want > 0).tolist()), graph


def test_fused_counts_scale_with_layers(tmp_path: Path) -> None:
    """The manifest's counts are the optimizer's, per layer, not a copy of the card."""
    from tei_export.checkpoint import read_checkpoint
    from tei_export.plan import make_plan

    checkpoint = build_checkpoint(tmp_path / "ck", "bert", st_pooling="cls")
    artifact = _export(checkpoint, tmp_path / "art", precisions=[Precision.FP32])
    fp32 = read_manifest(artifact).variants[0]
    plan = make_plan(read_checkpoint(checkpoint))
    assert fp32.fused_ops["Attention"] == expected_counts(plan)["Attention"] == 2
