from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from rt_artifacts import VOCAB, ArtifactFactory, Built

from tei_runtime import ManifestError, Model, Pooling, Task, ValidationError, load
from tei_runtime.backend import Output
from tei_runtime.data import Encoding
from tei_runtime.providers import ProviderChoice
from tei_runtime.session import OrtBackend

TEXTS = [
    "the cat sat on the mat",
    "hello",
    "red green blue one two three w1 w2 w3 w4",
    "",
    "dog",
    "fast slow fast slow",
]


def reference_pooled(built: Built, model: Model, texts: list[str]) -> np.ndarray:
    rows = []
    for enc in model.encode(texts):
        tok = built.tokens(enc.ids, enc.type_ids)
        pooling = built.spec.pooling
        if pooling is Pooling.MEAN:
            rows.append(tok.mean(axis=0))
        elif pooling is Pooling.CLS:
            rows.append(tok[0])
        else:
            rows.append(tok[-1])
    return np.stack(rows)


DECODER = ("input_ids", "attention_mask", "position_ids")


@pytest.mark.parametrize(
    ("pooling", "inputs", "side"),
    [
        (Pooling.MEAN, ("input_ids", "attention_mask", "token_type_ids"), "right"),
        (Pooling.CLS, ("input_ids", "attention_mask", "token_type_ids"), "right"),
        (Pooling.MEAN, ("input_ids", "attention_mask"), "right"),
        (Pooling.LAST_TOKEN, DECODER, "left"),
        (Pooling.LAST_TOKEN, DECODER, "right"),
        (Pooling.MEAN, DECODER, "left"),
        (Pooling.CLS, DECODER, "left"),
    ],
)
def test_pooling_matches_numpy_reference(
    make_artifact: ArtifactFactory, pooling: Pooling, inputs: tuple[str, ...], side: str
) -> None:
    built = make_artifact(pooling=pooling, inputs=inputs, padding_side=side)
    m = load(built.root)
    got = m.embed(TEXTS, normalize=False)
    want = reference_pooled(built, m, TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    unit = m.embed(TEXTS)
    np.testing.assert_allclose(unit, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_invariance(make_artifact: ArtifactFactory, side: str) -> None:
    built = make_artifact(pooling=Pooling.LAST_TOKEN, inputs=DECODER, padding_side=side)
    m = load(built.root)
    alone = np.concatenate([m.forward_embed(m.encode([t])) for t in TEXTS])
    together = m.forward_embed(m.encode(TEXTS))
    shuffled_order = [5, 2, 0, 4, 1, 3]
    shuffled = m.forward_embed(m.encode([TEXTS[i] for i in shuffled_order]))
    assert np.abs(alone - together).max() <= 1e-5
    assert np.abs(alone[shuffled_order] - shuffled).max() <= 1e-5
    # and with many long neighbours
    noisy = m.forward_embed(m.encode([TEXTS[1], *["w1 w2 w3 w4 w5 w6 w7 w8 w9"] * 7]))
    assert np.abs(noisy[0] - alone[1]).max() <= 1e-5


def test_left_and_right_padding_agree_for_decoders(make_artifact: ArtifactFactory) -> None:
    left = load(make_artifact(pooling=Pooling.LAST_TOKEN, inputs=DECODER, padding_side="left").root)
    right = load(
        make_artifact(pooling=Pooling.LAST_TOKEN, inputs=DECODER, padding_side="right").root
    )
    np.testing.assert_allclose(left.embed(TEXTS), right.embed(TEXTS), atol=1e-5)


def test_forward_tokens_removes_padding(make_artifact: ArtifactFactory) -> None:
    for side in ("left", "right"):
        built = make_artifact(inputs=DECODER, padding_side=side)
        m = load(built.root)
        encs = m.encode(TEXTS)
        for enc, got in zip(encs, m.forward_tokens(encs), strict=True):
            assert got.shape == (len(enc), 8)
            np.testing.assert_allclose(got, built.tokens(enc.ids), atol=1e-5)
        all_ = m.embed_all(TEXTS, batch_tokens=20)
        assert [a.shape[0] for a in all_] == [len(e) for e in encs]


def test_embed_packs_batches_and_restores_order(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    texts = [f"w{i} " * (i % 9 + 1) for i in range(40)]
    big = m.embed(texts)
    small = m.embed(texts, batch_tokens=12)  # many batches, each entry alone at worst
    np.testing.assert_allclose(big, small, atol=1e-5)
    np.testing.assert_allclose(small[7], m.embed([texts[7]])[0], atol=1e-5)


def test_max_input_length_is_cut_to_a_servers_batch_budget(embed_artifact: Built) -> None:
    """TEI cuts the model's length to --max-batch-tokens (auto-truncate on): inputs are then
    truncated there, /info reports it, and a longer input with truncation off is refused."""
    from tei_runtime.errors import InputTooLongError
    from tei_serve.cli import load_model
    from tei_serve.settings import Settings

    text = "cat dog " * 20
    full = load(embed_artifact.root)
    assert full.max_input_length > 6 and len(full.encode([text])[0]) > 6
    for model in (load(embed_artifact.root, max_input_length=6),
                  load_model(Settings(model_ids=(str(embed_artifact.root),),
                                      max_batch_tokens=6))[0]):  # fmt: skip
        assert model.max_input_length == 6
        assert len(model.encode([text])[0]) == 6
        with pytest.raises(InputTooLongError):
            model.encode([text], truncate=False)
    wide = load(embed_artifact.root, max_input_length=10_000)
    assert wide.max_input_length == full.max_input_length


def test_matryoshka_dimensions(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    full = m.embed(TEXTS[:2], normalize=False)
    cut = m.embed(TEXTS[:2], dimensions=3)
    np.testing.assert_allclose(
        cut, full[:, :3] / np.linalg.norm(full[:, :3], axis=1, keepdims=True), atol=1e-6
    )
    assert m.embed(TEXTS[:2], dimensions=3, normalize=False).shape == (2, 3)
    with pytest.raises(ValidationError, match="dimensions"):
        m.embed(["cat"], dimensions=9)


def test_embed_normalises_as_the_model_does_unless_told(
    embed_artifact: Built, tmp_path: Path
) -> None:
    """`normalize=None` follows the manifest (the checkpoint's Normalize module), as
    sentence-transformers' encode does; True / False force it; anything else is refused."""
    m = load(embed_artifact.root)
    raw = m.embed(TEXTS[:3], normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(np.linalg.norm(m.embed(TEXTS[:3]), axis=1), 1.0, atol=1e-6)
    copy = tmp_path / "no-normalize"
    shutil.copytree(embed_artifact.root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["normalize"] is True
    manifest["normalize"] = False
    (copy / "manifest.json").write_text(json.dumps(manifest))
    plain = load(copy)
    np.testing.assert_allclose(plain.embed(TEXTS[:3]), raw, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(plain.embed(TEXTS[:3], normalize=True), axis=1),
                               1.0, atol=1e-6)  # fmt: skip
    with pytest.raises(ValidationError, match="`normalize` must be True, False or None"):
        m.embed(TEXTS[:1], normalize=cast(Any, "no"))


def test_embed_empty_list_and_empty_inputs(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    assert m.embed([]).shape == (0, 8)
    out = m.embed(["", "cat"], normalize=True)
    assert not np.isnan(out).any()
    no_special = m.forward_embed(m.encode(["", "cat"], add_special_tokens=False))
    assert np.all(no_special[0] == 0) and not np.isnan(no_special).any()
    with pytest.raises(ValidationError, match="at least one"):
        m.forward_embed([])


@pytest.mark.parametrize(
    ("inputs", "options", "message"),
    [
        ([[]], {}, "token ids must not be empty"),  # was a vector of zeros
        (["a", []], {}, "token ids must not be empty"),
        ([b"bytes"], {}, "got bytes"),  # was read as token ids 98, 121, ...
        (None, {}, "got NoneType"),
        ({"a": 1}, {}, "got dict"),
        ((t for t in ["a"]), {}, "got generator"),
        (["a"], {"dimensions": 4.0}, "`dimensions` must be an integer"),
        (["a"], {"dimensions": True}, "`dimensions` must be an integer"),  # was 1 column
        (["a"], {"batch_tokens": 0}, "`batch_tokens` must be at least 1"),
        (["a"], {"prompt": 5}, "`prompt` must be a string"),
    ],
)  # fmt: skip
def test_bad_arguments_are_validation_errors(
    embed_artifact: Built, inputs: object, options: dict[str, object], message: str
) -> None:
    m = load(embed_artifact.root)
    with pytest.raises(ValidationError, match=message):
        m.embed(inputs, **options)  # type: ignore[arg-type]


def test_bad_load_arguments_are_runtime_errors(embed_artifact: Built) -> None:
    from tei_runtime import ProviderError

    with pytest.raises(ProviderError, match="dtype must be a string"):
        load(embed_artifact.root, dtype=None)  # type: ignore[arg-type]
    with pytest.raises(ProviderError, match="device must be a string"):
        load(embed_artifact.root, device=None)  # type: ignore[arg-type]
    with pytest.raises(ManifestError, match="artifact folder's path is needed"):
        load(None)  # type: ignore[arg-type]
    # counts from a config file come as strings or floats: named, not a TypeError
    for name, value in (("intra_op_threads", "2"), ("intra_op_threads", 1.5),
                        ("max_batch_tokens", None), ("max_batch_tokens", "8"),
                        ("max_input_length", True)):  # fmt: skip
        with pytest.raises(ProviderError, match=f"{name} must be an integer of at least 1"):
            load(embed_artifact.root, **{name: value})


def test_prompts_change_the_embedding_like_prefixing_the_text(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    np.testing.assert_allclose(
        m.embed(["cat"], prompt_name="query"), m.embed(["query : cat"]), atol=1e-6
    )


def test_pooling_in_graph_reads_sentence_embedding(make_artifact: ArtifactFactory) -> None:
    built = make_artifact(pooling_in_graph=True)
    m = load(built.root)
    got = m.embed(TEXTS, normalize=False)
    assert got.shape == (len(TEXTS), 6)
    want = np.stack(
        [
            built.tokens(e.ids, e.type_ids).mean(axis=0) @ built.weights.dense
            for e in m.encode(TEXTS)
        ]
    )
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(("exported", "wanted"), [(Pooling.MEAN, Pooling.CLS),
                                                   (Pooling.CLS, Pooling.MEAN),
                                                   (Pooling.MEAN, Pooling.LAST_TOKEN)])  # fmt: skip
def test_pooling_override_at_load_pools_the_token_embeddings_that_way(
    make_artifact: ArtifactFactory, exported: Pooling, wanted: Pooling
) -> None:
    """TEI's --pooling on an artifact whose graph hands out token embeddings."""
    built = make_artifact(pooling=exported)
    m = load(built.root, pooling=wanted.value.replace("-", "_").upper())
    assert m.manifest.pooling is wanted
    got = m.embed(TEXTS, normalize=False)
    rows = [built.tokens(e.ids, e.type_ids) for e in m.encode(TEXTS)]
    pick = {Pooling.CLS: lambda t: t[0], Pooling.MEAN: lambda t: t.mean(axis=0),
            Pooling.LAST_TOKEN: lambda t: t[-1]}[wanted]  # fmt: skip
    np.testing.assert_allclose(got, np.stack([pick(t) for t in rows]), atol=1e-5)
    same = load(built.root, pooling=exported.value)
    np.testing.assert_allclose(same.embed(TEXTS), load(built.root).embed(TEXTS), atol=0)


def test_pooling_override_refused_where_the_graph_cannot_give_it(
    make_artifact: ArtifactFactory,
) -> None:
    with pytest.raises(ManifestError, match=r"inside its graph.*tei-export \.\.\. --pooling cls"):
        load(make_artifact(pooling_in_graph=True).root, pooling="cls")
    with pytest.raises(ManifestError, match="SPLADE"):
        load(make_artifact().root, pooling="splade")
    with pytest.raises(ManifestError, match="SPLADE"):
        load(make_artifact(task=Task.SPARSE, pooling=Pooling.SPLADE).root, pooling="mean")
    with pytest.raises(ManifestError, match="does not apply to a `rerank` artifact"):
        load(make_artifact(task=Task.RERANK, pooling=None).root, pooling="mean")
    with pytest.raises(ManifestError, match="unknown pooling 'max'"):
        load(make_artifact().root, pooling="max")


@pytest.mark.parametrize("labels", [1, 3])
def test_predict_scores(make_artifact: ArtifactFactory, labels: int) -> None:
    built = make_artifact(task=Task.RERANK, pooling=None, labels=labels)
    m = load(built.root)
    pairs = [("cat", "the cat sat"), ("dog", "red blue"), ("query", "w1 w2 w3")]
    raw = m.predict(pairs, raw_scores=True)
    want = np.stack(
        [
            built.tokens(e.ids, e.type_ids).mean(axis=0) @ built.weights.head[:, :labels]
            for e in m.encode(pairs)
        ]
    )
    np.testing.assert_allclose(raw, want, atol=1e-5)
    scores = m.predict(pairs)
    if labels == 1:
        np.testing.assert_allclose(scores, 1 / (1 + np.exp(-want)), atol=1e-6)
    else:
        e = np.exp(want - want.max(axis=1, keepdims=True))
        np.testing.assert_allclose(scores, e / e.sum(axis=1, keepdims=True), atol=1e-6)
    single = m.predict(["the cat sat"])
    assert single.shape == (1, labels)
    np.testing.assert_allclose(m.predict([pairs[1]], raw_scores=True)[0], raw[1], atol=1e-5)


def test_task_mismatch_is_a_validation_error(make_artifact: ArtifactFactory) -> None:
    reranker = load(make_artifact(task=Task.RERANK, pooling=None).root)
    with pytest.raises(ValidationError, match="no embeddings"):
        reranker.embed(["cat"])
    embedder = load(make_artifact().root)
    with pytest.raises(ValidationError, match="classification head"):
        embedder.predict(["cat"])
    with pytest.raises(ValidationError, match="sparse"):
        embedder.embed_sparse(["cat"])


def test_sparse(make_artifact: ArtifactFactory) -> None:
    built = make_artifact(task=Task.SPARSE, pooling=Pooling.SPLADE)
    m = load(built.root)
    texts = ["the cat sat", "w1", "red green blue one"]
    dense = m.forward_sparse(m.encode(texts))
    assert dense.shape == (3, len(VOCAB))
    for row, enc in zip(dense, m.encode(texts), strict=True):
        tok = built.tokens(enc.ids, enc.type_ids)
        want = np.log1p(np.maximum(tok @ built.weights.vocab, 0)).max(axis=0)
        np.testing.assert_allclose(row, want, atol=1e-5)
    vectors = m.embed_sparse(texts, batch_tokens=5)
    for vec, row in zip(vectors, dense, strict=True):
        assert vec.indices == np.flatnonzero(row > 0).tolist()
        np.testing.assert_allclose(vec.values, row[row > 0], atol=1e-5)
    with pytest.raises(ValidationError, match="SPLADE"):
        m.embed(["cat"])


def test_io_binding_path_runs_on_cpu(embed_artifact: Built) -> None:
    """The GPU providers bind outputs on the device; on CPU the same code binds to "cpu"."""
    m = load(embed_artifact.root)
    bound_choice = ProviderChoice(**{**_fields(m.choice), "io_binding": "cpu"})
    backend = OrtBackend(m.artifact_dir / m.variant.file, bound_choice)
    bound = Model(
        manifest=m.manifest,
        variant=m.variant,
        tokenizer=m.tokenizer,
        backend=backend,
        choice=bound_choice,
        max_batch_tokens=m.max_batch_tokens,
        artifact_dir=m.artifact_dir,
    )
    np.testing.assert_allclose(bound.embed(TEXTS), m.embed(TEXTS), atol=1e-6)


def _fields(choice: ProviderChoice) -> dict[str, object]:
    return {f: getattr(choice, f) for f in choice.__struct_fields__}


def test_forward_accepts_prebuilt_encodings(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    enc = Encoding(ids=(2, 8, 3), type_ids=(0, 0, 0), offsets=((0, 0),) * 3)
    np.testing.assert_allclose(m.forward_embed([enc]), m.forward_embed(m.encode(["cat"])))


def test_dimension_follows_the_dense_layer(make_artifact: ArtifactFactory) -> None:
    m = load(make_artifact(pooling_in_graph=True).root)
    assert m.dimension == 6
    assert m.embed([]).shape == (0, 6)


def test_backend_forward_dispatches_by_output(embed_artifact: Built) -> None:
    m = load(embed_artifact.root)
    encs = m.encode(TEXTS)
    pooled = m.forward(encs, Output.EMBEDDING)
    np.testing.assert_array_equal(np.stack(pooled), m.forward_embed(encs))
    tokens = m.forward(encs, Output.TOKENS)
    for got, want in zip(tokens, m.forward_tokens(encs), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValidationError):
        m.forward(encs, Output.LOGITS)


def test_several_models_each_load_their_own_dtype(make_artifact: ArtifactFactory) -> None:
    """An int8 embedder beside a reranker with no int8 graph: --dtype given per model, in
    --model-id order, loads each as asked (one --dtype int8 for both fails the start)."""
    from tei_runtime.manifest import Precision, Task
    from tei_serve.cli import ModelLoadError, load_models
    from tei_serve.settings import load_settings

    embedder = make_artifact(precisions=(Precision.FP32, Precision.INT8))
    reranker = make_artifact(task=Task.RERANK, labels=1)
    ids = ["--model-id", str(embedder.root), "--model-id", str(reranker.root)]
    loaded = load_models(load_settings([*ids, "--dtype", "int8", "auto"], env={}))
    assert [m.precision for m, _ in loaded] == [Precision.INT8, Precision.FP32]
    with pytest.raises(ModelLoadError, match=rf"model {reranker.root} could not load: .*int8"):
        load_models(load_settings([*ids, "--dtype", "int8"], env={}))
