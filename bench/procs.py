"""Process helpers: peak RSS from /proc, descendants, a clean environment, machine facts."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from bench.records import Machine


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (the kernel's resident high-water mark) of pid plus its live descendants."""
    total, seen = 0, False
    for p in tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        if m:
            total, seen = total + int(m.group(1)), True
    return total / 1024 if seen else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of pid and its live descendants, every thread counted."""
    total = 0.0
    for p in tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        # after the command's closing parenthesis: state is field 3, utime 14, stime 15
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: tei-serve reads TEI's env names (HOSTNAME, PORT, MODEL_ID ...),
    and a shell's HOSTNAME would otherwise rebind the server; hubs are never reached."""
    # LD_PRELOAD, GLIBC_TUNABLES and the mark: `--isa-mask` (isa_mask.py) must reach every
    # engine's process.
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "USER", "LD_PRELOAD",
            "GLIBC_TUNABLES", "TEI_BENCH_ISA_MASK")  # fmt: skip
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    env |= {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "PYTHONUNBUFFERED": "1"}
    env |= {"ORT_DISABLE_TELEMETRY": "1"}  # no engine's onnxruntime uploads beside the timing
    return env | extra


def cores() -> int:
    return len(os.sched_getaffinity(0))


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


_ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")


def machine(versions: dict[str, str]) -> Machine:
    info = Path("/proc/cpuinfo").read_text()
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    have = set(flags.group(1).split()) if flags else set()
    mem = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    virt = " (KVM guest)" if "hypervisor" in have else ""
    return Machine(
        cpu=(name.group(1).strip() if name else platform.processor()) + virt,
        cores=cores(),
        isa=[f for f in _ISA if f in have],
        memory_gb=round(int(mem.group(1)) / 1024 / 1024, 1) if mem else 0.0,
        python=platform.python_version(),
        versions=versions,
    )
