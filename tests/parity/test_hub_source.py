"""Hub ids through huggingface_hub, offline: a pre-populated cache, and a local fake hub that
serves a checkpoint over HTTP so the download path (revision, token) really runs."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.tiny_models import build_checkpoint
from tei_runtime.manifest import read_manifest

pytestmark = pytest.mark.slow

REPO = "tiny-org/tiny-bert"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DEAD_ENDPOINT = "http://127.0.0.1:9"  # nothing listens: any real request fails at once


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ck") / "bert", "bert", st_pooling="cls")


def _populate_cache(cache: Path, checkpoint: Path) -> Path:
    """The layout huggingface_hub writes: refs/<branch> holds the commit of snapshots/<commit>."""
    repo = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return subprocess.run(
        [sys.executable, "-m", "tei_export", *args, "--quiet", "--variants", "fp32"],
        capture_output=True, text=True, timeout=600, env={**clean, **env},
    )


def test_offline_from_a_populated_cache(tmp_path: Path, checkpoint: Path) -> None:
    _populate_cache(tmp_path / "cache", checkpoint)
    out = tmp_path / "artifact"
    result = _cli(REPO, str(out), "--cache-dir", str(tmp_path / "cache"),
                  env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": DEAD_ENDPOINT})
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest.source.model_id == REPO
    assert manifest.source.commit_sha == COMMIT


def test_cache_dir_from_the_environment(tmp_path: Path, checkpoint: Path) -> None:
    _populate_cache(tmp_path / "cache", checkpoint)
    out = tmp_path / "artifact"
    result = _cli(REPO, str(out), env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": DEAD_ENDPOINT,
                                       "HUGGINGFACE_HUB_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr


def test_offline_and_not_cached_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    out = tmp_path / "artifact"
    result = _cli("someone/not-cached", str(out), "--cache-dir", str(tmp_path / "cache"),
                  env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": DEAD_ENDPOINT})
    assert result.returncode == 1
    assert "not in the hub cache" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not out.exists()


def test_offline_with_a_revision_the_cache_lacks_names_the_revision(
    tmp_path: Path, checkpoint: Path
) -> None:
    _populate_cache(tmp_path / "cache", checkpoint)  # cached at main only
    result = _cli(REPO, str(tmp_path / "artifact"), "--cache-dir", str(tmp_path / "cache"),
                  "--revision", "v9", env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": DEAD_ENDPOINT})
    assert result.returncode == 1
    assert f"{REPO} at revision v9 is not in the hub cache" in result.stderr, result.stderr


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """Just enough of the hub's HTTP API for snapshot_download: the revision info, the file
    tree (huggingface_hub 2.x lists files from it) and /resolve/ file downloads with the
    headers huggingface_hub reads."""

    root: Path
    seen_auth: list[str | None]
    seen_paths: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _files(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def _send(self, body: bytes, headers: dict[str, str], with_body: bool) -> None:
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def _handle(self, with_body: bool) -> None:
        self.seen_auth.append(self.headers.get("Authorization"))
        self.seen_paths.append(self.path)
        path = self.path.split("?")[0]
        info_prefix = f"/api/models/{REPO}/revision/"
        tree_prefix = f"/api/models/{REPO}/tree/"
        resolve_prefix = f"/{REPO}/resolve/"
        if path.startswith(tree_prefix):
            body = json.dumps([
                {"type": "file", "path": name, "size": (self.root / name).stat().st_size,
                 "oid": hashlib.sha1((self.root / name).read_bytes()).hexdigest()}
                for name in self._files()
            ]).encode()
            self._send(body, {"Content-Type": "application/json"}, with_body)
        elif path.startswith(info_prefix):
            body = json.dumps({
                "id": REPO, "sha": COMMIT,
                "siblings": [{"rfilename": name} for name in self._files()],
            }).encode()
            self._send(body, {"Content-Type": "application/json"}, with_body)
        elif path.startswith(resolve_prefix):
            name = path[len(resolve_prefix):].split("/", 1)[1]
            file = self.root / name
            if not file.is_file():
                self.send_error(404)
                return
            body = file.read_bytes()
            etag = hashlib.sha256(body).hexdigest()
            self._send(body, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, with_body)
        else:
            self.send_error(404)

    def do_GET(self) -> None:
        self._handle(with_body=True)

    def do_HEAD(self) -> None:
        self._handle(with_body=False)


@contextlib.contextmanager
def _hub_serving(root: Path) -> Iterator[type[_FakeHub]]:
    handler = type("Hub", (_FakeHub,), {"root": root, "seen_auth": [], "seen_paths": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.endpoint = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()


@pytest.fixture
def fake_hub(checkpoint: Path) -> Iterator[type[_FakeHub]]:
    with _hub_serving(checkpoint) as handler:
        yield handler


def test_a_pinned_commit_with_the_hub_unreachable_reads_the_cache_at_once(
    tmp_path: Path, checkpoint: Path
) -> None:
    """No HF_HUB_OFFLINE, a hub that refuses connections, --revision a commit: the cached
    snapshot exports, and an uncached one is the one-line error, without huggingface_hub's
    five retries of its file listing first."""
    env = {"HF_ENDPOINT": DEAD_ENDPOINT}
    (tmp_path / "empty").mkdir()
    missing = _cli(REPO, str(tmp_path / "none"), "--revision", COMMIT,
                   "--cache-dir", str(tmp_path / "empty"), env=env)  # fmt: skip
    assert missing.returncode == 1 and "not in the hub cache" in missing.stderr
    assert "Retry" not in missing.stderr and missing.stderr.count("\n") == 1, missing.stderr
    _populate_cache(tmp_path / "cache", checkpoint)
    cached = _cli(REPO, str(tmp_path / "artifact"), "--revision", COMMIT,
                  "--cache-dir", str(tmp_path / "cache"), env=env)  # fmt: skip
    assert cached.returncode == 0 and "Retry" not in cached.stderr, cached.stderr
    assert read_manifest(tmp_path / "artifact").source.commit_sha == COMMIT


def test_download_with_revision_and_token(tmp_path: Path, fake_hub: type[_FakeHub]) -> None:
    out = tmp_path / "artifact"
    env = {"HF_ENDPOINT": fake_hub.endpoint, "HF_TOKEN": "hf_test_token"}  # type: ignore[attr-defined]
    result = _cli(REPO, str(out), "--cache-dir", str(tmp_path / "cache"), "--revision", "main",
                  env=env)
    assert result.returncode == 0, result.stderr
    assert read_manifest(out).source.commit_sha == COMMIT
    assert "Bearer hf_test_token" in fake_hub.seen_auth
    assert any("/revision/main" in p for p in fake_hub.seen_paths)
    snapshot = tmp_path / "cache" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert (snapshot / "tokenizer.json").is_file()
    assert (snapshot / "1_Pooling" / "config.json").is_file()

    # The same id again with the hub gone: served from the cache it just filled.
    again = _cli(REPO, str(tmp_path / "again"), "--cache-dir", str(tmp_path / "cache"),
                 env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": DEAD_ENDPOINT})
    assert again.returncode == 0, again.stderr


def _fetched(hub: type[_FakeHub]) -> set[str]:
    prefix = f"/{REPO}/resolve/"
    return {p.split("?")[0][len(prefix):].split("/", 1)[1]
            for p in hub.seen_paths if p.startswith(prefix)}  # fmt: skip


def test_safetensors_weights_only_no_second_copy_or_openvino(
    tmp_path: Path, checkpoint: Path
) -> None:
    """A repository with safetensors weights, their PyTorch pickle twin and an OpenVINO export
    (as sentence-transformers/all-MiniLM-L6-v2 has): only the safetensors are fetched."""
    repo = tmp_path / "repo"
    shutil.copytree(checkpoint, repo)
    (repo / "pytorch_model.bin").write_bytes(b"a second copy of the weights")
    (repo / "openvino").mkdir()
    (repo / "openvino" / "openvino_model.bin").write_bytes(b"an OpenVINO export")
    # A stella-like Dense folder beside (what --dense-path picks) holding only a pickle: a
    # module folder is one copy of its weights, fetched whole.
    (repo / "2_Dense_256").mkdir()
    (repo / "2_Dense_256" / "config.json").write_text('{"in_features": 32, "out_features": 8}')
    (repo / "2_Dense_256" / "pytorch_model.bin").write_bytes(b"the Dense weights")
    with _hub_serving(repo) as hub:
        result = _cli(REPO, str(tmp_path / "artifact"), "--cache-dir", str(tmp_path / "cache"),
                      env={"HF_ENDPOINT": hub.endpoint})  # type: ignore[attr-defined]
    assert result.returncode == 0, result.stderr
    fetched = _fetched(hub)
    assert "model.safetensors" in fetched and "tokenizer.json" in fetched
    assert not {"pytorch_model.bin", "openvino/openvino_model.bin"} & fetched, fetched
    assert {"2_Dense_256/config.json", "2_Dense_256/pytorch_model.bin"} <= fetched, fetched


def test_pickle_weights_where_a_repository_has_no_safetensors(
    tmp_path: Path, checkpoint: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    repo = tmp_path / "repo"
    shutil.copytree(checkpoint, repo)
    torch.save(load_file(repo / "model.safetensors"), repo / "pytorch_model.bin")
    (repo / "model.safetensors").unlink()
    with _hub_serving(repo) as hub:
        result = _cli(REPO, str(tmp_path / "artifact"), "--cache-dir", str(tmp_path / "cache"),
                      env={"HF_ENDPOINT": hub.endpoint})  # type: ignore[attr-defined]
    assert result.returncode == 0, result.stderr
    assert "pytorch_model.bin" in _fetched(hub)
