from __future__ import annotations

from pathlib import Path

import pytest

from tei_runtime.errors import ProviderError
from tei_runtime.host import Host
from tei_runtime.manifest import Precision
from tei_runtime.providers import (
    PROVIDERS,
    Device,
    Preference,
    choose,
    trt_profiles,
)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
ROCM = "ROCMExecutionProvider"
OV = "OpenVINOExecutionProvider"
ALL = {Precision.FP32: "a" * 64, Precision.FP16: "b" * 64, Precision.INT8: "c" * 64}


def host(
    *providers: str,
    gpus: tuple[str, ...] = (),
    amd: bool = False,
    trt: str | None = None,
    cores: int = 8,
    quota: float | None = None,
) -> Host:
    return Host(
        providers=(*providers, CPU),
        onnxruntime_version="1.31.1",
        nvidia_gpus=gpus,
        amd_gpu=amd,
        tensorrt_version=trt,
        cpu_count=cores,
        affinity_cores=cores,
        cgroup_cores=quota,
    )


def pref(device: str = "auto", dtype: str = "auto", **kw: object) -> Preference:
    kw.setdefault("variants", ALL)
    kw.setdefault("cache_dir", Path("/cache"))
    return Preference(device=device, dtype=dtype, **kw)  # type: ignore[arg-type]


NVIDIA = host(TRT, CUDA, gpus=("NVIDIA H200",), trt="10.9.0")


def test_table_order_and_packages() -> None:
    assert [s.name for s in PROVIDERS] == [TRT, CUDA, ROCM, OV, CPU]
    packages = {s.device: s.package for s in PROVIDERS}
    assert packages[Device.CUDA] == "onnxruntime-gpu"
    assert packages[Device.ROCM] == "onnxruntime-rocm"
    assert packages[Device.OPENVINO] == "onnxruntime-openvino"
    assert packages[Device.TENSORRT] == "onnxruntime-gpu"


def test_cpu_only_host_auto_is_cpu_fp32_with_quota_threads() -> None:
    c = choose(host(cores=16, quota=4.0), pref())
    assert (c.provider, c.precision, c.intra_op_threads, c.inter_op_threads) == (
        CPU,
        Precision.FP32,
        4,
        1,
    )
    assert c.providers == [(CPU, {})]
    assert c.io_binding is None


def test_explicit_threads_win() -> None:
    assert choose(host(cores=16), pref(intra_op_threads=3)).intra_op_threads == 3


def test_cpu_int8_and_fp16_explicit() -> None:
    assert choose(host(), pref("cpu", "int8")).precision is Precision.INT8
    assert choose(host(), pref("cpu", "float16")).precision is Precision.FP16


def test_cpu_auto_falls_back_to_the_variant_the_artifact_has() -> None:
    only_int8 = {Precision.INT8: "c" * 64}
    assert choose(host(), pref(variants=only_int8)).precision is Precision.INT8


def test_auto_prefers_tensorrt_when_its_libraries_are_there() -> None:
    c = choose(NVIDIA, pref())
    assert c.provider == TRT and c.precision is Precision.FP16
    assert [name for name, _ in c.providers] == [TRT, CUDA, CPU]
    opts = c.providers[0][1]
    assert opts["trt_fp16_enable"] == "True"
    assert opts["trt_engine_cache_enable"] == "True"
    assert opts["trt_timing_cache_enable"] == "True"
    cache = opts["trt_engine_cache_path"]
    assert cache.startswith("/cache/tensorrt/bbbbbbbbbbbbbbbb-nvidia-h200-trt10.9.0-ort1.31.1")
    assert opts["trt_timing_cache_path"] == cache
    assert "input_ids:1x1" in opts["trt_profile_min_shapes"]
    assert c.io_binding == "cuda"


def test_tensorrt_cache_key_changes_with_model_gpu_and_version() -> None:
    def key(h: Host, variants: dict[Precision, str]) -> str:
        return choose(h, pref("tensorrt", variants=variants)).providers[0][1][
            "trt_engine_cache_path"
        ]

    base = key(NVIDIA, ALL)
    other_model = {**ALL, Precision.FP16: "d" * 64}
    assert key(NVIDIA, other_model) != base
    assert key(host(TRT, CUDA, gpus=("NVIDIA L4",), trt="10.9.0"), ALL) != base
    assert key(host(TRT, CUDA, gpus=("NVIDIA H200",), trt="10.10.0"), ALL) != base


def test_auto_skips_tensorrt_without_its_libraries() -> None:
    c = choose(host(TRT, CUDA, gpus=("NVIDIA H200",)), pref())
    assert c.provider == CUDA and c.precision is Precision.FP16
    assert any("TensorRT libraries" in n for n in c.notes)
    assert c.providers[0][1] == {
        "device_id": "0",
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": "1",
    }


def test_auto_with_gpu_build_but_no_gpu_is_cpu() -> None:
    c = choose(host(TRT, CUDA), pref())
    assert c.provider == CPU
    assert any("no NVIDIA GPU" in n for n in c.notes)


def test_explicit_tensorrt_without_libraries_is_an_error() -> None:
    with pytest.raises(ProviderError, match="tensorrt-cu12"):
        choose(host(TRT, CUDA, gpus=("g",)), pref("tensorrt"))


def test_cuda_explicit_fp32_index_and_memory_limit() -> None:
    h = host(CUDA, gpus=("A", "B"))
    c = choose(h, pref("cuda:1", "float32", gpu_mem_limit=1 << 30))
    assert c.precision is Precision.FP32 and c.device_id == 1
    assert c.providers[0][1]["device_id"] == "1"
    assert c.providers[0][1]["gpu_mem_limit"] == str(1 << 30)
    with pytest.raises(ProviderError, match="only 2 NVIDIA"):
        choose(h, pref("cuda:2"))
    with pytest.raises(ProviderError, match="number"):
        choose(h, pref("cuda:x"))


def test_cuda_auto_without_fp16_variant_runs_fp32() -> None:
    c = choose(host(CUDA, gpus=("A",)), pref(variants={Precision.FP32: "a" * 64}))
    assert c.provider == CUDA and c.precision is Precision.FP32


@pytest.mark.parametrize("device", ["cuda", "tensorrt", "rocm"])
def test_int8_on_a_gpu_provider_is_an_error(device: str) -> None:
    h = host(TRT, CUDA, ROCM, gpus=("A",), amd=True, trt="10")
    with pytest.raises(ProviderError, match="int8"):
        choose(h, pref(device, "int8"))


def test_auto_device_with_int8_lands_on_cpu_even_with_a_gpu() -> None:
    c = choose(NVIDIA, pref("auto", "int8"))
    assert c.provider == CPU and c.precision is Precision.INT8


@pytest.mark.parametrize(
    ("device", "package"),
    [
        ("cuda", "onnxruntime-gpu"),
        ("tensorrt", "onnxruntime-gpu"),
        ("rocm", "onnxruntime-rocm"),
        ("openvino", "onnxruntime-openvino"),
    ],
)
def test_missing_provider_names_the_package(device: str, package: str) -> None:
    with pytest.raises(ProviderError, match=package) as info:
        choose(host(gpus=("A",), amd=True, trt="10"), pref(device))
    assert "CPUExecutionProvider" in str(info.value)  # says what the build does have


def test_missing_tensorrt_build_also_names_the_tensorrt_libraries() -> None:
    with pytest.raises(ProviderError, match="tensorrt-cu12"):
        choose(host(gpus=("A",), trt="10"), pref("tensorrt"))


def test_cuda_build_present_but_no_gpu_is_an_error() -> None:
    with pytest.raises(ProviderError, match="no NVIDIA GPU"):
        choose(host(CUDA), pref("cuda"))


def test_rocm() -> None:
    c = choose(host(ROCM, amd=True), pref())
    assert c.provider == ROCM and c.precision is Precision.FP16
    assert c.providers[0][1]["miopen_conv_exhaustive_search"] == "0"
    assert c.io_binding == "cuda"
    with pytest.raises(ProviderError, match="AMD"):
        choose(host(ROCM), pref("rocm"))


def test_openvino_auto_device_type_and_cache() -> None:
    c = choose(host(OV, cores=4), pref())
    assert c.provider == OV and c.precision is Precision.FP32
    assert c.providers[0] == (
        OV,
        {"device_type": "CPU", "num_of_threads": "4", "cache_dir": "/cache/openvino"},
    )
    assert c.providers[-1][0] == CPU
    assert choose(host(OV), pref("openvino:GPU")).providers[0][1]["device_type"] == "GPU"
    assert choose(host(OV), pref("openvino", "int8")).precision is Precision.INT8


def test_variant_missing_from_artifact() -> None:
    with pytest.raises(ProviderError, match="no int8 variant"):
        choose(host(), pref("cpu", "int8", variants={Precision.FP32: "a"}))
    with pytest.raises(ProviderError, match="no variants"):
        choose(host(), pref(variants={}))


def test_unknown_device_and_dtype() -> None:
    with pytest.raises(ProviderError, match="unknown device"):
        choose(host(), pref("tpu"))
    with pytest.raises(ProviderError, match="unknown dtype"):
        choose(host(), pref("cpu", "bf16"))
    with pytest.raises(ProviderError, match="takes no"):
        choose(host(), pref("cpu:1"))


def test_auto_with_no_usable_provider() -> None:
    empty = Host(providers=())
    with pytest.raises(ProviderError, match="no execution provider"):
        choose(empty, pref())


def test_trt_profiles_buckets_cover_every_length_within_the_budget() -> None:
    p_min, p_opt, p_max = trt_profiles(("input_ids", "attention_mask"), 16384, 512)
    mins = p_min.split(",")
    maxs = p_max.split(",")
    assert len(mins) == len(maxs) == len(p_opt.split(",")) == 2 * 4  # 64,128,256,512
    ids_min = [m for m in mins if m.startswith("input_ids:")]
    ids_max = [m for m in maxs if m.startswith("input_ids:")]
    assert ids_min == ["input_ids:1x1", "input_ids:1x65", "input_ids:1x129", "input_ids:1x257"]
    assert ids_max == [
        "input_ids:512x64",
        "input_ids:252x128",
        "input_ids:127x256",
        "input_ids:63x512",
    ]
    assert trt_profiles(("input_ids",), 100, 30) == (
        "input_ids:1x1",
        "input_ids:3x30",
        "input_ids:100x30",
    )


def test_precision_for_is_what_a_load_with_every_variant_runs() -> None:
    """What a first start exports: the one precision the flags pick on this host."""
    from tei_runtime.loader import precision_for

    assert precision_for(host()) is Precision.FP32
    assert precision_for(host(), dtype="int8") is Precision.INT8
    assert precision_for(host(), dtype="float16") is Precision.FP16
    assert precision_for(NVIDIA) is Precision.FP16
    assert precision_for(NVIDIA, device="cuda", dtype="float32") is Precision.FP32
    assert precision_for(NVIDIA, dtype="int8") is Precision.INT8  # auto lands on the CPU
    with pytest.raises(ProviderError, match="onnxruntime-gpu"):
        precision_for(host(), device="cuda")
    with pytest.raises(ProviderError, match="int8"):
        precision_for(NVIDIA, device="cuda", dtype="int8")
