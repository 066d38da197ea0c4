"""Which graph of a precision runs: the one measured faster on the host's CPU class, else
the precision's default; GPUs and OpenVINO always take the default."""

from __future__ import annotations

import logging
import shutil

import msgspec
import pytest
from rt_artifacts import ArtifactFactory, Built

import tei_runtime
from tei_runtime.__main__ import variant_reason
from tei_runtime.artifact import open_artifact
from tei_runtime.checksum import sha256_file
from tei_runtime.host import CpuClass, Host
from tei_runtime.loader import default_shas, pick_variant, plan, slow_cpu_graph
from tei_runtime.manifest import (
    GraphForm,
    Precision,
    decode_manifest,
    encode_manifest,
    read_manifest,
)
from tei_runtime.providers import Device

EPYC = ("avx2", "fma")
XEON = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni")


def cpu_host(features: tuple[str, ...]) -> Host:
    return Host(providers=("CPUExecutionProvider",), cpu_features=features)


def with_plain_fp32(
    built: Built, hosts: tuple[CpuClass, ...] = (CpuClass.AVX2,), first: bool = False
) -> Built:
    """The artifact plus a second fp32 graph (a copy, so outputs agree) for `hosts`, listed
    after the default graph or, `first`, before it."""
    shutil.copy(built.root / "model.fp32.onnx", built.root / "model.fp32.plain.onnx")
    default = built.manifest.variant(Precision.FP32)
    plain = msgspec.structs.replace(
        default,
        name="fp32-plain",
        file="model.fp32.plain.onnx",
        sha256=sha256_file(built.root / "model.fp32.plain.onnx"),
        graph=GraphForm.PLAIN,
        hosts=list(hosts),
    )
    variants = [plain, *built.manifest.variants] if first else [*built.manifest.variants, plain]
    manifest = msgspec.structs.replace(built.manifest, variants=variants)
    (built.root / "manifest.json").write_bytes(encode_manifest(manifest))
    return Built(root=built.root, spec=built.spec, weights=built.weights, manifest=manifest)


@pytest.mark.parametrize(
    ("features", "file"),
    [(EPYC, "model.fp32.plain.onnx"), (XEON, "model.fp32.onnx"), ((), "model.fp32.onnx")],
)
def test_cpu_load_takes_the_graph_measured_for_its_class(
    make_artifact: ArtifactFactory, features: tuple[str, ...], file: str
) -> None:
    built = with_plain_fp32(make_artifact())
    model = tei_runtime.load(built.root, device="cpu", host=cpu_host(features))
    assert model.variant.file == file
    assert model.embed(["hello world"]).shape == (1, 8)


@pytest.mark.parametrize("first", [False, True])
def test_a_plain_graph_for_no_class_runs_only_when_asked(
    make_artifact: ArtifactFactory, first: bool
) -> None:
    """`tei-export --plain-graphs` writes a plain graph the card measured on no class: every
    host keeps the fused default, wherever the manifest lists it; graph="plain" runs it."""
    built = with_plain_fp32(make_artifact(), hosts=(), first=first)
    for features in (EPYC, XEON, ()):
        model = tei_runtime.load(built.root, device="cpu", host=cpu_host(features))
        assert model.variant.file == "model.fp32.onnx"
    forced = tei_runtime.load(built.root, device="cpu", host=cpu_host(EPYC), graph="plain")
    assert forced.variant.file == "model.fp32.plain.onnx"
    manifest = read_manifest(built.root)
    assert manifest.variant(Precision.FP32, None).graph is GraphForm.FUSED
    # GPU engine caches are keyed by the graph a GPU runs: the fused one.
    assert default_shas(manifest)[Precision.FP32] == manifest.variant(Precision.FP32).sha256
    assert manifest.variant(Precision.FP32).file == "model.fp32.onnx"


def test_only_the_chosen_graph_is_verified(make_artifact: ArtifactFactory) -> None:
    built = with_plain_fp32(make_artifact())
    (built.root / "model.fp32.onnx").write_bytes(b"tampered")
    model = tei_runtime.load(built.root, device="cpu", host=cpu_host(EPYC))
    assert model.variant.graph is GraphForm.PLAIN
    with pytest.raises(tei_runtime.ManifestError, match=r"model\.fp32\.onnx"):
        tei_runtime.load(built.root, device="cpu", host=cpu_host(XEON))


def test_gpu_and_openvino_take_the_default_and_key_caches_by_it(
    make_artifact: ArtifactFactory,
) -> None:
    built = with_plain_fp32(make_artifact(precisions=(Precision.FP32, Precision.INT8)))
    manifest = read_manifest(built.root)
    assert manifest.variant(Precision.FP32, None).graph is GraphForm.FUSED
    assert manifest.variant(Precision.FP32, CpuClass.AVX2).graph is GraphForm.PLAIN
    # int8 has one graph: every class gets it.
    assert manifest.variant(Precision.INT8, CpuClass.AVX2).file == "model.int8.onnx"
    assert default_shas(manifest)[Precision.FP32] == manifest.variant(Precision.FP32).sha256


def test_manifest_leaves_out_default_graph_fields(make_artifact: ArtifactFactory) -> None:
    plain = make_artifact()
    text = (plain.root / "manifest.json").read_text()
    assert '"graph"' not in text
    assert '"hosts"' not in text
    both = with_plain_fp32(make_artifact())
    data = (both.root / "manifest.json").read_bytes()
    assert b'"hosts": [\n        "avx2"\n      ]' in data
    assert decode_manifest(data) == both.manifest


def test_print_host_reason() -> None:
    built_variant = msgspec.structs.replace(
        _variant(), graph=GraphForm.PLAIN, hosts=[CpuClass.AVX2]
    )
    assert "measured faster on avx2" in variant_reason(built_variant, CpuClass.AVX2)
    assert "default" in variant_reason(_variant(), CpuClass.AVX512)


def _variant() -> tei_runtime.manifest.Variant:
    from tei_runtime.manifest import Validation, Variant

    return Variant(
        name="fp32", file="model.fp32.onnx", precision=Precision.FP32, sha256="0" * 64,
        fused_ops={}, validation=Validation(min_cosine=1, max_abs_err=0, tolerance=1, shapes=[]),
    )


@pytest.mark.parametrize(
    ("features", "graph", "file"),
    [
        (XEON, "plain", "model.fp32.plain.onnx"),
        (EPYC, "fused", "model.fp32.onnx"),
        (EPYC, "auto", "model.fp32.plain.onnx"),
    ],
)
def test_graph_can_be_asked_for_whatever_the_host(
    make_artifact: ArtifactFactory, features: tuple[str, ...], graph: str, file: str
) -> None:
    built = with_plain_fp32(make_artifact())
    model = tei_runtime.load(built.root, device="cpu", host=cpu_host(features), graph=graph)
    assert model.variant.file == file


def test_asked_graph_the_artifact_lacks_or_unknown_is_refused(
    make_artifact: ArtifactFactory,
) -> None:
    built = make_artifact()
    with pytest.raises(tei_runtime.ManifestError, match=r"no plain fp32 graph.*it has: fused"):
        tei_runtime.load(built.root, device="cpu", host=cpu_host(EPYC), graph="plain")
    with pytest.raises(tei_runtime.ProviderError, match="unknown graph 'flat'; known: auto"):
        tei_runtime.load(built.root, device="cpu", host=cpu_host(EPYC), graph="flat")
    # any case, as dtype and device are read
    with pytest.raises(tei_runtime.ManifestError, match=r"no plain fp32 graph"):
        tei_runtime.load(built.root, device="cpu", host=cpu_host(EPYC), graph="PLAIN")


def test_asked_graph_is_cpu_only(make_artifact: ArtifactFactory) -> None:
    built = with_plain_fp32(make_artifact())
    gpu = Host(
        providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        nvidia_gpus=("NVIDIA H200",),
        cpu_features=EPYC,
    )
    choice = plan(open_artifact(built.root), gpu, device="cuda", dtype="float32")
    assert pick_variant(built.manifest, choice, gpu, None).graph is GraphForm.FUSED
    with pytest.raises(tei_runtime.ProviderError, match="graph plain is for the CPU provider"):
        pick_variant(built.manifest, choice, gpu, GraphForm.PLAIN)


def test_artifact_with_slow_cpu_norms_is_named_at_cpu_load(
    make_artifact: ArtifactFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Exported before the norms were left unfused: it loads, and the log says to export it
    again; a fresh artifact says nothing, and GPUs (whose kernel is the fast one) neither."""
    old = make_artifact(fused_ops={"Attention": 2, "SkipLayerNormalization": 4})
    with caplog.at_level(logging.WARNING, logger="tei_runtime"):
        tei_runtime.load(old.root, device="cpu", host=cpu_host(XEON))
    assert "model.fp32.onnx carries SkipLayerNormalization" in caplog.text
    assert "export the model again" in caplog.text
    caplog.clear()
    fresh = make_artifact(fused_ops={"Attention": 2, "LayerNormalization": 4})
    with caplog.at_level(logging.WARNING, logger="tei_runtime"):
        tei_runtime.load(fresh.root, device="cpu", host=cpu_host(XEON))
    assert "carries" not in caplog.text
    variant = old.manifest.variant(Precision.FP32)
    assert slow_cpu_graph(variant, Device.CUDA) is None
    assert slow_cpu_graph(variant, Device.CPU) is not None
