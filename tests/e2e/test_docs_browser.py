"""`/docs` renders Swagger UI's operation list in a real browser with no route off this host.

Headless Debian Chromium, a fresh profile, every host name but 127.0.0.1 resolving nowhere and
every non-loopback address sent to a proxy that refuses: a page that loads anything from a CDN
renders no operation. `.ci/run` installs `chromium`; without it the test is skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from swagger_ui_bundle import swagger_ui_path

from support.loopback_server import Running
from tei_runtime.manifest import Task

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TEI_PATHS = {"/embed", "/embed_all", "/embed_sparse", "/predict", "/rerank", "/similarity",
             "/tokenize", "/decode", "/info", "/health", "/metrics", "/v1/embeddings"}


def _render(url: str, profile: Path) -> str:
    assert CHROMIUM is not None
    args = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
        # No route out: names other than 127.0.0.1 do not resolve, and any other address goes
        # to a proxy on a closed port (loopback is never proxied).
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",
        "--virtual-time-budget=30000", "--dump-dom", url,
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_docs_page_and_assets_come_from_this_host(serve: Callable[..., Running]) -> None:
    c = serve(Task.EMBED).client
    page = c.get("/docs").text
    refs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert refs and all(ref.startswith("/") and not ref.startswith("//") for ref in refs), refs
    assets = (("/docs/swagger-ui-bundle.js", "javascript"), ("/docs/swagger-ui.css", "css"))
    for ref, kind in assets:
        assert ref in refs
        got = c.get(ref)
        assert got.status_code == 200 and kind in got.headers["content-type"]
        shipped = Path(str(swagger_ui_path)) / ref.removeprefix("/docs/")
        assert got.content == shipped.read_bytes()
    assert c.get("/docs/nothing.js").status_code == 404
    spec = c.get("/api-doc/openapi.json")
    assert spec.json()["paths"].keys() >= TEI_PATHS
    assert c.get("/openapi.json").content == spec.content


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it "
                    "with apt-get); the air-gapped /docs check needs a real browser")
def test_docs_render_the_operations_offline(serve: Callable[..., Running], tmp_path: Path) -> None:
    r = serve(Task.EMBED)
    dom = _render(r.url + "/docs", tmp_path / "profile")
    paths = set(re.findall(r'data-path="([^"]+)"', dom))
    assert paths >= TEI_PATHS, (sorted(paths), dom[:2000])
    assert "opblock-summary-method" in dom
