"""What every artifact exported during a test session measured: per variant, its fused-op
counts and its validation against PyTorch. Printed at the end of the run so a CI log carries
the per-card figures the parity suite checked (the checks themselves live in the tests)."""

from __future__ import annotations

from pathlib import Path

from tei_runtime.errors import ManifestError
from tei_runtime.manifest import MANIFEST_NAME, Manifest, read_manifest

COLUMNS = ("artifact", "card", "task", "variant", "graph", "min cosine", "max abs err", "fused ops")


def _found(base: Path) -> list[tuple[Path, Manifest]]:
    found = []
    for path in sorted(base.rglob(MANIFEST_NAME)):
        try:
            found.append((path.parent, read_manifest(path.parent)))
        except ManifestError:
            continue  # a test's deliberately broken artifact, or a half-written one
    return found


def report_lines(base: Path) -> list[str]:
    """One markdown table row per variant of every artifact under `base`; [] when none."""
    rows = []
    for artifact, manifest in _found(base):
        where = artifact.relative_to(base).as_posix()
        for v in manifest.variants:
            ops = ", ".join(f"{op} {n}" for op, n in sorted(v.fused_ops.items()) if n)
            rows.append(
                f"| {where} | {manifest.card} | {manifest.task.value} | {v.name} | "
                f"{v.graph.value} | {v.validation.min_cosine:.6f} | "
                f"{v.validation.max_abs_err:.2e} | {ops or 'none'} |"
            )
    if not rows:
        return []
    return ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS), *rows]
