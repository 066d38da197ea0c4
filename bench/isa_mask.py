"""Run a command as if on an AVX2 + FMA host without AVX-512, VNNI or AMX.

`python -m bench --isa-mask avx2 ...` re-runs the bench under it; `python -m bench.isa_mask --
CMD ...` runs any command. The mask is `isa_mask.c`, built here with the system's C compiler
and loaded with LD_PRELOAD: it turns on CPUID faulting and answers each CPUID with AVX-512,
VNNI, AMX and BF16 cleared, and serves a /proc/cpuinfo without those flags whose `model name`
ends in " [isa mask: avx2]". onnxruntime's MLAS, OpenBLAS, oneDNN under torch and numpy then
pick the kernels they pick on an AVX2-only CPU (Zen 3, Haswell to Cascade Lake without
AVX-512, many cloud instances), and tei_runtime picks that host class's graph.

What it is not: an AVX2 CPU. Caches, clocks and each instruction's throughput stay the host's.
On a Zen 4, whose AVX-512 runs on 256-bit units, the fp32 GEMM rate barely moves and the int8
rate halves (no VNNI): the kernel choices, and ratios between them, are what it measures.

Needs CPUID faulting: `cpuid_fault` in /proc/cpuinfo (Intel since Ivy Bridge, AMD since Zen 4,
also in many KVM guests) and a C compiler (`cc`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("isa_mask.c")
MASKS = ("avx2",)
MARK = "TEI_BENCH_ISA_MASK"
"""Set (to the mask's name) in the environment of everything run under the mask."""
TAG = "[isa mask: avx2]"
"""What the mask appends to /proc/cpuinfo's `model name` lines."""
GLIBC_HWCAPS = "glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL"
"""glibc reads CPUID before any preload runs: its own string functions are told here."""


class MaskError(RuntimeError):
    """The mask cannot be built or used on this host."""


def active(cpuinfo: str) -> bool:
    """Whether this process reads the masked /proc/cpuinfo (the mask is loaded)."""
    return any(line.startswith("model name") and line.rstrip().endswith(TAG)
               for line in cpuinfo.splitlines())  # fmt: skip


def has_cpuid_faulting(cpuinfo: str) -> bool:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return "cpuid_fault" in value.split()
    return False


def build(cache: Path) -> Path:
    """The mask's shared library, compiled into `cache` once per source text."""
    text = SOURCE.read_bytes()
    # Absolute: a relative LD_PRELOAD entry is ignored by processes started elsewhere (the
    # infinity server runs from its own folder).
    lib = cache.resolve() / "isa-mask" / f"isa_mask-{hashlib.sha256(text).hexdigest()[:12]}.so"
    if any(c.isspace() or c == ":" for c in str(lib)):
        raise MaskError(f"{lib}: LD_PRELOAD splits paths at spaces and colons; use a --cache "
                        "path without them")  # fmt: skip
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise MaskError("no C compiler (cc or gcc) to build bench/isa_mask.c; "
                        "install one (apt install gcc) or set CC")  # fmt: skip
    lib.parent.mkdir(parents=True, exist_ok=True)
    part = lib.with_suffix(f".{os.getpid()}.part")
    done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(part), str(SOURCE), "-ldl"],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise MaskError(f"{cc} could not build {SOURCE}:\n{done.stderr.strip()}")
    part.replace(lib)
    return lib


def masked_env(lib: Path, mask: str, env: dict[str, str]) -> dict[str, str]:
    """`env` with the mask preloaded ahead of anything already in LD_PRELOAD, and glibc's
    own CPU dispatch told the same."""
    preload = " ".join(p for p in (str(lib), env.get("LD_PRELOAD", "")) if p)
    tunables = ":".join(t for t in (env.get("GLIBC_TUNABLES", ""), GLIBC_HWCAPS) if t)
    return env | {"LD_PRELOAD": preload, MARK: mask, "GLIBC_TUNABLES": tunables}


def check_host(cpuinfo: str) -> None:
    if not sys.platform.startswith("linux"):
        raise MaskError("the ISA mask needs Linux (CPUID faulting through arch_prctl)")
    if not has_cpuid_faulting(cpuinfo):
        raise MaskError("this CPU or kernel has no CPUID faulting (no `cpuid_fault` in "
                        "/proc/cpuinfo's flags): the ISA mask cannot hide AVX-512 here")


def exec_masked(mask: str, cmd: list[str], cache: Path) -> None:
    """Replace this process with `cmd` under `mask` (does not return)."""
    if mask not in MASKS:
        raise MaskError(f"unknown ISA mask {mask!r}; known: {', '.join(MASKS)}")
    check_host(Path("/proc/cpuinfo").read_text())
    lib = build(cache)
    env = masked_env(lib, mask, dict(os.environ))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)


def main(argv: list[str]) -> int:
    from bench.run import DEFAULT_CACHE

    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m bench.isa_mask -- CMD [ARGS...]  (runs CMD as on an AVX2 host)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        exec_masked("avx2", argv[1:], DEFAULT_CACHE)
    except MaskError as e:
        print(f"bench.isa_mask: {e}", file=sys.stderr)
        return 1
    return 0  # not reached: exec replaced the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
