"""Digests of what an artifact was made from: the exporter and its toolchain, and a checkpoint
folder's files. A cached export is redone when either moves (the server's first-start cache,
the bench's artifact cache). Imports nothing heavy: the server computes these at every start.
"""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

from tei_export.cards import cards_dir
from tei_runtime.manifest import SCHEMA_VERSION

# What changes the graph or its numbers beside our own code: a new transformers can change a
# model's modelling code, a new onnxruntime its fusions.
TOOLCHAIN = ("torch", "transformers", "sentence-transformers", "onnx", "onnxscript", "onnxruntime")


def exporter_sources() -> tuple[Path, ...]:
    """The package, and the model cards where they sit outside it (a checkout; a wheel
    carries them inside)."""
    package, cards = Path(__file__).resolve().parent, cards_dir().resolve()
    return (package,) if cards.is_relative_to(package) else (package, cards)


def exporter_fingerprint(
    sources: tuple[Path, ...] | None = None, dists: tuple[str, ...] = TOOLCHAIN
) -> str:
    """A digest of the exporter's code, model cards, the manifest schema and the toolchain's
    versions. The package version alone is no key: it stayed 0.1.0 while the int8 scheme and
    the CPU graph changed, and cached artifacts then went on being served stale."""
    digest = hashlib.sha256(f"schema={SCHEMA_VERSION}\0".encode())
    for root in sources if sources is not None else exporter_sources():
        files = (p for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc")
        for path in sorted(files):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes())
    for dist in dists:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{dist}={version}\0".encode())
    return digest.hexdigest()[:16]


def folder_fingerprint(folder: Path) -> str:
    """A digest of every file's path, size and modification time under FOLDER (hidden
    folders such as .git and .cache left out). Saving new weights into the folder changes it;
    reading the weights is not needed, so it costs milliseconds on a multi-GB checkpoint."""
    digest = hashlib.sha256()
    entries: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for top, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:  # a link back up the tree: walked once
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            path = Path(top) / name
            try:
                stat = path.stat()
            except FileNotFoundError:  # a dangling link
                continue
            entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    for relative, size, mtime in sorted(entries):
        digest.update(f"{relative}\0{size}\0{mtime}\0".encode())
    return digest.hexdigest()[:16]
