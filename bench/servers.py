"""HTTP engines: how each server is started, how it is asked, and how it is stopped.

Cold start = Popen to the first 200 on the embed route with one text, polled every 50 ms
(the poll interval bounds its resolution). infinity runs from its own venv; its optimum
engine needs an ONNX file in the model folder, made once per checkpoint before any timing
(as a hub repo's onnx/model.onnx would already be there), see `infinity_model_dir`.
"""

from __future__ import annotations

import hashlib
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.config import dtype_of
from bench.grpc_client import GrpcClient, GrpcUnavailableError
from bench.http_client import Client, openai_client, tei_client
from bench.measure import Usage
from bench.procs import clean_env, cpu_seconds, peak_rss_mb

REPO = Path(__file__).resolve().parent.parent
INFINITY_VENV = REPO / "bench" / ".venv-infinity"
SERVED_NAME = "minilm"


class EngineUnavailableError(RuntimeError):
    """The engine cannot run here; str() is the reason, recorded in the results."""


@dataclass
class Server:
    engine: str
    proc: subprocess.Popen[bytes]
    client: Client | GrpcClient
    log: Path
    cold_start_s: float
    metrics_port: int | None = None  # tei-serve's Prometheus port (infinity: None)

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb(self.proc.pid)

    def usage(self) -> Usage:
        """The model's busy seconds so far (tei-serve's `tei_onnx_model_busy_seconds`) and
        the server's CPU seconds."""
        busy = None
        if self.metrics_port is not None:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as answer:
                text = answer.read().decode()
            found = re.search(r"^tei_onnx_model_busy_seconds (\S+)$", text, re.MULTILINE)
            busy = float(found.group(1)) if found else 0.0  # absent until the first forward
        return Usage(model_busy_s=busy, cpu_s=cpu_seconds(self.proc.pid))

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(log: Path, lines: int = 12) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def infinity_model_dir(checkpoint: Path, cache: Path, *, onnx: bool = True) -> Path:
    """checkpoint files (symlinked) + model.onnx exported by optimum in infinity's venv (with
    `onnx`; without it the torch engine's folder alone, for a model the optimum engine cannot
    pool).

    Two workarounds for infinity 0.0.78 with optimum 2.1, both found by running it:
    - it passes a local folder's ONNX path to optimum as an absolute `file_name`, which
      optimum matches against bare file names only ("Could not find any ONNX files with
      target file name /.../onnx/model.onnx"), so the server is started with cwd = this
      folder, `--model-id .`, and model.onnx at the top;
    - optimum's sentence-transformers export names its output `token_embeddings`, infinity
      reads `last_hidden_state` (KeyError), so the export is `--library-name transformers`.
    """
    key = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:12]
    out = cache / f"infinity-{checkpoint.name}-{key}{'' if onnx else '-torch'}"
    if (out / ("model.onnx" if onnx else "modules.json")).exists():
        return out
    cli = INFINITY_VENV / "bin" / "optimum-cli"
    if not cli.exists():
        raise EngineUnavailableError(f"no infinity venv: {cli} missing (see bench/README.md)")
    tmp = out.with_name(out.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    tmp.mkdir(parents=True)
    for f in checkpoint.iterdir():
        (tmp / f.name).symlink_to(f.resolve())
    if not onnx:
        tmp.rename(out)
        return out
    onnx_dir = tmp / ".onnx-export"
    done = subprocess.run(
        [str(cli), "export", "onnx", "--model", str(checkpoint), "--task", "feature-extraction",
         "--library-name", "transformers", str(onnx_dir)],
        env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise EngineUnavailableError(f"optimum-cli export failed: {done.stderr[-800:]}")
    (onnx_dir / "model.onnx").rename(tmp / "model.onnx")
    subprocess.run(["rm", "-rf", str(onnx_dir)], check=True)
    tmp.rename(out)
    return out


# sentence-transformers' pooling names -> infinity's --pooling-method (mean or CLS only)
INFINITY_POOLING = {"mean": "mean", "cls": "cls"}


def _command(
    engine: str, port: int, artifact: Path, infinity_dir: Path | None, cache: Path, device: str,
    metrics_port: int, pooling: str,
) -> tuple[list[str], Path, dict[str, str], Client | GrpcClient]:  # fmt: skip
    if engine.startswith("serve-"):
        argv = [str(REPO / ".venv" / "bin" / "tei-serve"), "--model-id", str(artifact),
                "--dtype", dtype_of(engine), "--device", device, "--hostname", "127.0.0.1",
                "--port", str(port), "--prometheus-port", str(metrics_port),
                "--log-level", "warning"]  # fmt: skip
        if engine.startswith("serve-grpc-"):  # EmbedStream instead of POST /embed
            return [*argv, "--grpc"], REPO, clean_env(), GrpcClient(port)
        return argv, REPO, clean_env(), tei_client(port)
    if engine == "infinity-optimum" and pooling not in INFINITY_POOLING:
        raise EngineUnavailableError(f"infinity's optimum engine pools mean or cls, not {pooling}")
    if infinity_dir is None:
        raise EngineUnavailableError("no infinity model folder")
    exe = INFINITY_VENV / "bin" / "infinity_emb"
    if not exe.exists():
        raise EngineUnavailableError(f"no infinity venv: {exe} missing (see bench/README.md)")
    # --pooling-method as the checkpoint pools: with its default "auto" the optimum engine
    # pools the CLS token (infinity_emb/transformer/embedder/optimum.py), wrong for MiniLM.
    # The torch engine ignores it and pools as sentence-transformers' modules say.
    argv = [str(exe), "v2", "--model-id", ".", "--served-model-name", SERVED_NAME,
            "--engine", engine.removeprefix("infinity-"), "--device", device,
            "--pooling-method", INFINITY_POOLING.get(pooling, "auto"), "--batch-size", "32",
            "--no-vector-disk-cache",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    env = clean_env(HF_HOME=str(cache / "infinity-hf-home"))
    return argv, infinity_dir, env, openai_client(port, SERVED_NAME)


def start(
    engine: str, artifact: Path, infinity_dir: Path | None, cache: Path, log_dir: Path,
    device: str, timeout: float = 600.0, pooling: str = "mean",
) -> Server:  # fmt: skip
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:
        metrics_port = free_port()
    argv, cwd, env, client = _command(engine, port, artifact, infinity_dir, cache, device,
                                      metrics_port, pooling)  # fmt: skip
    log = log_dir / f"{engine}-{port}.log"
    t0 = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    probe = (GrpcClient(port, timeout=30.0) if isinstance(client, GrpcClient)
             else Client(port, client.path, client.shape, client.count, timeout=30.0))  # fmt: skip
    while True:
        try:
            probe.post(["cold start"])
            break
        except (OSError, GrpcUnavailableError):
            # Not listening yet. A fresh channel each time: gRPC's own reconnect backoff
            # (1 s and growing) would otherwise be timed as cold start.
            probe.close()
        if proc.poll() is not None:
            raise EngineUnavailableError(f"{engine} exited {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise EngineUnavailableError(f"{engine} not ready after {timeout:.0f}s:\n{_tail(log)}")
        time.sleep(0.05)
    cold = time.monotonic() - t0
    probe.close()
    return Server(engine=engine, proc=proc, client=client, log=log, cold_start_s=cold,
                  metrics_port=metrics_port if engine.startswith("serve-") else None)
