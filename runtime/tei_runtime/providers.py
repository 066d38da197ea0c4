"""Execution providers: one ordered table, and a pure choice of provider, precision and options.

`choose(host, preference)` looks only at its arguments, so every branch is tested with fake
hosts on a CPU machine. A provider that was asked for and cannot run is an error naming the
package that brings it; nothing falls back to CPU behind the caller's back.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

import msgspec

from tei_runtime.errors import ProviderError
from tei_runtime.host import CpuClass, Host
from tei_runtime.manifest import Precision


class Device(enum.StrEnum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    TENSORRT = "tensorrt"
    ROCM = "rocm"
    OPENVINO = "openvino"


class DType(enum.StrEnum):
    AUTO = "auto"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"


_DTYPE_PRECISION = {
    DType.FLOAT32: Precision.FP32,
    DType.FLOAT16: Precision.FP16,
    DType.INT8: Precision.INT8,
}
# Other names for the same choice: the manifest's precision names (what `tei-export` writes
# and prints: fp32, fp16, int8) and two common spellings.
_DTYPE_ALIASES = {
    **{precision.value: dtype for dtype, precision in _DTYPE_PRECISION.items()},
    "float": DType.FLOAT32,
    "qint8": DType.INT8,
}


class Gpu(enum.StrEnum):
    NONE = "none"
    NVIDIA = "nvidia"
    AMD = "amd"


class ProviderSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """onnxruntime's provider name."""
    device: Device
    package: str
    """The pip package whose onnxruntime build has this provider."""
    also: str = ""
    """What else the provider needs installed, for the error message."""
    gpu: Gpu
    precisions: tuple[Precision, ...]
    """Precisions this provider may run, the one `dtype="auto"` wants first."""
    io_binding: str | None
    """onnxruntime device type to bind outputs on, None where outputs live in host memory."""


# Order is preference for device="auto": the first whose build, hardware and precision fit.
PROVIDERS: tuple[ProviderSpec, ...] = (
    ProviderSpec(
        name="TensorrtExecutionProvider",
        device=Device.TENSORRT,
        package="onnxruntime-gpu",
        also=" and the TensorRT libraries (pip install tensorrt-cu12)",
        gpu=Gpu.NVIDIA,
        precisions=(Precision.FP16, Precision.FP32),
        io_binding="cuda",
    ),
    ProviderSpec(
        name="CUDAExecutionProvider",
        device=Device.CUDA,
        package="onnxruntime-gpu",
        gpu=Gpu.NVIDIA,
        precisions=(Precision.FP16, Precision.FP32),
        io_binding="cuda",
    ),
    ProviderSpec(
        name="ROCMExecutionProvider",
        device=Device.ROCM,
        package="onnxruntime-rocm",
        gpu=Gpu.AMD,
        precisions=(Precision.FP16, Precision.FP32),
        # ROCm devices are onnxruntime's generic GPU device, which the Python API calls "cuda".
        io_binding="cuda",
    ),
    ProviderSpec(
        name="OpenVINOExecutionProvider",
        device=Device.OPENVINO,
        package="onnxruntime-openvino",
        gpu=Gpu.NONE,
        precisions=(Precision.FP32, Precision.INT8, Precision.FP16),
        io_binding=None,
    ),
    ProviderSpec(
        name="CPUExecutionProvider",
        device=Device.CPU,
        package="onnxruntime",
        gpu=Gpu.NONE,
        # fp16 runs on CPU when asked for (onnxruntime casts around the ops it has no fp16
        # kernel for) at about fp32's speed and nothing gained: auto takes it last.
        precisions=(Precision.FP32, Precision.INT8, Precision.FP16),
        io_binding=None,
    ),
)

_BY_DEVICE = {spec.device: spec for spec in PROVIDERS}

# TensorRT optimisation profiles: sequence buckets double from here up to max_input_length.
TRT_FIRST_BUCKET = 64
TRT_MAX_BATCH = 512
TRT_WORKSPACE_BYTES = 4 << 30


class Preference(msgspec.Struct, frozen=True, kw_only=True):
    device: str = "auto"
    """auto|cpu|cuda|tensorrt|rocm|openvino, optionally `:N` for a GPU index
    (cuda:1) or `:DEVICE` for OpenVINO's device type (openvino:GPU)."""
    dtype: str = "auto"
    variants: dict[Precision, str]
    """The artifact's variants: precision -> the graph file's sha256 (keys the TensorRT
    engine cache, so a re-exported graph never meets a stale engine)."""
    cache_dir: Path | None = None
    max_batch_tokens: int = 16384
    max_input_length: int = 512
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    intra_op_threads: int | None = None
    gpu_mem_limit: int | None = None
    """Bytes the CUDA/ROCm arena may grow to; None lets it use the device."""


class ProviderChoice(msgspec.Struct, frozen=True, kw_only=True):
    provider: str
    device: Device
    precision: Precision
    providers: list[tuple[str, dict[str, str]]]
    """What to hand to onnxruntime.InferenceSession(providers=...), best first."""
    intra_op_threads: int
    inter_op_threads: int = 1
    io_binding: str | None = None
    device_id: int = 0
    notes: list[str] = msgspec.field(default_factory=list)
    """Why this was chosen, for `--print-host`."""


def parse_device(device: str) -> tuple[Device, str | None]:
    if not isinstance(device, str):
        raise ProviderError(f"device must be a string such as cpu or cuda:1; got {device!r}")
    name, _, arg = device.strip().lower().partition(":")
    try:
        parsed = Device(name)
    except ValueError:
        names = "|".join(d.value for d in Device)
        raise ProviderError(f"unknown device {device!r}; use one of {names}") from None
    if arg and parsed in (Device.AUTO, Device.CPU):
        raise ProviderError(f"device {device!r} takes no `:` argument")
    if parsed is Device.OPENVINO:
        return parsed, device.strip().partition(":")[2] or None
    return parsed, arg or None


def precision_named(name: str) -> Precision:
    """A variant's precision by any name `parse_dtype` takes (fp16, float16, FP16, ...), for
    `tei-export --variants`; ProviderError for auto or an unknown name."""
    dtype = parse_dtype(name)
    if dtype is DType.AUTO:
        raise ProviderError("auto names no one precision; use fp32, fp16 or int8")
    return _DTYPE_PRECISION[dtype]


def parse_dtype(dtype: str) -> DType:
    """TEI's `--dtype` names (float32, float16), int8 and auto, or an alias such as fp32."""
    if not isinstance(dtype, str):
        raise ProviderError(f"dtype must be a string such as auto or int8; got {dtype!r}")
    name = dtype.strip().lower()
    if name in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[name]
    try:
        return DType(name)
    except ValueError:
        names = "|".join(d.value for d in DType)
        raise ProviderError(
            f"unknown dtype {dtype!r}; use one of {names} (or fp32, fp16)"
        ) from None


def _hardware_missing(spec: ProviderSpec, host: Host) -> str | None:
    if spec.gpu is Gpu.NVIDIA and not host.nvidia_gpus:
        return "no NVIDIA GPU is visible (driver, /dev/nvidia*, CUDA_VISIBLE_DEVICES)"
    if spec.gpu is Gpu.AMD and not host.amd_gpu:
        return "no AMD GPU is visible to this process (/dev/kfd is missing)"
    if spec.device is Device.TENSORRT and host.tensorrt_version is None:
        return "the TensorRT libraries (libnvinfer) are not installed: pip install tensorrt-cu12"
    return None


def _missing_build(spec: ProviderSpec, host: Host) -> str:
    have = ", ".join(host.providers) or "none"
    # The GPU/OpenVINO builds ship the same `onnxruntime` module, so they replace the CPU one.
    install = f"pip uninstall onnxruntime && pip install {spec.package}"
    return (
        f"device={spec.device.value} needs {spec.name}, which this onnxruntime build "
        f"({host.onnxruntime_version}) does not have (it has: {have}); install "
        f"{spec.package} in place of onnxruntime ({install}){spec.also}"
    )


def _precision(spec: ProviderSpec, dtype: DType, have: tuple[Precision, ...]) -> Precision | None:
    """The precision to run, None when auto finds nothing fitting. Raises for explicit misfits."""
    if dtype is DType.AUTO:
        # The spec's order is the preference; later entries only serve artifacts without the
        # first (an artifact exported with int8 only still runs on CPU).
        return next((p for p in spec.precisions if p in have), None)
    wanted = _DTYPE_PRECISION[dtype]
    if wanted not in spec.precisions:
        raise ProviderError(
            f"dtype={dtype.value} cannot run on {spec.name}: int8 variants are quantised for "
            f"CPUs; use device=cpu (or openvino) for int8, or dtype=float16/float32 on a GPU"
        )
    if wanted not in have:
        names = ", ".join(p.value for p in have)
        raise ProviderError(
            f"dtype={dtype.value}: the artifact has no {wanted.value} variant (it has: {names})"
        )
    return wanted


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "unknown"


def trt_profiles(
    input_names: tuple[str, ...], max_batch_tokens: int, max_input_length: int
) -> tuple[str, str, str]:
    """TensorRT min/opt/max shape strings with one profile per sequence-length bucket.

    A single profile would have to allow max_batch_tokens rows of max_input_length tokens;
    buckets (1-64, 65-128, ... up to max_input_length) each allow only the rows a token
    budget lets through at their shortest length, so engines stay small and no request
    shape falls outside every profile (which would make onnxruntime rebuild the engine).
    """
    buckets: list[tuple[int, int]] = []
    lo, hi = 1, min(TRT_FIRST_BUCKET, max_input_length)
    while True:
        buckets.append((lo, hi))
        if hi >= max_input_length:
            break
        lo, hi = hi + 1, min(hi * 2, max_input_length)
    mins: list[str] = []
    opts: list[str] = []
    maxs: list[str] = []
    for lo, hi in buckets:
        batch_max = max(1, min(TRT_MAX_BATCH, max_batch_tokens // lo))
        batch_opt = max(1, min(batch_max, max_batch_tokens // hi))
        for name in input_names:
            mins.append(f"{name}:1x{lo}")
            opts.append(f"{name}:{batch_opt}x{hi}")
            maxs.append(f"{name}:{batch_max}x{hi}")
    return ",".join(mins), ",".join(opts), ",".join(maxs)


def _gpu_id(arg: str | None, host: Host, spec: ProviderSpec) -> int:
    if arg is None:
        return 0
    if not arg.isdigit():
        raise ProviderError(f"device {spec.device.value}:{arg}: the index must be a number")
    index = int(arg)
    count = len(host.nvidia_gpus) if spec.gpu is Gpu.NVIDIA else None
    if count is not None and index >= count:
        raise ProviderError(
            f"device {spec.device.value}:{index}: only {count} NVIDIA GPU(s) are visible"
        )
    return index


def _options(
    spec: ProviderSpec,
    host: Host,
    pref: Preference,
    precision: Precision,
    arg: str | None,
    threads: int,
) -> tuple[list[tuple[str, dict[str, str]]], int]:
    cpu: tuple[str, dict[str, str]] = ("CPUExecutionProvider", {})
    if spec.device is Device.CPU:
        return [cpu], 0
    if spec.device is Device.OPENVINO:
        ov: dict[str, str] = {"device_type": (arg or "CPU").upper(), "num_of_threads": str(threads)}
        if pref.cache_dir is not None:
            ov["cache_dir"] = str(pref.cache_dir / "openvino")
        return [(spec.name, ov), cpu], 0
    device_id = _gpu_id(arg, host, spec)
    arena: dict[str, str] = {
        "device_id": str(device_id),
        "arena_extend_strategy": "kSameAsRequested",
    }
    if pref.gpu_mem_limit is not None:
        arena["gpu_mem_limit"] = str(pref.gpu_mem_limit)
    if spec.device is Device.ROCM:
        return [(spec.name, {**arena, "miopen_conv_exhaustive_search": "0"}), cpu], device_id
    cuda = {**arena, "cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": "1"}
    if spec.device is Device.CUDA:
        return [(spec.name, cuda), cpu], device_id
    gpu_name = host.nvidia_gpus[device_id] if device_id < len(host.nvidia_gpus) else "gpu"
    key = "-".join(
        (
            pref.variants.get(precision, "")[:16] or "nosha",
            _slug(gpu_name),
            f"trt{_slug(host.tensorrt_version or 'unknown')}",
            f"ort{_slug(host.onnxruntime_version)}",
        )
    )
    cache_root = pref.cache_dir if pref.cache_dir is not None else Path(".tei-onnx-cache")
    cache = cache_root / "tensorrt" / key
    p_min, p_opt, p_max = trt_profiles(
        pref.input_names, pref.max_batch_tokens, pref.max_input_length
    )
    trt = {
        "device_id": str(device_id),
        "trt_fp16_enable": "True" if precision is Precision.FP16 else "False",
        "trt_max_workspace_size": str(TRT_WORKSPACE_BYTES),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": str(cache),
        "trt_profile_min_shapes": p_min,
        "trt_profile_opt_shapes": p_opt,
        "trt_profile_max_shapes": p_max,
    }
    # CUDA takes the nodes TensorRT rejects; CPU the few neither has kernels for.
    return [(spec.name, trt), ("CUDAExecutionProvider", cuda), cpu], device_id


def choose(host: Host, preference: Preference) -> ProviderChoice:
    device, arg = parse_device(preference.device)
    dtype = parse_dtype(preference.dtype)
    have = tuple(preference.variants)
    if not have:
        raise ProviderError("the artifact lists no variants")
    notes: list[str] = []
    spec: ProviderSpec | None = None
    precision: Precision | None = None
    if device is Device.AUTO:
        for candidate in PROVIDERS:
            if candidate.name not in host.providers:
                continue
            why = _hardware_missing(candidate, host)
            if why is not None:
                notes.append(f"skipped {candidate.name}: {why}")
                continue
            if dtype is not DType.AUTO and _DTYPE_PRECISION[dtype] not in candidate.precisions:
                notes.append(f"skipped {candidate.name}: it does not run dtype={dtype.value}")
                continue
            found = _precision(candidate, dtype, have)
            if found is None:
                notes.append(f"skipped {candidate.name}: no variant it runs by default")
                continue
            spec, precision = candidate, found
            break
        if spec is None or precision is None:
            raise ProviderError(
                "no execution provider of this host can run the artifact ("
                + "; ".join(notes or ["onnxruntime lists no usable provider"])
                + ")"
            )
    else:
        spec = _BY_DEVICE[device]
        if spec.name not in host.providers:
            raise ProviderError(_missing_build(spec, host))
        why = _hardware_missing(spec, host)
        if why is not None:
            raise ProviderError(f"device={device.value}: {why}")
        precision = _precision(spec, dtype, have)
        if precision is None:
            names = ", ".join(p.value for p in have)
            raise ProviderError(
                f"device={device.value}: no variant of the artifact ({names}) runs there by "
                f"default; pass an explicit dtype"
            )
    threads = preference.intra_op_threads or host.usable_cores
    if preference.intra_op_threads is None:
        notes.append(
            f"intra-op threads {threads}: affinity {host.affinity_cores}, cgroup quota "
            f"{'none' if host.cgroup_cores is None else f'{host.cgroup_cores:g}'}"
        )
    providers, device_id = _options(spec, host, preference, precision, arg, threads)
    return ProviderChoice(
        provider=spec.name,
        device=spec.device,
        precision=precision,
        providers=providers,
        intra_op_threads=threads,
        io_binding=spec.io_binding,
        device_id=device_id,
        notes=notes,
    )


def graph_cpu_class(choice: ProviderChoice, host: Host) -> CpuClass | None:
    """The CPU class whose measured graph a load should take: the host's on the CPU
    provider, None (the precision's default graph) on GPUs and OpenVINO, which compile the
    graph their own way."""
    return host.cpu_class if choice.device is Device.CPU else None
