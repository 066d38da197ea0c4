"""deploy/kubernetes: schema-valid against Kubernetes 1.37 (kubernetes-validate, strict), and
wired together: probes on /health, requests, read-only artifacts, HPA on te_queue_size."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.37.0"
RESOURCES = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _load(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    assert len(docs) == 1, f"{name}: one resource per file"
    doc: dict[str, Any] = docs[0]
    return doc


@pytest.mark.parametrize("name", RESOURCES)
def test_schema_valid(name: str) -> None:
    kubernetes_validate.validate(_load(name), K8S_VERSION, strict=True)


def test_validation_can_fail() -> None:
    bad = copy.deepcopy(_load("deployment.yaml"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_kustomization_lists_every_resource() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == RESOURCES


def _container() -> dict[str, Any]:
    containers = _load("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def test_probes_and_resources() -> None:
    c = _container()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert [p["name"] for p in c["ports"]] == ["http"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert int(env["PORT"]) == c["ports"][0]["containerPort"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]


def test_image_tag_is_version_target() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _container()["image"] == f"tei-onnx:{version}-cpu"


def test_artifact_mounted_read_only_and_served() -> None:
    pod = _load("deployment.yaml")["spec"]["template"]["spec"]
    c = _container()
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["artifacts"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes["artifacts"]["persistentVolumeClaim"]
    assert claim["readOnly"] is True
    assert claim["claimName"] == _load("pvc.yaml")["metadata"]["name"]
    model_id = c["args"][c["args"].index("--model-id") + 1]
    assert model_id.startswith(mounts["artifacts"]["mountPath"] + "/")
    # The bundle is unpacked into the hub cache, which must be writable.
    env = {e["name"]: e["value"] for e in c["env"]}
    assert mounts["data"]["mountPath"] == env["HUGGINGFACE_HUB_CACHE"]
    assert "readOnly" not in mounts["data"]


def test_runs_as_non_root() -> None:
    pod = _load("deployment.yaml")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000  # the image's USER 1000:1000
    assert _container()["securityContext"]["allowPrivilegeEscalation"] is False


def test_service_selects_the_pods() -> None:
    labels = _load("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    service = _load("service.yaml")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_hpa_scales_the_deployment_on_queue_size() -> None:
    hpa = _load("hpa.yaml")
    deployment = _load("deployment.yaml")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", deployment["metadata"]["name"])
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "te_queue_size"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    rules = yaml.safe_load(_load("prometheus-adapter.yaml")["data"]["config.yaml"])["rules"]
    assert any(r["name"]["as"] == "te_queue_size" for r in rules)


def test_metric_name_is_what_the_server_exports() -> None:
    from tei_serve.metrics import Metrics

    assert b"\nte_queue_size " in Metrics(max_input_length=16).render()
