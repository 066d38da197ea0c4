"""gRPC against its HTTP twin on real exported artifacts (all-MiniLM-L6-v2, tiny reranker,
classifier, SPLADE), and `tei-serve --grpc` as a real process answering a client generated
from TEI's proto, then stopped by SIGTERM (exit 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_support import PROTO, RunningGrpc, generate_client

import tei_runtime
from support.loopback_server import Running, start
from support.processes import free_port
from tei_serve.serving import Serving
from tei_serve.settings import Settings

pytestmark = pytest.mark.slow

TEXTS = ["What is Deep Learning?", "Paris is the capital of France. " * 40, "a", "Grüß Gott 👋"]
TEI_SERVE = Path(sys.executable).with_name("tei-serve")


class Twins:
    """One model served twice: HTTP (uvicorn) and gRPC, each with its own serving core."""

    def __init__(self, artifact: Path) -> None:
        model = tei_runtime.load(artifact)
        self.http: Running = start(model)
        settings = Settings(hostname="127.0.0.1", port=0, prometheus_port=0,
                            tokenization_workers=2, grpc=True)  # fmt: skip
        self.grpc = RunningGrpc(Serving(settings=settings, model=model,
                                        model_id=model.manifest.source.model_id))  # fmt: skip

    def stop(self) -> None:
        self.grpc.stop()
        self.http.stop()


def _twins(artifact: Path) -> Iterator[Twins]:
    t = Twins(artifact)
    yield t
    t.stop()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return generate_client(tmp_path_factory.mktemp("tei-client"))


@pytest.fixture(scope="module")
def minilm(minilm_artifact: Path) -> Iterator[Twins]:
    yield from _twins(minilm_artifact)


def test_minilm_embed_rpcs_match_http(minilm: Twins, client: Any) -> None:
    pb, stubs = client
    embed = stubs.EmbedStub(minilm.grpc.channel)
    post = minilm.http.client.post
    http = np.asarray(post("/embed", json={"inputs": TEXTS}).json())
    unary = np.asarray([embed.Embed(pb.EmbedRequest(inputs=t, truncate=True)).embeddings
                        for t in TEXTS])  # fmt: skip
    stream = np.asarray([r.embeddings for r in embed.EmbedStream(
        iter([pb.EmbedRequest(inputs=t, truncate=True) for t in TEXTS]))])
    assert unary.shape == stream.shape == http.shape == (4, 384)
    assert np.allclose(unary, http, atol=1e-5) and np.allclose(stream, http, atol=1e-5)
    raw = embed.Embed(pb.EmbedRequest(inputs=TEXTS[0], normalize=False, dimensions=64))
    raw_http = post("/embed", json={"inputs": TEXTS[0], "normalize": False, "dimensions": 64})
    assert np.allclose(raw.embeddings, raw_http.json()[0], atol=1e-5)
    tokens = embed.EmbedAll(pb.EmbedAllRequest(inputs="Hello world"))
    tokens_http = np.asarray(post("/embed_all", json={"inputs": "Hello world"}).json()[0])
    assert np.allclose([t.embeddings for t in tokens.token_embeddings], tokens_http, atol=1e-5)
    one = embed.Embed(pb.EmbedRequest(inputs=TEXTS[3]))
    headers = post("/embed", json={"inputs": TEXTS[3]}).headers
    assert one.metadata.compute_chars == len(TEXTS[3]) == int(headers["x-compute-characters"])
    assert one.metadata.compute_tokens == int(headers["x-compute-tokens"])


def test_minilm_info_tokenize_decode_match_http(minilm: Twins, client: Any) -> None:
    pb, stubs = client
    post = minilm.http.client.post
    info = stubs.InfoStub(minilm.grpc.channel).Info(pb.InfoRequest())
    info_http = minilm.http.client.get("/info").json()
    for field in ("model_id", "model_dtype", "max_input_length", "max_batch_tokens",
                  "max_client_batch_size", "max_concurrent_requests", "version"):
        assert getattr(info, field) == info_http[field], field
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    tok = stubs.TokenizeStub(minilm.grpc.channel)
    tokens = tok.Tokenize(pb.EncodeRequest(inputs=TEXTS[3], add_special_tokens=True)).tokens
    tokens_http = post("/tokenize", json={"inputs": TEXTS[3]}).json()[0]
    assert [(t.id, t.text, t.special) for t in tokens] == [
        (t["id"], t["text"], t["special"]) for t in tokens_http]
    assert [t.start if t.HasField("start") else None for t in tokens] == [
        t["start"] for t in tokens_http]
    ids = [t.id for t in tokens]
    text = tok.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True)).text
    assert text == post("/decode", json={"ids": ids}).json()[0]
    code = None
    try:  # ids no vocabulary holds: an answer or a status, never a crash
        tok.Decode(pb.DecodeRequest(ids=[2**32 - 1]))
    except grpc.RpcError as e:
        code = e.code()
    assert code in (None, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)


@pytest.fixture(scope="module")
def reranker(tiny_reranker_artifact: Path) -> Iterator[Twins]:
    yield from _twins(tiny_reranker_artifact)


@pytest.fixture(scope="module")
def classifier(tiny_classifier_artifact: Path) -> Iterator[Twins]:
    yield from _twins(tiny_classifier_artifact)


@pytest.fixture(scope="module")
def splade(tiny_splade_artifact: Path) -> Iterator[Twins]:
    yield from _twins(tiny_splade_artifact)


def test_rerank_predict_sparse_match_http(
    reranker: Twins, classifier: Twins, splade: Twins, client: Any
) -> None:
    pb, stubs = client
    texts = ["Deep learning is a subfield of ML", "Paris is in France", "cats"]
    ranks = stubs.RerankStub(reranker.grpc.channel).Rerank(
        pb.RerankRequest(query="What is deep learning?", texts=texts, return_text=True)).ranks
    ranks_http = reranker.http.client.post("/rerank", json={
        "query": "What is deep learning?", "texts": texts, "return_text": True}).json()
    assert [(k.index, k.text) for k in ranks] == [(k["index"], k["text"]) for k in ranks_http]
    assert np.allclose([k.score for k in ranks], [k["score"] for k in ranks_http], atol=1e-5)
    streamed = stubs.RerankStub(reranker.grpc.channel).RerankStream(iter(
        [pb.RerankStreamRequest(query="What is deep learning?", text=t) for t in texts]))
    assert np.allclose(sorted(k.score for k in streamed.ranks),
                       sorted(k["score"] for k in ranks_http), atol=1e-5)  # fmt: skip
    preds = stubs.PredictStub(classifier.grpc.channel).Predict(pb.PredictRequest(inputs="hi"))
    preds_http = classifier.http.client.post("/predict", json={"inputs": "hi"}).json()
    assert [p.label for p in preds.predictions] == [p["label"] for p in preds_http]
    assert np.allclose([p.score for p in preds.predictions], [p["score"] for p in preds_http],
                       atol=1e-5)  # fmt: skip
    sparse = stubs.EmbedStub(splade.grpc.channel).EmbedSparse(
        pb.EmbedSparseRequest(inputs="hello world"))
    sparse_http = splade.http.client.post("/embed_sparse", json={"inputs": "hello world"}).json()
    assert [v.index for v in sparse.sparse_embeddings] == [v["index"] for v in sparse_http[0]]
    assert np.allclose([v.value for v in sparse.sparse_embeddings],
                       [v["value"] for v in sparse_http[0]], atol=1e-5)  # fmt: skip


# -- the real CLI process and a client that knows nothing of tei-onnx -----------------------------

CLIENT = textwrap.dedent('''
    """A client of TEI's gRPC API from TEI's proto alone: tei_pb2 / tei_pb2_grpc, grpc."""
    import json, sys
    import grpc
    import tei_pb2, tei_pb2_grpc

    channel = grpc.insecure_channel(sys.argv[1])
    auth = [("authorization", "Bearer s3cret")]
    info = tei_pb2_grpc.InfoStub(channel).Info(tei_pb2.InfoRequest(), metadata=auth)
    embed = tei_pb2_grpc.EmbedStub(channel)
    texts = json.loads(sys.argv[2])
    one = embed.Embed(tei_pb2.EmbedRequest(inputs=texts[0]), metadata=auth)
    many = embed.EmbedStream(iter([tei_pb2.EmbedRequest(inputs=t, truncate=True) for t in texts]),
                             metadata=auth)
    tokens = tei_pb2_grpc.TokenizeStub(channel).Tokenize(
        tei_pb2.EncodeRequest(inputs=texts[0], add_special_tokens=True), metadata=auth)
    print(json.dumps({"model_type": info.model_type, "one": list(one.embeddings),
                      "many": [list(m.embeddings) for m in many],
                      "tokens": [t.text for t in tokens.tokens]}))
''')


def test_tei_serve_grpc_process_with_an_unmodified_generated_client(
    minilm_artifact: Path, tmp_path: Path
) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}",
                    f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", PROTO.name],
                   check=True)  # fmt: skip
    (tmp_path / "client.py").write_text(CLIENT)
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "API_KEY": "s3cret", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [str(TEI_SERVE), "--grpc", "--model-id", str(minilm_artifact), "--hostname",
         "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics_port),
         "--uds-path", "/tmp/unused"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "tei-serve --grpc did not become healthy"
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == \
                            health_pb2.HealthCheckResponse.SERVING:  # fmt: skip
                        break
                except grpc.RpcError:
                    time.sleep(0.2)
        run = subprocess.run(
            [sys.executable, str(tmp_path / "client.py"), target, json.dumps(TEXTS)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        answer = json.loads(run.stdout)
        direct = tei_runtime.load(minilm_artifact).embed(TEXTS)
        assert answer["model_type"] == 0  # MODEL_TYPE_EMBEDDING
        assert np.allclose(answer["many"], direct, atol=1e-5)
        assert np.allclose(answer["one"], direct[0], atol=1e-5)
        assert answer["tokens"][0] == "[CLS]" and answer["tokens"][-1] == "[SEP]"
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert 'te_request_success{method="single"} 5' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "--uds-path is accepted for compatibility" in out
    assert "shutting down" in out
