"""Make the repo's `bench` package importable: it is not installed (not in the wheel), and
without this `import bench` would find this test folder (tests/ is on sys.path) instead."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
sys.modules.pop("bench", None)  # a namespace package for tests/bench, if one was made
