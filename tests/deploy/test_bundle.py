"""Bundles: pack -> verify -> unpack round trip, and every way a tampered bundle is refused.

A refused bundle must name the file that is wrong: the operator has to know what to re-copy.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tei_runtime
from tei_bundle import BUNDLE_MANIFEST, BundleError
from tei_bundle import archive as bundle
from tei_bundle import cli as bundle_cli
from tei_serve.model_source import resolve


def _member_offset(tar_path: Path, name: str) -> int:
    with tarfile.open(tar_path) as tar:
        return tar.getmember(name).offset_data


def _flip_byte(tar_path: Path, name: str, at: int = 10) -> None:
    offset = _member_offset(tar_path, name) + at
    data = bytearray(tar_path.read_bytes())
    data[offset] ^= 0xFF
    tar_path.write_bytes(bytes(data))


def _rewrite_without(src: Path, dst: Path, drop: str) -> None:
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for member in tin:
            if member.name != drop:
                tout.addfile(member, tin.extractfile(member) if member.isfile() else None)


def test_round_trip_serves_the_same_vectors(toy_artifact: Path, tmp_path: Path) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    listing = bundle.verify(tar)
    names = {f.path for f in listing.files}
    assert names == {p.name for p in toy_artifact.iterdir()}
    with tarfile.open(tar) as t:
        assert t.getnames()[0] == BUNDLE_MANIFEST
    out = bundle.unpack(tar, tmp_path / "unpacked")
    bundle.verify_folder(out)
    texts = ["hello world", "the cat sat on the mat"]
    expected = tei_runtime.load(toy_artifact, device="cpu").embed(texts)
    got = tei_runtime.load(out, device="cpu").embed(texts)
    np.testing.assert_array_equal(got, expected)


def test_pack_is_deterministic(toy_artifact: Path, tmp_path: Path) -> None:
    a = bundle.write_bundle(toy_artifact, tmp_path / "a.tar").read_bytes()
    b = bundle.write_bundle(toy_artifact, tmp_path / "b.tar").read_bytes()
    assert a == b


def test_pack_refuses_a_corrupt_artifact(toy_artifact: Path, tmp_path: Path) -> None:
    graph = toy_artifact / "model.fp32.onnx"
    graph.write_bytes(graph.read_bytes() + b"x")
    with pytest.raises(tei_runtime.ManifestError, match=r"model\.fp32\.onnx"):
        bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    assert not (tmp_path / "toy.tar").exists()
    assert list(tmp_path.glob(".toy.tar.*")) == []


@pytest.mark.parametrize("name", ["model.fp32.onnx", "tokenizer.json", "manifest.json"])
def test_changed_byte_names_the_file(toy_artifact: Path, tmp_path: Path, name: str) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    _flip_byte(tar, name)
    with pytest.raises(BundleError, match=rf"{name}: sha256 mismatch"):
        bundle.verify(tar)
    with pytest.raises(BundleError, match=rf"{name}: sha256 mismatch"):
        bundle.unpack(tar, tmp_path / "out")
    # Nothing half-unpacked is left behind for a later start to trust.
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy", "toy.tar"]


@pytest.mark.parametrize("name", ["model.fp32.onnx", "tokenizer_config.json"])
def test_missing_file_names_the_file(toy_artifact: Path, tmp_path: Path, name: str) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cut = tmp_path / "cut.tar"
    _rewrite_without(tar, cut, name)
    with pytest.raises(BundleError, match=rf"{name} is missing"):
        bundle.verify(cut)


def test_extra_file_is_refused(toy_artifact: Path, tmp_path: Path) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    extra = tmp_path / "evil.py"
    extra.write_text("print('hi')\n")
    with tarfile.open(tar, "a") as t:
        t.add(extra, arcname="evil.py")
    with pytest.raises(BundleError, match=r"evil\.py is in the tar but not in"):
        bundle.verify(tar)


def test_path_escape_is_refused(toy_artifact: Path, tmp_path: Path) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    with tarfile.open(tar, "a") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 0
        t.addfile(info)
    with pytest.raises(BundleError, match=r"escapes the bundle folder"):
        bundle.unpack(tar, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_not_a_bundle(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    other = tmp_path / "x.txt"
    other.write_text("x")
    with tarfile.open(plain, "w") as t:
        t.add(other, arcname="x.txt")
    assert not bundle.is_bundle(plain)
    with pytest.raises(BundleError, match="not a tei-onnx bundle"):
        bundle.verify(plain)
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"\x00not a tar" * 100)
    with pytest.raises(BundleError, match=r"garbage\.tar"):
        bundle.verify(garbage)


def test_unpacked_folder_is_verified_by_resolve(toy_artifact: Path, tmp_path: Path) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    out = bundle.unpack(tar, tmp_path / "unpacked")
    assert resolve(str(out))[0] == out
    (out / "tokenizer_config.json").write_text("{}\n")
    with pytest.raises(BundleError, match=r"tokenizer_config\.json: sha256 mismatch"):
        resolve(str(out))
    (out / "tokenizer_config.json").unlink()
    with pytest.raises(BundleError, match=r"tokenizer_config\.json: missing"):
        resolve(str(out))


def test_resolve_unpacks_a_bundle_once_into_the_hub_cache(
    toy_artifact: Path, tmp_path: Path
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    first, reported = resolve(str(tar), cache_dir=str(cache))
    assert reported == str(tar)
    assert first.parent == cache / "tei-onnx" / "bundles"
    assert first.name.startswith("toy-")
    assert json.loads((first / "manifest.json").read_text())["source"]["model_id"] == "test/toy"
    stamp = (first / "model.fp32.onnx").stat().st_mtime_ns
    second, _ = resolve(str(tar), cache_dir=str(cache))
    assert second == first
    assert (second / "model.fp32.onnx").stat().st_mtime_ns == stamp  # reused, not unpacked again


def test_resolve_never_reuses_an_unpack_for_a_tampered_bundle(
    toy_artifact: Path, tmp_path: Path
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    resolve(str(tar), cache_dir=str(cache))
    _flip_byte(tar, "model.fp32.onnx")
    with pytest.raises(BundleError, match=r"model\.fp32\.onnx: sha256 mismatch"):
        resolve(str(tar), cache_dir=str(cache))


def test_read_only_cache_falls_back_to_a_temporary_folder(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("")  # mkdir under a file fails like a read-only mount does
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with caplog.at_level(logging.WARNING):
        folder, _ = resolve(str(tar), cache_dir=str(blocker))
    assert folder.parent.parent.parent == tmp_path / "tmp"
    bundle.verify_folder(folder)
    assert "is not writable" in caplog.text and str(folder.parent) in caplog.text


def test_a_killed_servers_temporary_unpack_is_removed_by_the_next(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each server with a read-only cache unpacks into a temporary folder of its own, gone
    at exit; one SIGKILLed (atexit never ran) left it behind, every time: the next server
    removes those no live server holds."""
    import subprocess
    import sys
    import tempfile

    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    code = (f"import os, tei_bundle.archive as a; from pathlib import Path; a.unpack_cached("
            f"Path({str(tar)!r}), Path({str(blocker)!r})); os._exit(9)")  # fmt: skip
    killed = subprocess.run([sys.executable, "-c", code], env={**os.environ}, check=False)
    assert killed.returncode == 9
    [left] = list(tmp.glob(".tei-bundle.process-*"))
    live = bundle.unpack_cached(tar, blocker)  # this process's own, held while it runs
    assert not left.exists()
    assert list(tmp.glob(".tei-bundle.process-*")) == [live.parent.parent]
    bundle.unpack_cached(tar, blocker)  # a second call sweeps: its own is held, so it stays
    assert live.is_dir()


def test_a_read_only_cache_with_the_unpack_already_there_is_used(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache filled once, then mounted read-only: its verified unpack is served, not
    unpacked again into a temporary folder."""
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    first = bundle.unpack_cached(tar, cache)
    monkeypatch.setattr(bundle, "_writable", lambda folder: PermissionError(30, "Read-only"))
    assert bundle.unpack_cached(tar, cache) == first


def test_a_cached_folder_without_its_file_list_is_unpacked_again(
    toy_artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """tei-bundle.json gone from a cached unpack: no file list, not trusted, moved aside and
    unpacked again (it used to stop every start with "already exists; unpack into a new
    folder", advice for tei-bundle users)."""
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    first = bundle.unpack_cached(tar, cache)
    (first / BUNDLE_MANIFEST).unlink()
    with caplog.at_level(logging.WARNING):
        assert bundle.unpack_cached(tar, cache) == first
    bundle.verify_folder(first)
    assert "holds no tei-bundle.json" in caplog.text


def test_a_concurrent_unpack_that_finishes_first_is_used(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers start on one bundle and one cache: the one whose rename comes second
    finds the other's folder in place (ENOTEMPTY) and serves from it."""
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    check = bundle._check
    other: list[Path] = []
    raced = False

    def check_while_another_server_finishes(source: Path, tmp: Path) -> object:
        nonlocal raced
        listing = check(source, tmp)
        if not raced:  # the other server's whole unpack lands while ours verifies
            raced = True
            target = tmp.parent / tmp.name[1:].rsplit(".", 1)[0]  # ".<target>.<random>"
            other.append(bundle.unpack(source, target))
        return listing

    monkeypatch.setattr(bundle, "_check", check_while_another_server_finishes)
    folder = bundle.unpack_cached(tar, cache)
    assert other == [folder]
    bundle.verify_folder(folder)
    assert [p.name for p in cache.iterdir()] == [folder.name]  # our copy went


def test_cli(toy_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tar = tmp_path / "toy.tar"
    assert bundle_cli.main(["pack", str(toy_artifact), str(tar)]) == 0
    assert bundle_cli.main(["verify", str(tar)]) == 0
    assert bundle_cli.main(["unpack", str(tar), str(tmp_path / "u")]) == 0
    assert bundle_cli.main(["verify", str(tmp_path / "u")]) == 0
    _flip_byte(tar, "tokenizer.json")
    capsys.readouterr()
    assert bundle_cli.main(["verify", str(tar)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tei-bundle: error: ") and "tokenizer.json: sha256 mismatch" in err


def test_cli_path_mistakes_are_one_line(
    toy_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An artifact folder verifies against its manifest; a folder, a file or the artifact
    itself where a new path belongs is one line, never a traceback."""
    assert bundle_cli.main(["verify", str(toy_artifact)]) == 0
    assert "an artifact" in capsys.readouterr().out
    note = tmp_path / "notes.txt"
    note.write_text("x")
    for argv in (
        ["pack", str(toy_artifact), str(tmp_path)],
        ["pack", str(toy_artifact), str(tmp_path / "new-folder") + "/"],  # a folder meant
        ["pack", str(toy_artifact), str(note / "x.tar")],
        ["pack", str(toy_artifact), str(toy_artifact / "self.tar")],
        ["unpack", str(tmp_path / "none.tar"), str(tmp_path / "u")],
        ["verify", str(tmp_path)],
    ):
        assert bundle_cli.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("tei-bundle: error: ") and err.count("\n") == 1, (argv, err)
    assert not (toy_artifact / "self.tar").exists()
    assert not (tmp_path / "new-folder").exists()
    tar = tmp_path / "toy.tar"
    assert bundle_cli.main(["pack", str(toy_artifact), str(tar)]) == 0
    assert bundle_cli.main(["unpack", str(tar), str(note / "u")]) == 1
    assert capsys.readouterr().err.startswith("tei-bundle: error: ")


def test_bundle_and_unpack_are_readable_by_other_users(toy_artifact: Path, tmp_path: Path) -> None:
    # The images' user (1000) reads a bundle packed by someone else: not 0600 from mkstemp.
    before = os.umask(0o022)
    try:
        tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
        out = bundle.unpack(tar, tmp_path / "unpacked")
    finally:
        os.umask(before)
    assert stat.S_IMODE(tar.stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}


def test_a_strict_umask_is_kept(toy_artifact: Path, tmp_path: Path) -> None:
    before = os.umask(0o077)
    try:
        tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    finally:
        os.umask(before)
    assert stat.S_IMODE(tar.stat().st_mode) == 0o600


def test_nowhere_to_unpack_is_one_error_naming_the_cache(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker's --read-only without a /tmp tmpfs: neither the cache nor a temporary folder
    can be written."""
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("")
    import tempfile

    def no_tmp(*_: object, **__: object) -> str:
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "mkdtemp", no_tmp)
    monkeypatch.setattr(tempfile, "gettempdir", no_tmp)
    with pytest.raises(BundleError, match=r"nowhere to unpack it: .*not writable"):
        bundle.unpack_cached(tar, blocker / "cache")


def test_an_unreadable_bundle_is_one_error(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")

    def denied(path: Path) -> str:  # what a 0600 bundle of another user gives a non-root user
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(bundle, "bundle_digest", denied)
    with pytest.raises(BundleError, match=r"toy.tar: cannot read it \(Permission denied\)"):
        resolve(str(tar), cache_dir=str(tmp_path / "cache"))


def test_a_write_that_fails_while_unpacking_is_not_blamed_on_the_bundle(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """A full disk (here: a file-size limit, EFBIG) is a write error naming the folder, not
    'cannot read' the bundle; nothing half-written stays."""
    import resource
    import signal

    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    cache.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (16, hard))
    try:
        with pytest.raises(BundleError) as refused:
            bundle.unpack_cached(tar, cache)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    message = str(refused.value)
    assert "cannot write" in message and "the bundle was not at fault" in message, message
    assert "cannot read" not in message
    assert list(cache.iterdir()) == []


def test_unpack_into_a_folder_that_cannot_be_written_is_one_error(
    toy_artifact: Path, tmp_path: Path
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder under a file cannot be made, as on a read-only mount
    with pytest.raises(BundleError, match=r"cannot unpack into .*the bundle was not at fault"):
        bundle.unpack(tar, blocker / "out")


def test_a_damaged_cached_unpack_is_unpacked_again(
    toy_artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bundle is intact but its cached unpack lost a byte on disk: the server unpacks it
    again (warning what it found) instead of refusing to start."""
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cache = tmp_path / "cache"
    first = bundle.unpack_cached(tar, cache)
    (first / "tokenizer_config.json").write_text("{}\n")
    # what a server killed between moving a damaged copy aside and removing it left
    from tei_runtime.staging import aside_path

    aside_path(first, bundle.UNPACK_TAG).mkdir()
    with caplog.at_level(logging.WARNING):
        again = bundle.unpack_cached(tar, cache)
    assert again == first
    bundle.verify_folder(again)
    assert "tokenizer_config.json: sha256 mismatch" in caplog.text and "again" in caplog.text
    assert [p.name for p in cache.iterdir()] == [first.name]  # damaged copies all gone


def _bundle_listing(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A hand-made bundle whose listing matches its members byte for byte."""
    import hashlib

    listing = bundle.BundleManifest(
        format=bundle.BUNDLE_FORMAT,
        files=[
            bundle.BundleFile(path=n, size=len(b), sha256=hashlib.sha256(b).hexdigest())
            for n, b in files.items()
        ],
    )
    tar_path = tmp_path / "crafted.tar"
    with tarfile.open(tar_path, "w") as t:
        data = bundle._encode(listing)
        t.addfile(bundle._tar_info(BUNDLE_MANIFEST, len(data)), io.BytesIO(data))
        for name, body in files.items():
            t.addfile(bundle._tar_info(name, len(body)), io.BytesIO(body))
    return tar_path


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"model.fp32.onnx": b"x"}, r"lists no manifest\.json"),
        ({"manifest.json": b"{}", "sub": b"a", "sub/inner": b"b"}, r"sub both as a file and"),
    ],
    ids=["no-artifact-manifest", "file-and-folder"],
)
def test_verify_refuses_what_unpack_would(
    tmp_path: Path, files: dict[str, bytes], message: str
) -> None:
    """`tei-bundle verify` saying OK must mean `unpack` works: a layout no unpack can lay
    out is refused by both, with the same message, before a byte is written."""
    tar = _bundle_listing(tmp_path, files)
    with pytest.raises(BundleError, match=message):
        bundle.verify(tar)
    with pytest.raises(BundleError, match=message):
        bundle.unpack(tar, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_what_an_operator_copied_wrong_is_named_with_what_to_do(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """A copy cut short, a gzipped bundle, a tar of an unpacked folder: each refusal says
    what to do about it."""
    import gzip

    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    cut = tmp_path / "cut.tar"
    data = tar.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(BundleError, match=r"copy it again"):
        bundle.verify(cut)
    zipped = tmp_path / "toy.tar.gz"
    zipped.write_bytes(gzip.compress(data))
    assert bundle.is_bundle_file(zipped)  # taken as a (refused) bundle, not a checkpoint
    with pytest.raises(BundleError, match=r"gzip-compressed; .*gunzip .*toy\.tar\.gz"):
        resolve(str(zipped), cache_dir=str(tmp_path / "cache"))
    folder = bundle.unpack(tar, tmp_path / "unpacked")
    retarred = tmp_path / "re.tar"
    with tarfile.open(retarred, "w") as t:
        t.add(folder, arcname=".")
    with pytest.raises(BundleError, match=r"serve that folder, or `tei-bundle pack` it"):
        bundle.verify(retarred)
