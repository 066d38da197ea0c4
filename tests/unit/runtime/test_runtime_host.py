from __future__ import annotations

from pathlib import Path

import pytest

from tei_runtime import host as host_mod
from tei_runtime.host import Host, cgroup_cpu_limit, nvidia_gpus, tensorrt_version


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_in_a_namespace(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "0::/\n")
    _write(tmp_path, "sys/fs/cgroup/cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(1.5)


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "0::/\n")
    _write(tmp_path, "sys/fs/cgroup/cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v2_nested_takes_the_tightest_ancestor(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    _write(tmp_path, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n")
    _write(tmp_path, "sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000\n")
    _write(tmp_path, "sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(3.0)


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    _write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n")
    _write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(2.0)


def test_cgroup_v1_unlimited_quota_is_none(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "4:cpu,cpuacct:/\n")
    _write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    _write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None


MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


def test_memory_available_is_meminfo_without_a_cgroup_limit(tmp_path: Path) -> None:
    from tei_runtime.host import memory_available

    assert memory_available(tmp_path) is None  # nothing readable
    _write(tmp_path, "proc/meminfo", MEMINFO)
    _write(tmp_path, "proc/self/cgroup", "0::/\n")
    _write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    _write(tmp_path, "sys/fs/cgroup/memory.current", "5000000000\n")
    assert memory_available(tmp_path) == 20_000_000 * 1024


def _memory_cgroup(root: Path, cgroup: str, limits: dict[str, tuple[str, str]],
                   files: tuple[str, str] = ("memory.max", "memory.current")) -> Path:
    """A fake host: MEMINFO, /proc/self/cgroup saying `cgroup`, and per cgroup folder under
    sys/fs/cgroup its (limit, usage) written into `files`."""
    _write(root, "proc/meminfo", MEMINFO)
    _write(root, "proc/self/cgroup", cgroup)
    for folder, values in limits.items():
        for name, value in zip(files, values, strict=True):
            _write(root, f"sys/fs/cgroup/{folder}/{name}", value + "\n")
    return root


def test_memory_available_takes_the_tightest_cgroup_headroom(tmp_path: Path) -> None:
    """A container's limit less its usage, the tightest over its cgroup and parents (v2), or
    v1's memory controller; v1's page-rounded 2^63 means no limit."""
    from tei_runtime.host import memory_available

    v2 = _memory_cgroup(tmp_path / "v2", "0::/kubepods/pod1/ctr\n", {
        "kubepods/pod1/ctr": ("4000000000", "1000000000"),
        "kubepods/pod1": ("8000000000", "6500000000"),
    })  # fmt: skip
    assert memory_available(v2) == 1_500_000_000  # the pod's headroom, not the ctr's
    v1 = _memory_cgroup(tmp_path / "v1", "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n", {
        "memory/docker/abc": ("2000000000", "500000000"),
        "memory": ("9223372036854771712", "7000000000"),
    }, files=("memory.limit_in_bytes", "memory.usage_in_bytes"))  # fmt: skip
    assert memory_available(v1) == 1_500_000_000


@pytest.mark.parametrize(
    ("affinity", "quota", "expected"),
    [(16, None, 16), (16, 2.0, 2), (16, 2.5, 2), (16, 0.5, 1), (4, 8.0, 4), (1, None, 1)],
)
def test_usable_cores(affinity: int, quota: float | None, expected: int) -> None:
    h = Host(providers=("CPUExecutionProvider",), affinity_cores=affinity, cgroup_cores=quota)
    assert h.usable_cores == expected


def test_nvidia_gpus_from_proc_and_visible_devices(tmp_path: Path) -> None:
    for i, model in enumerate(["NVIDIA H200", "NVIDIA L4"]):
        _write(
            tmp_path,
            f"proc/driver/nvidia/gpus/0000:0{i}:00.0/information",
            f"Model: \t {model}\nIRQ: 1\n",
        )
    assert nvidia_gpus(tmp_path, {}) == ("NVIDIA H200", "NVIDIA L4")
    assert nvidia_gpus(tmp_path, {"CUDA_VISIBLE_DEVICES": "1"}) == ("NVIDIA L4",)
    assert nvidia_gpus(tmp_path, {"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert nvidia_gpus(tmp_path, {"CUDA_VISIBLE_DEVICES": "-1"}) == ()
    assert nvidia_gpus(tmp_path, {"CUDA_VISIBLE_DEVICES": "0,7,1"}) == ("NVIDIA H200",)
    mig = {"CUDA_VISIBLE_DEVICES": "MIG-4f9e1a2b-0000-1111-2222-333344445555"}
    assert nvidia_gpus(tmp_path, mig) == ("NVIDIA H200",)


def test_nvidia_gpu_from_device_node_only(tmp_path: Path) -> None:
    _write(tmp_path, "dev/nvidia0", "")
    assert nvidia_gpus(tmp_path, {}) == ("NVIDIA GPU",)
    assert nvidia_gpus(tmp_path / "nothing", {}) == ()


def test_tensorrt_version_sources() -> None:
    assert tensorrt_version(lambda _: None, distributions=("no-such-dist-x",)) is None
    assert tensorrt_version(lambda _: "libnvinfer.so.10", distributions=()) == "unknown"
    assert tensorrt_version(lambda _: None, distributions=("numpy",)) is not None


def test_probe_on_this_host_has_cpu(tmp_path: Path) -> None:
    h = host_mod.probe(tmp_path, env={})
    assert "CPUExecutionProvider" in h.providers
    assert h.usable_cores >= 1
    assert h.nvidia_gpus == () and h.amd_gpu is False


EPYC_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2 sha_ni"
XEON_FLAGS = "sse4_2 avx fma avx2 avx512f avx512dq avx512bw avx512_vnni amx_int8 avx_vnni"


@pytest.mark.parametrize(
    ("flags", "features", "cpu_class"),
    [
        (EPYC_FLAGS, ("avx2", "fma"), host_mod.CpuClass.AVX2),
        (
            XEON_FLAGS,
            ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"),
            host_mod.CpuClass.AVX512,
        ),
        ("fpu sse sse2 avx", (), host_mod.CpuClass.OTHER),
    ],
)
def test_cpu_features_and_class_from_cpuinfo(
    tmp_path: Path, flags: str, features: tuple[str, ...], cpu_class: host_mod.CpuClass
) -> None:
    _write(tmp_path, "proc/cpuinfo", f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n")
    assert host_mod.cpu_features(tmp_path) == features
    assert Host(providers=(), cpu_features=features).cpu_class is cpu_class


def test_arm_features_and_unreadable_cpuinfo(tmp_path: Path) -> None:
    _write(tmp_path, "proc/cpuinfo", "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\n")
    assert host_mod.cpu_features(tmp_path) == ("asimd", "asimddp", "i8mm")
    assert Host(providers=(), cpu_features=("asimd",)).cpu_class is host_mod.CpuClass.OTHER
    assert host_mod.cpu_features(tmp_path / "missing") == ()
