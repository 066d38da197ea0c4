"""The runtime must run with no torch, transformers, onnx or optimum in the process."""

from __future__ import annotations

import json
import subprocess
import sys

from rt_artifacts import Built

FORBIDDEN = ("torch", "transformers", "onnx", "optimum", "sentence_transformers")

SCRIPT = """
import json, sys
import tei_runtime
m = tei_runtime.load(sys.argv[1])
m.embed(["the cat sat"]); m.tokenize(["cat"]); m.embed_all(["cat"])
forbidden = {forbidden!r}
print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] in forbidden)))
"""


def test_loading_and_running_imports_no_torch(embed_artifact: Built) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(forbidden=FORBIDDEN), str(embed_artifact.root)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
