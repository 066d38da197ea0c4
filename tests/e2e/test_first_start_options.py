"""`tei-serve` exporting checkpoints on first start with the exporter's choices, per model:
`--adapter` merges jina-embeddings-v3's task LoRA (its instruction becomes the default prompt)
and `--dense-path` picks a stella-style `2_Dense_<dims>` module, as TEI's router does. One
process serves both; each answers over HTTP what the PyTorch reference computes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from support.parity_inputs import cosines, prefixed_mean_reference
from support.processes import free_port, wait_for_health
from support.tiny_encoders import JINA_V3_INSTRUCTIONS, build_jina_v3_published
from support.tiny_models import add_dense_module, build_checkpoint
from tei_runtime.manifest import read_manifest

pytestmark = pytest.mark.slow

TEI_SERVE = Path(sys.executable).with_name("tei-serve")
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog", "numbers 1234567890"]
ADAPTER = "retrieval.query"
PASSAGE = "retrieval.passage"


def _stella_reference(checkpoint: Path, dense: str, scratch: Path) -> np.ndarray:
    """sentence-transformers with modules.json pointing at the chosen Dense module."""
    from sentence_transformers import SentenceTransformer

    chosen = shutil.copytree(checkpoint, scratch)
    modules = json.loads((chosen / "modules.json").read_text())
    for module in modules:
        if module["type"].endswith("Dense"):
            module["path"] = dense
    (chosen / "modules.json").write_text(json.dumps(modules))
    st = SentenceTransformer(str(chosen), device="cpu")
    return np.concatenate([st.encode([t], normalize_embeddings=True) for t in TEXTS])


def _env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment with an empty hub cache, offline, and none of the flags these
    tests pass set from outside."""
    env = {**os.environ, "HUGGINGFACE_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    for name in ("MODEL_ID", "ADAPTER", "DENSE_PATH", "TASK", "POOLING"):
        env.pop(name, None)
    return env


def _start(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """`tei-serve ARGS` on a free loopback port, fp32: (process, base URL)."""
    port = free_port()
    proc = subprocess.Popen(
        [str(TEI_SERVE), *args, "--port", str(port), "--hostname", "127.0.0.1",
         "--prometheus-port", "0", "--dtype", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(tmp_path),
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _failed_start(tmp_path: Path, args: list[str]) -> str:
    """`tei-serve ARGS`, which must fail to start: its stderr (one line, no traceback)."""
    done = subprocess.run(
        [str(TEI_SERVE), *args, "--port", str(free_port()), "--prometheus-port", "0"],
        capture_output=True, text=True, env=_env(tmp_path), timeout=600,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr


def test_adapter_and_dense_path_per_model_on_first_start(tmp_path: Path) -> None:
    jina, _, with_adapter = build_jina_v3_published(tmp_path / "jina")
    stella = build_checkpoint(tmp_path / "stella", "bert", st_pooling="mean", dense_out=16)
    add_dense_module(stella, "2_Dense_8", 8)
    references = {
        name: prefixed_mean_reference(
            jina, with_adapter(adapter), JINA_V3_INSTRUCTIONS[adapter], TEXTS
        )
        for name, adapter in (("query", ADAPTER), ("passage", PASSAGE))
    }
    references["stella"] = _stella_reference(stella, "2_Dense_8", tmp_path / "stella-8")

    proc, url = _start(tmp_path, [
        # The same checkpoint twice, one server name per adapter: retrieval's two sides.
        "--model-id", str(jina), str(jina), str(stella),
        "--served-model-name", "query", "passage", "stella",
        "--adapter", ADAPTER, PASSAGE, "none", "--dense-path", "auto", "auto", "2_Dense_8",
    ])  # fmt: skip
    try:
        wait_for_health(proc, url, timeout=900)
        with httpx.Client(base_url=url, timeout=60) as client:
            served = {}
            for name in references:
                r = client.post("/embed", json={"inputs": TEXTS, "model": name})
                assert r.status_code == 200, r.text
                served[name] = np.asarray(r.json(), dtype=np.float32)
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    # Each adapter's instruction is its default prompt: the plain texts come back prompted.
    assert served["stella"].shape == (len(TEXTS), 8)
    for name, reference in references.items():
        assert cosines(served[name], reference).min() >= 0.99999, name
    assert cosines(served["query"], served["passage"]).min() < 0.999
    folders = [p for p in (tmp_path / "cache" / "tei-onnx").iterdir() if p.is_dir()]
    adapters = sorted(str(read_manifest(p).source.adapter) for p in folders)
    assert adapters == ["None", PASSAGE, ADAPTER]


def test_adapter_asked_of_a_checkpoint_without_adapters_fails_the_start(tmp_path: Path) -> None:
    checkpoint = build_checkpoint(tmp_path / "plain", "bert", st_pooling="mean")
    stderr = _failed_start(tmp_path, ["--model-id", str(checkpoint), "--adapter", ADAPTER])
    assert f"--adapter {ADAPTER}" in stderr and "has no task LoRA adapters" in stderr


def test_pooling_overrides_an_artifacts_pooling_as_tei(
    tmp_path: Path, minilm_artifact: Path, minilm_checkpoint: Path
) -> None:
    """TEI's `--pooling cls` on all-MiniLM-L6-v2 (mean in its sentence-transformers config):
    the served vectors are the normalized first-token hidden states of the PyTorch model."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_checkpoint))
    model = AutoModel.from_pretrained(str(minilm_checkpoint)).eval()
    with torch.no_grad():
        rows = [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0, 0] for t in TEXTS]
    reference = torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()

    proc, url = _start(tmp_path, ["--model-id", str(minilm_artifact), "--pooling", "cls"])
    try:
        wait_for_health(proc, url, timeout=300)
        with httpx.Client(base_url=url, timeout=60) as client:
            r = client.post("/embed", json={"inputs": TEXTS})
            assert r.status_code == 200, r.text
            served = np.asarray(r.json(), dtype=np.float32)
            info = client.get("/info").json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert info["model_type"] == {"embedding": {"pooling": "cls"}}
    assert cosines(served, reference).min() >= 0.99999


def test_pooling_an_artifact_cannot_give_fails_the_start(
    tmp_path: Path, tiny_splade_artifact: Path
) -> None:
    stderr = _failed_start(tmp_path, ["--model-id", str(tiny_splade_artifact), "--pooling", "mean"])
    assert "tei-export ... --pooling mean" in stderr, stderr[-3000:]


def _embed_once(tmp_path: Path, checkpoint: Path) -> tuple[np.ndarray, str]:
    """Start `tei-serve --model-id CHECKPOINT` on the test's hub cache, embed TEXTS, stop:
    (vectors, the server's log)."""
    proc, url = _start(tmp_path, ["--model-id", str(checkpoint)])
    try:
        wait_for_health(proc, url, timeout=600)
        r = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        log, _ = proc.communicate(timeout=60)
    return np.asarray(r.json(), dtype=np.float32), log


def _st_reference(checkpoint: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(checkpoint), device="cpu")
    return np.concatenate([st.encode([t], normalize_embeddings=True) for t in TEXTS])


def test_checkpoint_saved_again_is_exported_again_on_the_next_start(tmp_path: Path) -> None:
    """A model fine-tuned and saved into the same folder: the next start serves its new
    vectors, not the first start's cached export; a start with nothing changed reuses it."""
    checkpoint = build_checkpoint(tmp_path / "mine", "bert", st_pooling="mean", seed=0)
    first, _ = _embed_once(tmp_path, checkpoint)
    assert cosines(first, _st_reference(checkpoint)).min() >= 0.99999

    build_checkpoint(tmp_path / "mine", "bert", st_pooling="mean", seed=1)
    second, log = _embed_once(tmp_path, checkpoint)
    assert "the checkpoint changed since" in log, log[-3000:]
    assert cosines(second, _st_reference(checkpoint)).min() >= 0.99999
    assert cosines(first, second).min() < 0.99

    third, log = _embed_once(tmp_path, checkpoint)
    assert "exporting" not in log, log[-3000:]
    np.testing.assert_array_equal(third, second)
