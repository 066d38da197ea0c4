"""What this host offers: onnxruntime's providers, GPUs, TensorRT, and the CPU cores we may use.

`probe()` reads the live host; every reader takes a filesystem root and the environment so
that tests can describe any host with a fake tree. The result is plain data for
`providers.choose`, which decides nothing by itself looking at the machine.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import enum
import importlib.metadata
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

_TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-libs")


# The flags (/proc/cpuinfo) that decide which CPU graph runs fastest, or that operators ask
# about when reading `--print-host`: vector width, fused multiply-add, int8 dot products.
CPU_FEATURES = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "amx_int8",
    "asimd",
    "asimddp",
    "i8mm",
)


class CpuClass(enum.StrEnum):
    """Host classes whose best CPU graph was measured separately (manifest variants name
    them in `hosts`)."""

    AVX512 = "avx512"
    """x86 with AVX-512 (AVX512F and BW)."""
    AVX2 = "avx2"
    """x86 with AVX2 and FMA but no AVX-512 (many AMD EPYC and cloud CPUs)."""
    OTHER = "other"
    """Anything else: older x86, Arm, or a host whose flags could not be read."""


def cpu_class(features: Sequence[str]) -> CpuClass:
    have = set(features)
    if {"avx512f", "avx512bw"} <= have:
        return CpuClass.AVX512
    if {"avx2", "fma"} <= have:
        return CpuClass.AVX2
    return CpuClass.OTHER


def cpu_features(root: Path = Path("/")) -> tuple[str, ...]:
    """CPU_FEATURES this host's first processor lists (x86 `flags`, Arm `Features`)."""
    text = _read(root / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            return tuple(f for f in CPU_FEATURES if f in flags)
    return ()


class Host(msgspec.Struct, frozen=True, kw_only=True):
    providers: tuple[str, ...]
    """onnxruntime.get_available_providers(): what the installed onnxruntime build can run."""
    onnxruntime_version: str = "unknown"
    nvidia_gpus: tuple[str, ...] = ()
    """Names of the NVIDIA GPUs visible to this process (honours CUDA_VISIBLE_DEVICES)."""
    amd_gpu: bool = False
    """/dev/kfd is present: the ROCm kernel driver is loaded and visible to us."""
    tensorrt_version: str | None = None
    """The TensorRT libraries' version, or None when libnvinfer is not installed."""
    cpu_count: int = 1
    """Logical CPUs of the machine."""
    affinity_cores: int = 1
    """CPUs this process may be scheduled on (sched_getaffinity)."""
    cgroup_cores: float | None = None
    """CPU quota of our cgroup (and its parents) in cores, None when unlimited."""
    cpu_features: tuple[str, ...] = ()
    """The CPU's instruction-set extensions that pick a graph (CPU_FEATURES), from
    /proc/cpuinfo; empty where it cannot be read."""

    @property
    def cpu_class(self) -> CpuClass:
        return cpu_class(self.cpu_features)

    @property
    def usable_cores(self) -> int:
        """Threads worth running: affinity, capped by the cgroup quota (floored, at least 1).

        Flooring follows Go's automaxprocs: a thread beyond the quota only gets throttled.
        """
        cores = self.affinity_cores
        if self.cgroup_cores is not None:
            cores = min(cores, math.floor(self.cgroup_cores))
        return max(1, cores)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_dirs(root: Path, controller: str = "cpu") -> list[Path]:
    """Directories holding our cgroup's `controller` files (cpu or memory), our own first,
    then parents.

    In a container with a cgroup namespace /proc/self/cgroup says "/", which maps to the
    mount root; outside one it names a nested path, whose parents can also limit us.
    """
    dirs: list[Path] = []
    text = _read(root / "proc/self/cgroup") or ""
    base = root / "sys/fs/cgroup"
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        names = controllers.split(",")
        if controllers == "":
            mount = base  # cgroup v2 unified hierarchy
        elif controller in names:
            mount = base / controllers
            if not mount.is_dir():
                mount = base / controller
        else:
            continue
        here = mount / rel.lstrip("/")
        while True:
            dirs.append(here)
            if here == mount:
                break
            here = here.parent
    fallbacks = (base, base / "cpu", base / "cpu,cpuacct") if controller == "cpu" else (
        base, base / controller)
    for fallback in fallbacks:
        if fallback not in dirs:
            dirs.append(fallback)
    return dirs


def cgroup_cpu_limit(root: Path = Path("/")) -> float | None:
    """The tightest CPU quota (in cores) over our cgroup and its parents, v2 or v1."""
    limits: list[float] = []
    for directory in _cgroup_dirs(root):
        v2 = _read(directory / "cpu.max")
        if v2 is not None:
            fields = v2.split()
            if len(fields) == 2 and fields[0] != "max":
                with contextlib.suppress(ValueError, ZeroDivisionError):
                    limits.append(int(fields[0]) / int(fields[1]))
            continue
        quota = _read(directory / "cpu.cfs_quota_us")
        period = _read(directory / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            try:
                q, p = int(quota), int(period)
            except ValueError:
                continue
            if q > 0 and p > 0:
                limits.append(q / p)
    return min(limits) if limits else None


# cgroup v1 writes "no limit" as a page-rounded 2^63-1; nothing below 2^60 is that.
_NO_V1_LIMIT = 1 << 60


def memory_available(root: Path = Path("/")) -> int | None:
    """Bytes this process can still take: the kernel's MemAvailable, capped by the tightest
    memory limit over our cgroup and its parents less what each already holds (a container's
    limit, which /proc/meminfo does not show). None when neither can be read."""
    found: list[int] = []
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name == "MemAvailable" and fields and fields[0].isdigit():
            found.append(int(fields[0]) * 1024)
    for directory in _cgroup_dirs(root, "memory"):
        limit = _read(directory / "memory.max")
        used = _read(directory / "memory.current")
        if limit is None:  # v1
            limit = _read(directory / "memory.limit_in_bytes")
            used = _read(directory / "memory.usage_in_bytes")
        if limit is None or used is None or not limit.isdigit() or not used.isdigit():
            continue  # "max": no limit here
        if int(limit) < _NO_V1_LIMIT:
            found.append(max(0, int(limit) - int(used)))
    return min(found) if found else None


def nvidia_gpus(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """GPU model names from the NVIDIA driver's /proc files, filtered by CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    gpu_dir = root / "proc/driver/nvidia/gpus"
    names: list[str] = []
    try:
        entries = sorted(gpu_dir.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        info = _read(entry / "information") or ""
        model = "NVIDIA GPU"
        for line in info.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model":
                model = value.strip()
        names.append(model)
    if not names and any((root / "dev").glob("nvidia[0-9]*")):
        names.append("NVIDIA GPU")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid entry; "-1" or "" hides every GPU.
        kept: list[str] = []
        for v in wanted:
            if v.startswith(("GPU-", "MIG-")) and names:
                # A UUID (MIG slices are named this way); the driver's list gives no UUIDs
                # to match, and a host's GPUs are almost always one model.
                kept.append(names[0])
            elif v.isdigit() and int(v) < len(names):
                kept.append(names[int(v)])
            else:
                break
        names = kept
    return tuple(names)


def tensorrt_version(
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    distributions: Sequence[str] = _TENSORRT_DISTRIBUTIONS,
) -> str | None:
    """The installed TensorRT's version: a pip distribution's, or "unknown" for a system lib."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    if find_library("nvinfer"):
        return "unknown"
    return None


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def probe(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> Host:
    """Probe the live host. Imports onnxruntime here so that host.py itself stays cheap."""
    import onnxruntime as ort

    env = os.environ if env is None else env
    return Host(
        providers=tuple(ort.get_available_providers()),
        onnxruntime_version=str(ort.__version__),
        nvidia_gpus=nvidia_gpus(root, env),
        amd_gpu=(root / "dev/kfd").exists(),
        tensorrt_version=tensorrt_version(),
        cpu_count=os.cpu_count() or 1,
        affinity_cores=affinity_cores(),
        cgroup_cores=cgroup_cpu_limit(root),
        cpu_features=cpu_features(root),
    )
