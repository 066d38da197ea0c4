"""Run the real CLI serving path (uvicorn in the main thread, its signal handlers) over the
fake model: `python serve_fake.py TOKENIZER_JSON PORT DELAY_S [GRACE_S]`; with GRACE_S the
shutdown grace period is that short and every request is a batch of its own."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_model import FakeModel

from tei_serve import cli
from tei_serve.cli import serve
from tei_serve.serving import Serving
from tei_serve.settings import Settings

model = FakeModel(Path(sys.argv[1]))
model.delay = float(sys.argv[3])
one_per_batch: int | None = None
if len(sys.argv) > 4:
    cli.SHUTDOWN_GRACE_SECONDS = int(sys.argv[4])
    cli.SHED_MARGIN_SECONDS = 1.5
    one_per_batch = 1
settings = Settings(hostname="127.0.0.1", port=int(sys.argv[2]), tokenization_workers=2,
                    prometheus_port=0, max_batch_requests=one_per_batch)
ok = serve(Serving(settings=settings, model=model, model_id="fake/embed"))
print("served" if ok else "failed", flush=True)
sys.exit(0 if ok else 1)
