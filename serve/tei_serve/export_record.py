"""What a first-start export was made from, kept beside it in the cache, so that a later start
exports again when the checkpoint or the exporter moved instead of serving stale vectors.

The record holds the exporter's fingerprint (its code, cards and toolchain) and the source's:
for a local folder a digest of its files' names, sizes and times (a model saved again into the
same folder changes it), for a hub id the commit it resolved to (a branch that moved on the hub
changes it, as TEI downloads the branch's head at every start). An export from before records
existed has none and is redone once. model_source computes the current record (it is where
serve imports the exporter).
"""

from __future__ import annotations

from pathlib import Path

import msgspec


class ExportRecord(msgspec.Struct, frozen=True, kw_only=True):
    exporter: str
    """tei_export.fingerprint.exporter_fingerprint() when it exported."""
    source: str | None
    """The folder's digest or the hub commit; None when the hub commit could not be known."""


def record_path(artifact: Path) -> Path:
    return artifact.with_name(f"{artifact.name}.export.json")


def read_record(artifact: Path) -> ExportRecord | None:
    try:
        return msgspec.json.decode(record_path(artifact).read_bytes(), type=ExportRecord)
    except (OSError, msgspec.DecodeError):
        return None


def write_record(artifact: Path, record: ExportRecord) -> None:
    path = record_path(artifact)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(msgspec.json.encode(record))  # created with the umask's mode, as the cache
    partial.replace(path)


def why_stale(recorded: ExportRecord | None, current: ExportRecord) -> str | None:
    """Why the cached export must be made again, or None when it still stands."""
    if recorded is None:
        return "no record of what it was exported from (exported by an earlier tei-onnx)"
    if recorded.exporter != current.exporter:
        return "the exporter or its toolchain changed since"
    if current.source is not None and recorded.source != current.source:
        return "the checkpoint changed since"
    return None
