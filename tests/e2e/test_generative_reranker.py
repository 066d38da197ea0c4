"""A generative reranker (Qwen3-Reranker's layout, tiny random weights) exported with
`--task rerank` and checked against the PyTorch computation its model card does: pairs put
into the prompt, a left-padded batch, the "yes" and "no" logits at the last position. Then
served over HTTP on loopback: /rerank and /predict, raw scores, the per-request instruction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.loopback_server import Running, start
from support.processes import free_port, wait_for_health
from support.tiny_rerankers import build_qwen3_reranker
from tei_runtime.manifest import Precision, Task, read_manifest

pytestmark = pytest.mark.slow

# The Qwen3-Reranker model card's prompt, written out here (not read from the model card TOML)
# so that the test checks the card too.
PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "What is the capital of China?"
DOCUMENTS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other. " * 2,
    "yes",
    "no no no, the answer is elsewhere " * 30,  # longer than the model: truncated
]
OTHER_INSTRUCTION = "Given a question, find the passage that names a city"
TOLERANCE = 1e-4


def _format(instruction: str, query: str, doc: str) -> str:
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"


def card_logit_difference(
    checkpoint: Path, pairs: list[tuple[str, str]], instruction: str, max_length: int
) -> np.ndarray:
    """The model card's computation, batch and all: yes minus no at the last position (its
    log_softmax over [no, yes], exponentiated, is the sigmoid of this)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(checkpoint), padding_side="left")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32
    ).eval()
    prefix_ids = tok.encode(PREFIX, add_special_tokens=False)
    suffix_ids = tok.encode(SUFFIX, add_special_tokens=False)
    encoded = tok(
        [_format(instruction, q, d) for q, d in pairs], padding=False,
        truncation="longest_first", return_attention_mask=False,
        max_length=max_length - len(prefix_ids) - len(suffix_ids),
    )  # fmt: skip
    encoded["input_ids"] = [prefix_ids + ids + suffix_ids for ids in encoded["input_ids"]]
    batch = tok.pad(encoded, padding=True, return_tensors="pt")
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    with torch.no_grad():
        last = model(**batch).logits[:, -1, :]
    pair = torch.stack([last[:, no], last[:, yes]], dim=1)
    probability = torch.nn.functional.log_softmax(pair, dim=1)[:, 1].exp()
    difference = (last[:, yes] - last[:, no]).numpy()
    # The card's relevance is the sigmoid of the difference (checked, not assumed).
    np.testing.assert_allclose(probability.numpy(), 1 / (1 + np.exp(-difference)), atol=1e-6)
    return np.asarray(difference, dtype=np.float32)


class Exported:
    def __init__(self, checkpoint: Path, artifact: Path) -> None:
        self.checkpoint = checkpoint
        self.artifact = artifact


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    from tei_export.api import export_model

    root = tmp_path_factory.mktemp("generative-reranker")
    checkpoint = build_qwen3_reranker(root / "checkpoint")
    artifact = export_model(
        str(checkpoint), root / "artifact", task=Task.RERANK,
        precisions=[Precision.FP32, Precision.INT8], quiet=True,
    )  # fmt: skip
    return Exported(checkpoint, artifact)


@pytest.fixture(scope="session")
def served(exported: Exported) -> Iterator[Running]:
    import tei_runtime

    running = start(tei_runtime.load(exported.artifact, device="cpu", dtype="float32"))
    yield running
    running.stop()


def test_manifest_holds_the_prompt_and_the_graph_only_the_difference(exported: Exported) -> None:
    import onnx
    import transformers

    manifest = read_manifest(exported.artifact)
    assert manifest.task is Task.RERANK
    assert manifest.architecture == "Qwen3ForCausalLM"
    assert manifest.generative_rerank is not None
    prompt = manifest.generative_rerank.prompt
    tok = transformers.AutoTokenizer.from_pretrained(str(exported.checkpoint))
    assert (prompt.prefix, prompt.suffix) == (PREFIX, SUFFIX)
    assert prompt.default_instruction == DEFAULT_INSTRUCTION
    assert prompt.template.format(instruction="I", query="Q", document="D") == _format(
        "I", "Q", "D"
    )
    assert prompt.yes_token_id == tok.convert_tokens_to_ids("yes")
    assert prompt.no_token_id == tok.convert_tokens_to_ids("no")
    assert manifest.labels == {0: "yes"}
    assert manifest.io.outputs == ["logits"]
    vocab = len(tok)
    for variant in manifest.variants:
        graph = onnx.load(str(exported.artifact / variant.file)).graph
        [output] = graph.output
        dims = [d.dim_value or d.dim_param for d in output.type.tensor_type.shape.dim]
        assert dims == ["batch", 1], variant.name
        # The LM head was cut to two rows before the matmul: the one vocabulary-wide weight
        # left is the input embedding table, read by a Gather (tied to the LM head here).
        lookups = {node.input[0] for node in graph.node if node.op_type == "Gather"}
        wide = [i.name for i in graph.initializer if vocab in i.dims]
        assert wide and set(wide) <= lookups, (variant.name, wide)
        assert any(sorted(i.dims) == [2, 32] for i in graph.initializer), variant.name


@pytest.mark.parametrize("instruction", [None, OTHER_INSTRUCTION])
def test_runtime_matches_the_model_card(exported: Exported, instruction: str | None) -> None:
    import tei_runtime

    model = tei_runtime.load(exported.artifact, device="cpu", dtype="float32")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    reference = card_logit_difference(
        exported.checkpoint, pairs, instruction or DEFAULT_INSTRUCTION, model.max_input_length
    )
    raw = model.predict(pairs, raw_scores=True, instruction=instruction)[:, 0]
    scores = model.predict(pairs, instruction=instruction)[:, 0]
    error = float(np.abs(raw - reference).max())
    print(f"fp32 max abs error of yes-no vs the model card: {error:.3g}; raw {raw}")
    assert error <= TOLERANCE
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-reference)), atol=TOLERANCE)
    assert np.ptp(reference) > 1e-3, "the pairs must not all score alike"


def test_int8_variant_follows(exported: Exported) -> None:
    import tei_runtime

    fp32 = tei_runtime.load(exported.artifact, device="cpu", dtype="float32")
    int8 = tei_runtime.load(exported.artifact, device="cpu", dtype="int8")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    error = float(np.abs(int8.predict(pairs) - fp32.predict(pairs)).max())
    print(f"int8 vs fp32 max abs error of the relevance: {error:.3g}")
    assert error < 0.05


def _rerank(served: Running, **body: Any) -> dict[int, float]:
    r = served.client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, **body})
    assert r.status_code == 200, r.text
    return {rank["index"]: rank["score"] for rank in r.json()}


def test_served_rerank_and_predict(exported: Exported, served: Running) -> None:
    pairs = [(QUERY, d) for d in DOCUMENTS]
    limit = served.model.max_input_length
    reference = card_logit_difference(exported.checkpoint, pairs, DEFAULT_INSTRUCTION, limit)
    raw = _rerank(served, raw_scores=True)
    assert np.abs(np.array([raw[i] for i in range(len(DOCUMENTS))]) - reference).max() <= TOLERANCE
    default = _rerank(served)
    sigmoid = 1 / (1 + np.exp(-reference))
    assert np.abs(np.array([default[i] for i in range(len(DOCUMENTS))]) - sigmoid).max() <= 1e-4

    r = served.client.post("/predict", json={"inputs": [QUERY, DOCUMENTS[0]], "raw_scores": True})
    assert r.status_code == 200, r.text
    [prediction] = r.json()
    assert prediction["label"] == "yes"
    assert abs(prediction["score"] - reference[0]) <= TOLERANCE

    info = served.client.get("/info").json()
    assert info["model_type"] == {"reranker": {"id2label": {"0": "yes"}, "label2id": {"yes": 0}}}
    assert served.client.get("/health").status_code == 200


def test_served_instruction_changes_the_score(exported: Exported, served: Running) -> None:
    pairs = [(QUERY, d) for d in DOCUMENTS]
    limit = served.model.max_input_length
    reference = card_logit_difference(exported.checkpoint, pairs, OTHER_INSTRUCTION, limit)
    default = _rerank(served, raw_scores=True)
    other = _rerank(served, raw_scores=True, instruction=OTHER_INSTRUCTION)
    assert max(abs(other[i] - default[i]) for i in other) > 1e-3
    assert max(abs(other[i] - float(reference[i])) for i in other) <= TOLERANCE

    r = served.client.post(
        "/predict",
        json={"inputs": [[QUERY, DOCUMENTS[0]]], "raw_scores": True,
              "instruction": OTHER_INSTRUCTION},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert abs(r.json()[0][0]["score"] - reference[0]) <= TOLERANCE


def test_served_refuses_a_single_text(served: Running) -> None:
    r = served.client.post("/predict", json={"inputs": "just one text"})
    assert r.status_code == 422
    assert "pairs" in r.json()["error"]


def test_grpc_rerank_goes_through_the_same_core(
    exported: Exported, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from grpc_support import RunningGrpc, generate_client

    import tei_runtime
    from tei_serve.serving import Serving
    from tei_serve.settings import Settings

    pb, stubs = generate_client(tmp_path_factory.mktemp("tei-client"))
    model = tei_runtime.load(exported.artifact, device="cpu", dtype="float32")
    settings = Settings(hostname="127.0.0.1", port=0, prometheus_port=0,
                        tokenization_workers=2, grpc=True)  # fmt: skip
    running = RunningGrpc(Serving(settings=settings, model=model, model_id="tiny-reranker"))
    rerank, predict = stubs.RerankStub(running.channel), stubs.PredictStub(running.channel)
    # TEI's proto has no instruction field: call metadata carries it (`-bin` for non-ASCII)
    other = [("instruction", OTHER_INSTRUCTION)]
    non_ascii = "Étant donné une question, trouvez le passage qui nomme une ville"
    try:
        ranks = rerank.Rerank(
            pb.RerankRequest(query=QUERY, texts=DOCUMENTS, raw_scores=True, truncate=True)
        ).ranks
        ranks_other = rerank.Rerank(
            pb.RerankRequest(query=QUERY, texts=DOCUMENTS, raw_scores=True, truncate=True),
            metadata=other,
        ).ranks
        streamed_other = rerank.RerankStream(
            iter([pb.RerankStreamRequest(query=QUERY, text=d, raw_scores=True, truncate=True)
                  for d in DOCUMENTS]),
            metadata=other,
        ).ranks  # fmt: skip
        pair_non_ascii = predict.PredictPair(
            pb.PredictPairRequest(inputs=[QUERY, DOCUMENTS[0]], raw_scores=True),
            metadata=[("instruction-bin", non_ascii.encode())],
        ).predictions
    finally:
        running.stop()
    pairs = [(QUERY, d) for d in DOCUMENTS]
    limit = model.max_input_length
    reference = card_logit_difference(exported.checkpoint, pairs, DEFAULT_INSTRUCTION, limit)
    got = {k.index: k.score for k in ranks}
    assert max(abs(got[i] - float(reference[i])) for i in got) <= TOLERANCE
    reference_other = card_logit_difference(exported.checkpoint, pairs, OTHER_INSTRUCTION, limit)
    for answered in (ranks_other, streamed_other):
        got = {k.index: k.score for k in answered}
        assert max(abs(got[i] - float(reference_other[i])) for i in got) <= TOLERANCE
    [reference_non_ascii] = card_logit_difference(
        exported.checkpoint, pairs[:1], non_ascii, limit
    )
    assert abs(pair_non_ascii[0].score - float(reference_non_ascii)) <= TOLERANCE
    assert abs(pair_non_ascii[0].score - float(reference[0])) > 1e-3


def test_tei_serve_exports_a_generative_reranker_on_first_start(
    exported: Exported, tmp_path: Path
) -> None:
    """`tei-serve --model-id <checkpoint> --task rerank`: the exporter runs on first start with
    the task (a causal LM would otherwise export as a last-token embedder)."""
    import os
    import subprocess
    import sys

    import httpx

    port = free_port()
    env = {**os.environ, "HUGGINGFACE_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    env.pop("MODEL_ID", None)
    serve = Path(sys.executable).with_name("tei-serve")
    proc = subprocess.Popen(
        [str(serve), "--model-id", str(exported.checkpoint), "--task", "rerank", "--port",
         str(port), "--hostname", "127.0.0.1", "--prometheus-port", "0", "--dtype", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(proc, url, timeout=600)
        info = httpx.get(f"{url}/info").json()
        assert "reranker" in info["model_type"], info
        r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCUMENTS[:2],
                                              "raw_scores": True}, timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        got = {rank["index"]: rank["score"] for rank in r.json()}
        pairs = [(QUERY, d) for d in DOCUMENTS[:2]]
        reference = card_logit_difference(
            exported.checkpoint, pairs, DEFAULT_INSTRUCTION, info["max_input_length"]
        )
        assert max(abs(got[i] - float(reference[i])) for i in got) <= TOLERANCE
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    [folder] = [p for p in (tmp_path / "cache" / "tei-onnx").iterdir() if p.is_dir()]
    assert read_manifest(folder).task is Task.RERANK
