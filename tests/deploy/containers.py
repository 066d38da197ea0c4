"""Build and run the images with podman, the way the README says (tests/deploy/test_container.py).

Where no registry serves base images, the base is a local Debian made by
docker/make-local-base.sh (debootstrap, cached by release). Builds reach the package index
with the host's network and CA bundle: the bundle is mounted at a path of its own and named
by a pip.conf mounted over /etc/pip.conf for the build only (mounting it over the image's own
CA bundle breaks Debian's ca-certificates). `--format docker`: podman's default OCI format
drops SHELL and HEALTHCHECK.
"""

from __future__ import annotations

import configparser
import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
MAKE_BASE = ROOT / "docker" / "make-local-base.sh"
RELEASE = os.environ.get("DEBIAN_RELEASE", "bookworm")
BASE_TAG = f"localhost/tei-onnx-base:{RELEASE}"
HOST_CA = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
# This machine's kernel has hybrid cgroups, which crun refuses; runc with cgroupfs runs
# everywhere podman does. Its hard limits are below podman's default ulimits.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
# Build times, sizes, first-request times: printed in the terminal summary (conftest.py).
FIGURES: list[str] = []


def missing_tools() -> str | None:
    """Why images cannot be built and run here, or None when they can."""
    if os.geteuid() != 0:
        return "building images needs root (debootstrap, podman's root storage)"
    absent = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install podman runc debootstrap)"
    return None


def podman(
    *args: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and run.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {run.returncode}\n{run.stdout}{run.stderr}")
    return run


def make_base() -> float:
    """docker/make-local-base.sh; seconds it took (debootstrap on a fresh machine)."""
    started = time.monotonic()
    subprocess.run([str(MAKE_BASE), BASE_TAG], check=True, timeout=1800, capture_output=True)
    return time.monotonic() - started


@functools.cache
def _torch_wheels() -> Path | None:
    """A local folder holding the pinned torch CPU wheel, as pip's find-links names it here."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    for config in (Path("/etc/pip.conf"), Path.home() / ".config" / "pip" / "pip.conf"):
        parser = configparser.ConfigParser()
        if config.is_file():
            parser.read(config)
            links += parser.get("global", "find-links", fallback="").split()
    pin = next(
        line.strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.startswith("torch==")
    )
    version = pin.split("==", 1)[1]
    for link in links:
        folder = Path(link.removeprefix("file://"))
        if folder.is_dir() and any(folder.glob(f"torch-{version}*.whl")):
            return folder
    return None


def build(target: str, tag: str, workdir: Path) -> float:
    """Build one stage of docker/Dockerfile on the local base; seconds it took."""
    pip_conf = workdir / "pip.conf"
    pip_conf.write_text("[global]\ncert = /run/tei-build/host-ca.pem\n")
    args = [
        "build",
        "--format",
        "docker",
        "--network",
        "host",
        *ULIMITS,
        "-v",
        f"{HOST_CA}:/run/tei-build/host-ca.pem:ro",
        "-v",
        f"{pip_conf}:/etc/pip.conf:ro",
        "--build-arg",
        f"BASE_IMAGE={BASE_TAG}",
        "--build-arg",
        f"BUILD_IMAGE={BASE_TAG}",
        "--target",
        target,
        "-t",
        tag,
        "-f",
        str(DOCKERFILE),
    ]
    wheels = _torch_wheels()
    if target == "export" and wheels is not None:
        args += [
            "-v",
            f"{wheels}:/run/tei-build/wheels:ro",
            "--build-arg",
            "TORCH_FIND_LINKS=/run/tei-build/wheels",
        ]
    started = time.monotonic()
    podman(*args, str(ROOT), timeout=1800)
    return time.monotonic() - started


def image_size(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
