"""A long-context decoder served by a real `tei-serve` whose host has little memory left: an
input whose unfused attention would pass the capped onnxruntime arena gets 424, short requests
before and after it are answered, `/health` stays 200 and the process lives on. Without the
cap the kernel's OOM killer ends the process (the Qwen3-0.6B shape at 16384 tokens did, during
its warm-up, on a 24 GB host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support.processes import free_port, wait_for_health
from support.tiny_models import build_checkpoint

pytestmark = pytest.mark.slow

LONG_CONTEXT = 16384
# What the server's host says it has left: the arena may hold 90% of it.
AVAILABLE = 400 * 2**20
# The server's own entry point, with the host's memory reading replaced first.
SERVE = """
import sys
import tei_runtime.session
tei_runtime.session.memory_available = lambda: int(sys.argv[1])
from tei_serve.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _long_context(checkpoint: Path) -> Path:
    """The tiny checkpoint's config, tokenizer and sentence-transformers limits raised."""
    for name, key in (("config.json", "max_position_embeddings"),
                      ("tokenizer_config.json", "model_max_length"),
                      ("sentence_bert_config.json", "max_seq_length")):  # fmt: skip
        path = checkpoint / name
        data = json.loads(path.read_text())
        data[key] = LONG_CONTEXT
        path.write_text(json.dumps(data))
    return checkpoint


def test_an_input_past_the_memory_cap_fails_alone(tmp_path: Path) -> None:
    from tei_export.api import export_model

    checkpoint = _long_context(
        build_checkpoint(tmp_path / "qwen3", "qwen3", st_pooling="last-token"))
    artifact = export_model(str(checkpoint), tmp_path / "artifact", quiet=True,
                            precisions=["fp32"])  # fmt: skip
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for name in ("MODEL_ID", "MAX_BATCH_TOKENS", "DTYPE"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(AVAILABLE), "--model-id", str(artifact),
         "--port", str(port), "--hostname", "127.0.0.1", "--prometheus-port", "0",
         "--dtype", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(proc, url, timeout=300)
        with httpx.Client(base_url=url, timeout=120) as client:
            info = client.get("/info").json()
            assert info["max_input_length"] == LONG_CONTEXT
            short = client.post("/embed", json={"inputs": "hello world"})
            assert short.status_code == 200
            # ~12000 tokens: each layer's scores alone are 4 heads x 12000^2 floats, 2.3 GB
            long = client.post("/embed", json={"inputs": "hello world " * 6000})
            assert long.status_code == 424, long.text
            body = long.json()
            assert body["error_type"] == "Backend"
            assert body["error"].startswith("Backend error: ")
            assert "needs more memory than the 0.4 GiB" in body["error"]
            assert client.get("/health").status_code == 200
            again = client.post("/embed", json={"inputs": "hello world"})
            assert again.status_code == 200 and again.json() == short.json()
        assert proc.poll() is None
    finally:
        proc.terminate()
        output = proc.communicate(timeout=60)[0] or ""
    assert "refused" in output  # the worker's warning line names what happened
