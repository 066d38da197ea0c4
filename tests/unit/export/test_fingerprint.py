"""The digests a cached export is checked against: the exporter's, and a checkpoint folder's."""

from __future__ import annotations

import os
from pathlib import Path

from tei_export.fingerprint import exporter_fingerprint, exporter_sources, folder_fingerprint


def test_exporter_fingerprint_follows_code_cards_and_toolchain(tmp_path: Path) -> None:
    code = tmp_path / "tei_export"
    cards = tmp_path / "model_cards"
    code.mkdir()
    cards.mkdir()
    (code / "int8.py").write_text("EXCLUDE = ()\n")
    (cards / "bert.toml").write_text("pooling = 'mean'\n")
    sources = (code, cards)
    first = exporter_fingerprint(sources, ("onnx",))
    assert exporter_fingerprint(sources, ("onnx",)) == first
    (code / "int8.py").write_text("EXCLUDE = ('first_down_projection',)\n")
    second = exporter_fingerprint(sources, ("onnx",))
    assert second != first
    (cards / "bert.toml").write_text("pooling = 'cls'\n")
    third = exporter_fingerprint(sources, ("onnx",))
    assert third != second
    assert exporter_fingerprint(sources, ("onnx", "torch")) != third


def test_installed_exporter_sources_hold_the_code_and_the_cards() -> None:
    sources = exporter_sources()
    assert (sources[0] / "api.py").is_file()
    assert any(card for root in sources for card in root.rglob("bert.toml"))
    assert exporter_fingerprint() == exporter_fingerprint(sources)


def test_folder_fingerprint_follows_saved_files_not_hidden_folders(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 64)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text("{}")
    first = folder_fingerprint(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_text("x")
    assert folder_fingerprint(tmp_path) == first

    # Saved again with the same size: only the modification time tells.
    stat = weights.stat()
    weights.write_bytes(b"\1" * 64)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = folder_fingerprint(tmp_path)
    assert second != first
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert folder_fingerprint(tmp_path) != second


def test_folder_fingerprint_walks_a_link_loop_once(tmp_path: Path) -> None:
    """A link back up the tree adds nothing: the same digest as that link as an empty folder
    (followed round, it would add sub/up/config.json, sub/up/sub/up/config.json, ...)."""
    looped, flat = tmp_path / "looped", tmp_path / "flat"
    for root in (looped, flat):
        (root / "sub").mkdir(parents=True)
        (root / "config.json").write_text("{}")
        os.utime(root / "config.json", ns=(1_000_000_000, 1_000_000_000))
    (looped / "sub" / "up").symlink_to(looped, target_is_directory=True)
    (flat / "sub" / "up").mkdir()
    assert folder_fingerprint(looped) == folder_fingerprint(flat)
