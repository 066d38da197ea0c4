"""Hub checkpoints in their authors' remote-code layout (nomic-embed-text-v1.5's nomic_bert keys
and Wqkv weights, gte-*-v1.5's "new" model), exported without --trust-remote-code through
transformers' native classes, against the native model they were written from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.parity_inputs import DTYPES, MIN_COSINE, PAIRS, TEXTS, prefixed_mean_reference
from support.tiny_encoders import (
    COMMON,
    GTE_NTK_FACTOR,
    GTE_THETA,
    JINA_V3_INSTRUCTIONS,
    build_hub_layout,
    build_jina_v3_published,
    ntk_inv_freq,
)
from tei_export.errors import ExportError
from tei_export.hub_layouts import stage_native
from tei_runtime.manifest import Task, read_manifest

pytestmark = pytest.mark.slow



def _export(checkpoint: Path, out: Path) -> Path:
    from tei_export.api import export_model

    return export_model(str(checkpoint), out, quiet=True)


def _reference_vectors(checkpoint: Path, model: Any, pooling: str) -> np.ndarray:
    """The native model on one unpadded text at a time, pooled and normalised."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            tokens = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
            vector = tokens[0] if pooling == "cls" else tokens.mean(dim=0)
            rows.append((vector / vector.norm()).numpy())
    return np.stack(rows)


def _assert_matches(artifact: Path, reference: np.ndarray) -> None:
    import tei_runtime

    manifest = read_manifest(artifact)
    for variant in manifest.variants:
        assert variant.validation.min_cosine >= MIN_COSINE[variant.precision], variant.file
    for precision, dtype in DTYPES.items():
        got = tei_runtime.load(artifact, device="cpu", dtype=dtype).embed(TEXTS)
        cosines = (got * reference).sum(-1) / np.linalg.norm(got, axis=-1)
        assert cosines.min() >= MIN_COSINE[precision], (dtype, cosines)


@pytest.mark.parametrize(("layout", "pooling"), [("nomic_bert", "mean"), ("new", "cls")])
def test_hub_layout_embedder_exports_like_native(
    tmp_path: Path, layout: str, pooling: str
) -> None:
    checkpoint, native = build_hub_layout(tmp_path / "ck", layout, st_pooling=pooling)
    assert "auto_map" in json.loads((checkpoint / "config.json").read_text())
    artifact = _export(checkpoint, tmp_path / "art")
    manifest = read_manifest(artifact)
    assert manifest.task is Task.EMBED
    assert manifest.model_type == {"nomic_bert": "nomic_bert", "new": "gte"}[layout]
    _assert_matches(artifact, _reference_vectors(checkpoint, native, pooling))
    # The native copy the export read from is gone, and nothing but the artifact is left.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "ck"]


def test_hub_layout_reranker_exports_like_native(tmp_path: Path) -> None:
    """gte-multilingual-reranker-base's layout: NewForSequenceClassification, new.* weights."""
    import torch
    import transformers

    import tei_runtime

    checkpoint, native = build_hub_layout(
        tmp_path / "ck", "new", head="sequence-classification", type_vocab_size=1, ntk=False
    )
    artifact = _export(checkpoint, tmp_path / "art")
    assert read_manifest(artifact).task is Task.RERANK
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    with torch.no_grad():
        reference = np.stack(
            [native(**tokenizer(*pair, return_tensors="pt")).logits[0].numpy() for pair in PAIRS]
        )
    got = tei_runtime.load(artifact, device="cpu").predict(PAIRS, raw_scores=True)
    np.testing.assert_allclose(got, reference, atol=1e-4, rtol=1e-4)


def test_gte_ntk_rope_scaling_keeps_new_impl_frequencies(tmp_path: Path) -> None:
    import torch
    import transformers

    checkpoint, _ = build_hub_layout(tmp_path / "ck", "new")
    staged = stage_native(checkpoint, tmp_path)
    assert staged is not None
    model = transformers.AutoModel.from_pretrained(str(staged))
    head_dim = COMMON["hidden_size"] // COMMON["num_attention_heads"]
    torch.testing.assert_close(
        model.rotary_emb.inv_freq, ntk_inv_freq(GTE_THETA, GTE_NTK_FACTOR, head_dim)
    )


def _rewrite_weights(checkpoint: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(checkpoint / "model.safetensors"))
    edit(weights)
    save_file(weights, str(checkpoint / "model.safetensors"))


def test_missing_published_weight_is_named(tmp_path: Path) -> None:
    checkpoint, _ = build_hub_layout(tmp_path / "ck", "nomic_bert")
    _rewrite_weights(checkpoint, lambda w: w.pop("encoder.layers.1.mlp.fc12.weight"))
    with pytest.raises(ExportError, match=r"lacks weight 'encoder\.layers\.1\.mlp\.fc12\.weight'"):
        stage_native(checkpoint, tmp_path)


def test_unmappable_published_weight_is_named(tmp_path: Path) -> None:
    import torch

    checkpoint, _ = build_hub_layout(tmp_path / "ck", "new")
    _rewrite_weights(
        checkpoint, lambda w: w.update({"encoder.layer.0.attention.rel_bias": torch.zeros(4)})
    )
    with pytest.raises(ExportError, match=r"weight 'encoder\.layer\.0\.attention\.rel_bias'"):
        stage_native(checkpoint, tmp_path)


def test_unmappable_published_setting_is_named(tmp_path: Path) -> None:
    checkpoint, _ = build_hub_layout(tmp_path / "ck", "nomic_bert")
    config = json.loads((checkpoint / "config.json").read_text())
    config["rotary_emb_interleaved"] = True
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="rotary_emb_interleaved=True"):
        stage_native(checkpoint, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]



def test_an_error_in_the_mapped_copy_names_the_users_checkpoint(tmp_path: Path) -> None:
    """The export reads a rewritten copy in a scratch folder that is gone once it fails: the
    message must name the file the user can open and fix."""
    from tei_export.api import export_model

    checkpoint, _ = build_hub_layout(tmp_path / "ck", "nomic_bert")
    (checkpoint / "tokenizer.json").write_text("{")
    with pytest.raises(ExportError) as failed:
        export_model(str(checkpoint), tmp_path / "art", quiet=True)
    assert str(failed.value).startswith(f"{checkpoint / 'tokenizer.json'}: the tokenizers library")
    assert "scratch" not in str(failed.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]

# -- jina-embeddings-v3: its published layout, with one task LoRA adapter merged ----------------


def test_jina_v3_with_an_adapter_matches_that_task_and_prompts_its_instruction(
    tmp_path: Path,
) -> None:
    from tei_export.api import export_model

    checkpoint, base, with_adapter = build_jina_v3_published(tmp_path / "ck")
    artifact = export_model(str(checkpoint), tmp_path / "art", adapter="retrieval.query",
                            quiet=True)  # fmt: skip
    manifest = read_manifest(artifact)
    assert manifest.model_type == "jina_embeddings_v3"
    assert manifest.source.adapter == "retrieval.query"
    instruction = JINA_V3_INSTRUCTIONS["retrieval.query"]
    assert manifest.prompts.default_prompt_name == "retrieval.query"
    assert manifest.prompts.prompts["retrieval.query"] == instruction
    reference = prefixed_mean_reference(checkpoint, with_adapter("retrieval.query"), instruction)
    _assert_matches(artifact, reference)
    # The adapter matters: the base weights on the same prompted texts are far from it.
    unadapted = prefixed_mean_reference(checkpoint, base, instruction)
    assert (unadapted * reference).sum(-1).min() < 0.999
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "ck"]


def test_jina_v3_without_an_adapter_is_the_base_model(tmp_path: Path) -> None:
    """No --adapter: the base weights (jina's `encode(task=None)`), no prompt; the checkpoint
    published without a pooler exports too (the pooler is never in the graph)."""
    from tei_export.api import export_model

    checkpoint, base, _ = build_jina_v3_published(tmp_path / "ck", with_pooler=False)
    artifact = export_model(str(checkpoint), tmp_path / "art", quiet=True)
    manifest = read_manifest(artifact)
    assert manifest.source.adapter is None
    assert manifest.prompts.default_prompt_name is None
    _assert_matches(artifact, prefixed_mean_reference(checkpoint, base, ""))


def test_jina_v3_adapter_without_instruction_sets_no_prompt(tmp_path: Path) -> None:
    import torch
    import transformers

    checkpoint, _, with_adapter = build_jina_v3_published(tmp_path / "ck")
    staged = stage_native(checkpoint, tmp_path, adapter="text-matching")
    assert staged is not None
    assert not (staged / "config_sentence_transformers.json").exists() or (
        "default_prompt_name" not in json.loads(
            (staged / "config_sentence_transformers.json").read_text())
    )  # fmt: skip
    loaded = transformers.AutoModel.from_pretrained(str(staged)).eval()
    expected = with_adapter("text-matching")
    for name, weight in expected.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], weight, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("adapter", "message"),
    [("retrieval", r"has the adapters retrieval\.query, retrieval\.passage"),
     ("text-matching", r"has no task LoRA adapters")],
)  # fmt: skip
def test_unknown_or_impossible_adapter_is_refused(
    tmp_path: Path, adapter: str, message: str
) -> None:
    if adapter == "text-matching":  # a checkpoint with no adapters at all
        checkpoint, _ = build_hub_layout(tmp_path / "ck", "nomic_bert")
    else:
        checkpoint, _, _ = build_jina_v3_published(tmp_path / "ck")
    with pytest.raises(ExportError, match=message):
        stage_native(checkpoint, tmp_path, adapter=adapter)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
