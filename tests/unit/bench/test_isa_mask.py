"""bench.isa_mask: hiding AVX-512 and VNNI from a process through CPUID faulting.

The processes run under the mask need a CPU and kernel with CPUID faulting and a C compiler;
on a host without them those tests skip, naming what is missing (the pure parts run anywhere).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import isa_mask

CPUINFO = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""


def test_cpuid_faulting_is_read_from_the_flags_line() -> None:
    assert isa_mask.has_cpuid_faulting("model name\t: X\nflags\t\t: fpu avx2 cpuid_fault\n")
    assert not isa_mask.has_cpuid_faulting("flags\t\t: fpu avx2 avx512f\n")
    assert not isa_mask.has_cpuid_faulting("model name : cpuid_fault in a name\n")


def test_a_host_without_cpuid_faulting_is_refused() -> None:
    with pytest.raises(isa_mask.MaskError, match="no CPUID faulting"):
        isa_mask.check_host("flags\t\t: fpu avx2 avx512f\n")


def test_the_mask_goes_ahead_of_an_earlier_preload() -> None:
    earlier = {"LD_PRELOAD": "/x/jemalloc.so", "A": "1",
               "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}  # fmt: skip
    env = isa_mask.masked_env(Path("/m/mask.so"), "avx2", earlier)
    assert env == {
        "LD_PRELOAD": "/m/mask.so /x/jemalloc.so",
        "A": "1",
        isa_mask.MARK: "avx2",
        "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{isa_mask.GLIBC_HWCAPS}",
    }
    alone = isa_mask.masked_env(Path("/m.so"), "avx2", {})
    assert alone["LD_PRELOAD"] == "/m.so"
    assert alone["GLIBC_TUNABLES"] == isa_mask.GLIBC_HWCAPS


def test_the_mask_is_active_only_where_cpuinfo_carries_its_tag() -> None:
    assert isa_mask.active("processor\t: 0\nmodel name\t: AMD EPYC [isa mask: avx2]\n")
    assert not isa_mask.active("model name\t: AMD EPYC\nflags\t: [isa mask: avx2]\n")


def test_a_compiler_that_fails_is_an_error_with_its_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: no such header' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(isa_mask.MaskError, match=r"(?s)could not build.*no such header"):
        isa_mask.build(tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.so"))


def test_an_unknown_mask_is_refused(tmp_path: Path) -> None:
    with pytest.raises(isa_mask.MaskError, match="unknown ISA mask 'sse2'"):
        isa_mask.exec_masked("sse2", ["true"], tmp_path)


def test_a_cache_path_the_preload_would_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(isa_mask.MaskError, match="spaces and colons"):
        isa_mask.build(tmp_path / "my cache")


def _masked_lib(tmp_path: Path) -> Path:
    if not isa_mask.has_cpuid_faulting(CPUINFO):
        pytest.skip("this host has no CPUID faulting (`cpuid_fault` flag): the mask cannot run")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build bench/isa_mask.c")
    return isa_mask.build(tmp_path)


def _run_masked(lib: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = isa_mask.masked_env(lib, "avx2", {"PATH": "/usr/bin:/bin"})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_under_the_mask_cpuinfo_and_cpuid_show_an_avx2_host(tmp_path: Path) -> None:
    lib = _masked_lib(tmp_path)
    code = (
        "from pathlib import Path\n"
        "from tei_runtime.host import probe\n"
        "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
        "text = Path('/proc/cpuinfo').read_text()\n"
        "names = {l for l in text.splitlines() if l.startswith('model name')}\n"
        "print(probe().cpu_class.value, 'avx512' in text, f['AVX512F'], f['AVX2'], f['FMA3'])\n"
        "print(all(n.endswith('[isa mask: avx2]') for n in names), bool(names))\n"
    )
    done = _run_masked(lib, code)
    assert done.returncode == 0, done.stderr
    # numpy's dispatch reads the CPUID instruction itself: AVX-512 is gone there too.
    assert done.stdout.split() == ["avx2", "False", "False", "True", "True", "True", "True"]


def test_the_library_path_is_absolute_whatever_the_cache_was_given_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _masked_lib(tmp_path / "first")  # skips where the mask cannot run
    monkeypatch.chdir(tmp_path)
    lib = isa_mask.build(Path("relative-cache"))
    assert lib.is_absolute() and lib.is_file()


def test_a_real_crash_under_the_mask_still_crashes(tmp_path: Path) -> None:
    lib = _masked_lib(tmp_path)
    done = _run_masked(lib, "import ctypes; ctypes.string_at(0)")
    assert done.returncode == -11  # SIGSEGV, not a hang or a handled return
    killed = _run_masked(lib, "import os, signal, time; os.kill(os.getpid(), signal.SIGSEGV); "
                              "time.sleep(5); print('survived')")  # fmt: skip
    assert killed.returncode == -11 and "survived" not in killed.stdout


def test_a_process_with_its_own_sigsegv_handler_keeps_both(tmp_path: Path) -> None:
    """Python's faulthandler (pytest turns it on) installs a SIGSEGV handler: CPUID stays
    masked, and a real crash still reaches faulthandler, which prints and dies."""
    lib = _masked_lib(tmp_path)
    code = ("import faulthandler; faulthandler.enable()\n"
            "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            "print(f['AVX512F'], f['AVX2'])\n")  # fmt: skip
    done = _run_masked(lib, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    crash = _run_masked(lib, "import faulthandler, ctypes; faulthandler.enable(); "
                             "ctypes.string_at(0)")  # fmt: skip
    assert crash.returncode == -11
    assert "Fatal Python error: Segmentation fault" in crash.stderr
