"""Stage-by-stage progress on stderr with timings, and the summary table at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tei_runtime.manifest import Manifest


class Progress:
    def __init__(self, *, quiet: bool = False) -> None:
        self.console = Console(stderr=True, quiet=quiet, highlight=False)
        # Warnings say where the artifact differs from what sentence-transformers makes of
        # the checkpoint (a default pooling, a module left out) or an option did nothing:
        # --quiet keeps them.
        self.warnings = Console(stderr=True, highlight=False)
        self.timings: list[tuple[str, float]] = []

    @contextmanager
    def stage(self, name: str, *, announce: bool = True) -> Iterator[None]:
        """`announce`: off a terminal (CI, `docker logs`, a server's first-start export), where
        no spinner shows, say the stage as it starts, so a minute of int8 calibration is not
        silence; the checks that take no time (resolving a folder, the plan) are not, and a
        mistake they find stays the one line printed."""
        start = time.perf_counter()
        if announce and not self.console.is_terminal:
            self.console.print(f"{name} ...")
        with self.console.status(f"{name} ..."):
            yield
        elapsed = time.perf_counter() - start
        self.timings.append((name, elapsed))
        self.console.print(f"[green]✓[/green] {name} [dim]{elapsed:.1f}s[/dim]")

    def note(self, text: str) -> None:
        """What the export did (int8's kept products, a converted tokenizer): --quiet hides it."""
        self.console.print(f"[yellow]![/yellow] {text}")

    def warn(self, text: str) -> None:
        """Where the artifact differs from sentence-transformers' reading of the checkpoint,
        or an option did nothing: printed even with --quiet."""
        self.warnings.print(f"[yellow]![/yellow] {text}")

    def summary(self, manifest: Manifest, where: Path) -> None:
        table = Table(title=f"{manifest.architecture} -> {where}")
        for column in ("variant", "size MB", "fused ops", "min cosine", "max abs err", "tol"):
            table.add_column(column)
        for v in manifest.variants:
            ops = ", ".join(f"{op} {n}" for op, n in sorted(v.fused_ops.items()))
            size_mb = (where / v.file).stat().st_size / 1e6
            table.add_row(
                v.name,
                f"{size_mb:.1f}",
                ops,
                f"{v.validation.min_cosine:.6f}",
                f"{v.validation.max_abs_err:.2e}",
                f"{v.validation.tolerance}",
            )
        self.console.print(table)
        pooling = manifest.pooling.value if manifest.pooling else "-"
        total = sum(t for _, t in self.timings)
        self.console.print(
            f"task {manifest.task.value}, pooling {pooling}, normalize {manifest.normalize}, "
            f"max_input_length {manifest.max_input_length}, {total:.1f}s in all"
        )
