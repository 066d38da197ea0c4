"""Run inside the network namespace: start tei-serve, wait for /health, POST /embed, write
what happened to a JSON file, stop the server with SIGTERM.

    python airgap_driver.py RESULT.json PORT TEXTS.json -- tei-serve ARGS...
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except (urllib.error.URLError, OSError):
        return 0


def main() -> int:
    result_path, port, texts_path = sys.argv[1], sys.argv[2], sys.argv[3]
    command = sys.argv[sys.argv.index("--") + 1 :]
    texts = json.loads(Path(texts_path).read_text())
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result: dict[str, object] = {}
    deadline = time.monotonic() + 300
    while proc.poll() is None and _get(f"{base}/health") != 200:
        if time.monotonic() > deadline:
            result["error"] = "not healthy in time"
            proc.kill()
            break
        time.sleep(0.2)
    if proc.poll() is None:
        body = json.dumps({"inputs": texts}).encode()
        request = urllib.request.Request(
            f"{base}/embed", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as r:
            result["status"] = r.status
            result["vectors"] = json.loads(r.read())
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    result["returncode"] = proc.returncode
    result["output"] = out
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
