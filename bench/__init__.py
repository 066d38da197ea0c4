"""Side-by-side speed harness: sentence-transformers, infinity-emb, tei_runtime and tei-serve.

`python -m bench` (or `just bench`) runs every engine on the same texts in one session and
writes `bench/results/` (markdown table, JSON records, PNG chart). Nothing here is imported
by the product packages, and the test suite never asserts a figure from it.
"""

import os as _os

# The bench's own onnxruntime (the limits, the profile); its engines get it from clean_env.
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
