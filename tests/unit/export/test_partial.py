"""What a killed export leaves beside its output is removed by the next export of it, never
a folder a live export is building (tei_export.partial)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tei_export.partial import STALE_AFTER_S, building, remove_stale


def _age(folder: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(folder, (past, past))


def test_a_dead_exports_folder_goes_a_live_one_stays(tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    dead = tmp_path / ".artifact.partial-dead"
    (dead / "trace").mkdir(parents=True)
    (dead / "model.fp32.onnx").write_bytes(b"x" * 100)
    _age(dead, STALE_AFTER_S + 5)
    fresh = tmp_path / ".artifact.partial-fresh"  # made a moment ago, not locked yet
    fresh.mkdir()
    other = tmp_path / ".other.partial-dead"  # another output's: not ours to judge
    other.mkdir()
    _age(other, STALE_AFTER_S + 5)
    with building(out) as live:
        _age(live, STALE_AFTER_S + 5)  # a long step: old, but its lock is held
        assert remove_stale(out) == [dead]
        assert live.is_dir()
    assert not dead.exists() and fresh.is_dir() and other.is_dir()
    assert remove_stale(out) == [live]  # its export ended without renaming it: stale now


def test_building_names_its_folder_after_the_output(tmp_path: Path) -> None:
    with building(tmp_path / "a") as work:
        assert work.parent == tmp_path and work.name.startswith(".a.partial-")
