"""The order of /rerank's ranks and /predict's labels (tei_serve.serving.highest_first)."""

from __future__ import annotations

from tei_serve.serving import highest_first


def test_highest_first_orders_ties_as_tei() -> None:
    """TEI sorts ascending (stable) and reverses: ties come last index first."""
    scored = [("a", 0.5), ("b", 0.9), ("c", 0.5), ("d", 0.1), ("e", 0.5)]
    assert [k for k, _ in highest_first(scored, lambda p: p[1])] == ["b", "e", "c", "a", "d"]
    assert highest_first([], lambda p: 0.0) == []
