"""Air-gapped serving: `tei-serve` on an artifact folder or a bundle makes zero network calls,
whatever the HF_* variables say, and serves the vectors tei_runtime computes in-process.

Each server runs in a network namespace holding only loopback (`unshare -n`, as root), with
an audit hook (netguard/sitecustomize.py) in every Python process that records and refuses
any DNS lookup or connect that is not to loopback. The namespace proves no call could succeed;
the audit log being empty proves none was even tried from Python. Where no namespace can be
made the hook alone is the guard. A hub id under the same guard is the control: its attempts
are recorded. onnxruntime's native telemetry uploader (its DNS lookups happen in C++, out of
the hook's sight) writes its offline event cache under $XDG_CACHE_HOME/Microsoft (else
$HOME/.cache/Microsoft) as it starts: each server gets a HOME and an XDG_CACHE_HOME of its own,
which must stay empty of it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tei_runtime
from support.processes import free_port
from tei_bundle import archive as bundle

HERE = Path(__file__).resolve().parent
TEI_SERVE = Path(sys.executable).with_name("tei-serve")
TEXTS = ["hello world", "the cat sat on the mat", "What is Deep Learning?", "é café naïve"]
# Everything that could tell huggingface_hub to go online, set the wrong way.
HOSTILE_ENV = {
    "HF_HUB_OFFLINE": "0",
    "TRANSFORMERS_OFFLINE": "0",
    "HF_DATASETS_OFFLINE": "0",
    "HF_ENDPOINT": "http://hub.tei-onnx.invalid:8080",
    "HF_HUB_DISABLE_TELEMETRY": "0",
    "HF_TOKEN": "hf_not_a_real_token",
}


@functools.cache
def netns_available() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


# The variables by which onnxruntime's native library (1.2x/1.3x) recognises a CI run and
# leaves telemetry off; read from the library's strings, the list it checks.
CI_MARKERS = (
    "CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
    "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER",
)  # fmt: skip


class Offline:
    """One air-gapped run: its environment, audit log and (optionally) namespace."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.audit = tmp_path / "net-audit.jsonl"
        self.cache = tmp_path / "hub-cache"
        self.env = {**os.environ, **HOSTILE_ENV}
        for key in ("MODEL_ID", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            self.env.pop(key, None)
        self.env["HUGGINGFACE_HUB_CACHE"] = str(self.cache)
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env["HOME"] = str(self.home)
        # onnxruntime's telemetry cache follows XDG_CACHE_HOME where the caller's shell sets it
        # (CI runners do): pinned here so the check below looks where it would be written.
        self.env["XDG_CACHE_HOME"] = str(self.home / ".cache")
        # What a user's shell has: nothing that turns onnxruntime's telemetry off. Its native
        # library also skips telemetry when it sees a CI service's variable, so those go too.
        for key in ("ORT_DISABLE_TELEMETRY", *CI_MARKERS):
            self.env.pop(key, None)
        self.env["TEI_NET_AUDIT"] = str(self.audit)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE / "netguard"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )

    def command(self, argv: list[str]) -> list[str]:
        if not netns_available():
            return argv
        return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]

    def attempts(self) -> list[dict[str, str]]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines()]

    def serve(self, model_id: str, *args: str) -> dict[str, Any]:
        port = 8080 if netns_available() else free_port()
        result = self.tmp / "result.json"
        texts = self.tmp / "texts.json"
        texts.write_text(json.dumps(TEXTS))
        argv = [sys.executable, str(HERE / "airgap_driver.py"), str(result), str(port),
                str(texts), "--", str(TEI_SERVE), "--model-id", model_id, "--port", str(port),
                "--hostname", "127.0.0.1", "--json-output", *args]  # fmt: skip
        run = subprocess.run(
            self.command(argv), env=self.env, capture_output=True, text=True, timeout=900
        )
        assert run.returncode == 0, run.stdout + run.stderr
        out: dict[str, Any] = json.loads(result.read_text())
        return out


def _assert_served(offline: Offline, model_id: str, artifact: Path) -> None:
    result = offline.serve(model_id)
    assert result.get("status") == 200, result.get("output")
    assert result["returncode"] == 0  # SIGTERM: graceful exit
    got = np.array(result["vectors"], dtype=np.float32)
    expected = tei_runtime.load(artifact, device="cpu").embed(TEXTS)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert offline.attempts() == [], "network attempts while serving an artifact"
    assert not (offline.home / ".cache" / "Microsoft").exists(), "onnxruntime telemetry ran"


def _tampered(source: Path, tmp_path: Path, how: str, name: str) -> Path:
    tar = tmp_path / f"{how}.tar"
    if how == "changed-byte":
        shutil.copy(source, tar)
        with tarfile.open(tar) as t:
            offset = t.getmember(name).offset_data + 100
        with tar.open("r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    else:
        with tarfile.open(source) as tin, tarfile.open(tar, "w") as tout:
            for member in tin:
                if member.name != name:
                    tout.addfile(member, tin.extractfile(member))
    return tar


def _assert_refused(offline: Offline, tar: Path, name: str, message: str) -> None:
    result = offline.serve(str(tar))
    assert "status" not in result, "a tampered bundle was served"
    assert result["returncode"] == 1
    errors = [json.loads(line) for line in result["output"].splitlines() if line.startswith("{")]
    [error] = [e for e in errors if e["level"] == "ERROR"]
    assert name in error["message"] and message in error["message"], error
    assert offline.attempts() == []
    # Nothing was left in the cache for a later start to pick up.
    bundles = offline.cache / "tei-onnx" / "bundles"
    assert not bundles.exists() or list(bundles.iterdir()) == []


# ---- the guard itself ----------------------------------------------------------------------


def test_namespace_has_no_network() -> None:
    if not netns_available():
        pytest.skip("unshare -n is not permitted here: the audit-hook guard runs alone")
    code = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(5)\n"
        "try:\n    s.connect(('192.0.2.1', 80))\nexcept OSError as e:\n    print(e.errno)\n"
    )
    out = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "101"  # ENETUNREACH: no route, no interface but loopback


def test_telemetry_evidence_is_what_onnxruntime_leaves_when_not_told(tmp_path: Path) -> None:
    """The control for the HOME check: onnxruntime imported bare, with the variable unset,
    starts its uploader and leaves its cache; imported after tei_runtime it does not."""
    offline = Offline(tmp_path)
    graph = tmp_path / "identity.onnx"
    code = (
        "import sys\n"
        "if sys.argv[2] == 'ours':\n    import tei_runtime\n"
        "import onnx, onnxruntime as ort\n"
        "from onnx import TensorProto, helper\n"
        "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1])\n"
        "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1])\n"
        "g = helper.make_graph([helper.make_node('Identity', ['x'], ['y'])], 'g', [x], [y])\n"
        "onnx.save(helper.make_model(g), sys.argv[1])\n"
        "ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
    )
    cache = offline.home / ".cache" / "Microsoft"
    for how, expected in (("ours", False), ("bare", True)):
        run = subprocess.run(
            offline.command([sys.executable, "-c", code, str(graph), how]), env=offline.env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert cache.exists() is expected, how


def test_guard_records_and_refuses_non_loopback(tmp_path: Path) -> None:
    offline = Offline(tmp_path)
    code = (
        "import socket\n"
        "socket.getaddrinfo('127.0.0.1', 80)\n"
        "try:\n    socket.getaddrinfo('huggingface.co', 443)\nexcept OSError as e:\n"
        "    print('refused', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=offline.env, capture_output=True, text=True, timeout=60
    )
    assert "refused tei-onnx network guard" in out.stdout, out.stderr
    assert [a["host"] for a in offline.attempts()] == ["huggingface.co"]


@pytest.mark.slow
def test_control_a_hub_id_is_caught(tmp_path: Path) -> None:
    """The same guard on a model that needs the hub: its lookups are recorded, so an empty
    log for an artifact means something."""
    offline = Offline(tmp_path)
    result = offline.serve("sentence-transformers/not-exported-here")
    assert "status" not in result
    assert result["returncode"] != 0
    assert offline.attempts(), result["output"][-2000:]


# ---- the toy artifact: fast ----------------------------------------------------------------


def test_folder_served_offline(toy_artifact: Path, tmp_path: Path) -> None:
    _assert_served(Offline(tmp_path), str(toy_artifact), toy_artifact)


def test_bundle_served_offline(toy_artifact: Path, tmp_path: Path) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    offline = Offline(tmp_path)
    _assert_served(offline, str(tar), toy_artifact)
    assert len(list((offline.cache / "tei-onnx" / "bundles").iterdir())) == 1


@pytest.mark.parametrize(
    ("how", "name", "message"),
    [("changed-byte", "model.fp32.onnx", "sha256 mismatch"),
     ("missing-file", "tokenizer.json", "is missing")],
)  # fmt: skip
def test_tampered_bundle_refuses_to_start(
    toy_artifact: Path, tmp_path: Path, how: str, name: str, message: str
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    _assert_refused(Offline(tmp_path), _tampered(tar, tmp_path, how, name), name, message)


# ---- the real all-MiniLM-L6-v2: slow -------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_bundle(minilm_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle.write_bundle(minilm_artifact, tmp_path_factory.mktemp("bundle") / "minilm.tar")


@pytest.mark.slow
def test_minilm_folder_served_offline(minilm_artifact: Path, tmp_path: Path) -> None:
    _assert_served(Offline(tmp_path), str(minilm_artifact), minilm_artifact)


@pytest.mark.slow
def test_minilm_bundle_served_offline(
    minilm_bundle: Path, minilm_artifact: Path, tmp_path: Path
) -> None:
    _assert_served(Offline(tmp_path), str(minilm_bundle), minilm_artifact)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "name", "message"),
    [("changed-byte", "model.fp32.onnx", "sha256 mismatch"),
     ("missing-file", "model.fp16.onnx", "is missing")],
)  # fmt: skip
def test_minilm_tampered_bundle_refuses_to_start(
    minilm_bundle: Path, tmp_path: Path, how: str, name: str, message: str
) -> None:
    tar = _tampered(minilm_bundle, tmp_path, how, name)
    _assert_refused(Offline(tmp_path), tar, name, message)
