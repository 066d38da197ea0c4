"""Bundles: one tar holding an artifact and a checksum list, for copying to air-gapped hosts.

A bundle is a plain, uncompressed tar (`tar xf` unpacks it too): `tei-bundle.json` first, then
every file of the artifact folder. `tei-bundle.json` lists each file with its size and sha256,
so unpacking checks every byte, including the files the artifact manifest does not cover
(tokenizer config, card copies). A file that is missing, extra, or whose bytes differ refuses
the bundle with a message naming that file.

Unpacking goes into a temporary folder beside the destination and is renamed into place only
once verified, so a crash or a tampered bundle never leaves a half-trusted folder behind. The
unpacking process holds an flock on its temporary folder, which the kernel releases when the
process dies however it dies (SIGKILL included): the next unpack of the same destination
removes the temporary folders nobody holds any more, and a live unpack's folder is left alone.
There is no lock file to go stale.

The command line (`tei-bundle`) is `tei_bundle.cli`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO

import msgspec

from tei_runtime.artifact import open_artifact, verify_tokenizer, verify_variant
from tei_runtime.checksum import sha256_file
from tei_runtime.errors import ManifestError
from tei_runtime.manifest import MANIFEST_NAME
from tei_runtime.permissions import publish_file, publish_tree
from tei_runtime.staging import aside_path, remove_abandoned, staging_folder

log = logging.getLogger(__name__)

BUNDLE_MANIFEST = "tei-bundle.json"
BUNDLE_FORMAT = 1
_CHUNK = 1 << 20


class BundleError(ManifestError):
    """The bundle is unreadable, or a file in it is missing, extra, or has other bytes.

    A ManifestError, so everything that refuses a corrupt artifact refuses a corrupt bundle."""


class BundleFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    """POSIX path relative to the artifact folder."""
    size: int
    sha256: str


class BundleManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: int
    files: list[BundleFile]


def _artifact_files(root: Path) -> list[str]:
    names: list[str] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            # A link could point anywhere on the packing machine; refuse rather than guess.
            raise BundleError(f"{path}: symbolic links cannot be bundled")
        if path.is_file() and rel != BUNDLE_MANIFEST:
            names.append(rel)
    return names


def describe(root: Path) -> BundleManifest:
    """The checksum list of every file under an artifact folder."""
    return BundleManifest(
        format=BUNDLE_FORMAT,
        files=[
            BundleFile(
                path=name, size=(root / name).stat().st_size, sha256=sha256_file(root / name)
            )
            for name in _artifact_files(root)
        ],
    )


def _encode(listing: BundleManifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(listing), indent=2) + b"\n"


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    # Fixed owner, mode and time: the same artifact always gives the same bytes.
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def write_bundle(artifact_dir: str | Path, out: str | Path) -> Path:
    """Verify the artifact (every variant and tokenizer file) and write it as one tar."""
    root = Path(artifact_dir)
    verify_artifact(root)
    target = Path(out)
    if target.is_dir() or str(out).endswith(("/", os.sep)):  # `newdir/`: a folder meant
        raise BundleError(f"{target}: is a folder; name the bundle's file, e.g. "
                          f"{target / (root.resolve().name + '.tar')}")  # fmt: skip
    if target.resolve().is_relative_to(root.resolve()):
        raise BundleError(f"{target}: inside the artifact folder it bundles; write it elsewhere")
    listing = describe(root)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as e:  # name the folder the user gave, not a temporary file's name
        raise BundleError(f"{target}: cannot write in {target.parent}: {e.strerror or e}") from e
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            data = _encode(listing)
            tar.addfile(_tar_info(BUNDLE_MANIFEST, len(data)), io.BytesIO(data))
            for entry in listing.files:
                with (root / entry.path).open("rb") as f:
                    tar.addfile(_tar_info(entry.path, entry.size), f)
        publish_file(Path(tmp_name))  # mkstemp made it 0600
        Path(tmp_name).replace(target)
    except OSError as e:  # a full disk, most likely: the bundle's path, not an errno alone
        Path(tmp_name).unlink(missing_ok=True)
        raise BundleError(
            f"{target}: cannot write it ({e.strerror or e}); nothing was written"
        ) from e
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def is_bundle(path: Path) -> bool:
    """A regular file whose first tar member is tei-bundle.json."""
    if not path.is_file():
        return False
    try:
        with tarfile.open(path, mode="r:") as tar:
            first = tar.next()
    except (tarfile.TarError, OSError):
        return False
    return first is not None and first.name == BUNDLE_MANIFEST


def _safe_name(bundle: Path, name: str) -> str:
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or ".." in parts or "\\" in name:
        raise BundleError(f"{bundle}: member {name!r} escapes the bundle folder")
    return PurePosixPath(*parts).as_posix()


_MAGIC = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2", b"\x28\xb5\x2f\xfd": "zstd"}
_DECOMPRESS = {"gzip": "gunzip", "xz": "unxz", "bzip2": "bunzip2", "zstd": "unzstd"}


def _compression(path: Path) -> str | None:
    """The compression a file's first bytes announce, if any."""
    try:
        with path.open("rb") as f:
            head = f.read(6)
    except OSError:
        return None
    return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)


def _read_listing(bundle: Path, tar: tarfile.TarFile, member: tarfile.TarInfo) -> BundleManifest:
    if member.name != BUNDLE_MANIFEST or not member.isfile():
        raise BundleError(
            f"{bundle}: not a tei-onnx bundle (no {BUNDLE_MANIFEST} first); a tar made of an "
            "unpacked folder is not one: serve that folder, or `tei-bundle pack` it, which "
            "gives the original bundle byte for byte"
        )
    f = tar.extractfile(member)
    assert f is not None  # a regular file member always has a body
    try:
        listing = msgspec.json.decode(f.read(), type=BundleManifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BundleError(f"{bundle}: {BUNDLE_MANIFEST} is damaged ({e})") from e
    if listing.format != BUNDLE_FORMAT:
        raise BundleError(
            f"{bundle}: bundle format {listing.format} is not supported (this tei-onnx reads "
            f"{BUNDLE_FORMAT})"
        )
    return listing


def _expected_files(bundle: Path, listing: BundleManifest) -> dict[str, BundleFile]:
    """The listing by safe name, refusing a listing no unpack could lay out: verify and
    unpack must agree, so what unpack would refuse is refused here, before any byte."""
    expected = {_safe_name(bundle, f.path): f for f in listing.files}
    if MANIFEST_NAME not in expected:
        raise BundleError(f"{bundle}: lists no {MANIFEST_NAME}; not an artifact bundle")
    for name in expected:
        for parent in PurePosixPath(name).parents:
            if parent.as_posix() in expected:
                raise BundleError(
                    f"{bundle}: {BUNDLE_MANIFEST} lists {parent.as_posix()} both as a file and "
                    f"as the folder of {name}"
                )
    return expected


class _UnpackWriteError(Exception):
    """Writing an unpacked file failed (a full disk, a read-only folder): the bundle itself
    may be fine, so this is told apart from a bundle that cannot be read."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def _copy_hashing(body: IO[bytes], out: IO[bytes] | None) -> str:
    digest = hashlib.sha256()
    while chunk := body.read(_CHUNK):
        digest.update(chunk)
        if out is not None:
            try:
                out.write(chunk)
            except OSError as e:
                raise _UnpackWriteError(e) from e
    return digest.hexdigest()


def _check_member(
    bundle: Path,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    entry: BundleFile,
    dest: Path | None,
) -> None:
    body = tar.extractfile(member)
    assert body is not None
    if dest is None:
        actual = _copy_hashing(body, None)
    else:
        path = dest / entry.path
        try:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                out = path.open("wb")
            except OSError as e:
                raise _UnpackWriteError(e) from e
            try:
                actual = _copy_hashing(body, out)
            except BaseException:
                with contextlib.suppress(OSError):
                    out.close()
                raise
            try:
                out.close()  # the buffer's last write: a full disk may show only here
            except OSError as e:
                raise _UnpackWriteError(e) from e
        except _UnpackWriteError as e:
            raise BundleError(
                f"{bundle}: cannot write {path} while unpacking ({e.error.strerror or e.error}); "
                f"the bundle was not at fault: free space in, or make writable, {dest.parent}"
            ) from e
    if member.size != entry.size or actual != entry.sha256.lower():
        raise BundleError(
            f"{bundle}: {entry.path}: sha256 mismatch ({BUNDLE_MANIFEST} {entry.sha256}, file "
            f"{actual}); the bundle is corrupt or was modified, copy it again"
        )


def _check(bundle: Path, dest: Path | None) -> BundleManifest:
    """Stream every member, hash it, optionally write it under `dest`; compare to the listing.

    Streaming keeps one pass over the tar and never trusts tarfile's own extraction with
    names or modes from a file that may have been tampered with."""
    listing: BundleManifest | None = None
    expected: dict[str, BundleFile] = {}
    seen: set[str] = set()
    try:
        with tarfile.open(bundle, mode="r:") as tar:
            for index, member in enumerate(tar):
                if index == 0:
                    listing = _read_listing(bundle, tar, member)
                    expected = _expected_files(bundle, listing)
                    continue
                if member.isdir():
                    continue
                name = _safe_name(bundle, member.name)
                if not member.isfile():
                    raise BundleError(f"{bundle}: {name} is not a regular file")
                entry = expected.get(name)
                if entry is None:
                    raise BundleError(
                        f"{bundle}: {name} is in the tar but not in {BUNDLE_MANIFEST}"
                    )
                if name in seen:
                    raise BundleError(f"{bundle}: {name} appears twice")
                seen.add(name)
                _check_member(bundle, tar, member, entry, dest)
    except tarfile.TarError as e:
        if kind := _compression(bundle):
            raise BundleError(
                f"{bundle}: {kind}-compressed; a bundle is the plain tar `tei-bundle pack` "
                f"writes: decompress it first (e.g. `{_DECOMPRESS[kind]} {bundle}`)"
            ) from e
        raise BundleError(
            f"{bundle}: not a readable tar ({e}); the copy is incomplete or damaged, copy it "
            "again"
        ) from e
    except OSError as e:
        raise BundleError(f"{bundle}: cannot read it ({e})") from e
    if listing is None:
        raise BundleError(f"{bundle}: empty tar, not a tei-onnx bundle")
    for name in expected:
        if name not in seen:
            raise BundleError(
                f"{bundle}: {name} is missing (listed in {BUNDLE_MANIFEST}); the bundle is "
                "incomplete, copy it again"
            )
    return listing


def verify(bundle: str | Path) -> BundleManifest:
    """Check every file of the bundle against its listing; unpack nothing."""
    return _check(Path(bundle), None)


def verify_artifact(root: Path) -> None:
    """Check an artifact folder against its own manifest: every graph, external-data and
    tokenizer file it lists (what `pack` checks before bundling)."""
    artifact = open_artifact(root)
    verify_tokenizer(artifact)
    for variant in artifact.manifest.variants:
        verify_variant(artifact, variant)


def verify_folder(root: Path) -> None:
    """Check an unpacked bundle folder against the tei-bundle.json it carries."""
    try:
        listing = msgspec.json.decode((root / BUNDLE_MANIFEST).read_bytes(), type=BundleManifest)
    except FileNotFoundError as e:
        raise BundleError(f"{root}: no {BUNDLE_MANIFEST}, not an unpacked bundle") from e
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BundleError(f"{root / BUNDLE_MANIFEST}: damaged ({e})") from e
    listed = {f.path for f in listing.files}
    for name in _artifact_files(root):
        if name not in listed:
            raise BundleError(f"{root / name}: not in {BUNDLE_MANIFEST}")
    for entry in listing.files:
        path = root / entry.path
        if not path.is_file():
            raise BundleError(f"{path}: missing (listed in {BUNDLE_MANIFEST})")
        actual = sha256_file(path)
        if actual != entry.sha256.lower():
            raise BundleError(
                f"{path}: sha256 mismatch ({BUNDLE_MANIFEST} {entry.sha256}, file {actual}); "
                "the folder was changed since it was unpacked: unpack the bundle again"
            )


UNPACK_TAG = "unpack-"
"""An unpack's staging folder beside its target is `.<target name>.unpack-<random>`."""


def unpack(bundle: str | Path, dest: str | Path) -> Path:
    """Verified unpack into `dest` (which must not exist yet); returns `dest`."""
    source, target = Path(bundle), Path(dest)
    if target.exists():
        raise BundleError(f"{target}: already exists; unpack into a new folder")
    with contextlib.ExitStack() as stack:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_abandoned(target, UNPACK_TAG)
            tmp = stack.enter_context(staging_folder(target, UNPACK_TAG))
        except OSError as e:
            raise BundleError(
                f"{source}: cannot unpack into {target} ({e.strerror or e}); the bundle was "
                f"not at fault: unpack into a folder this user can write"
            ) from e
        _unpack_into(source, target, tmp)
    return target


def _unpack_into(source: Path, target: Path, tmp: Path) -> None:
    try:
        listing = _check(source, tmp)
        # Keep the listing beside the files so that the folder can be re-verified later.
        (tmp / BUNDLE_MANIFEST).write_bytes(_encode(listing))
        publish_tree(tmp)  # mkdtemp made it 0700
        tmp.replace(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def bundle_digest(bundle: Path) -> str:
    """sha256 of the whole tar: the cache key, so a changed byte never reuses an old unpack."""
    return sha256_file(bundle)


def unpack_cached(bundle: Path, cache_root: Path) -> Path:
    """Unpack once into `cache_root/<name>-<sha256>`, reusing a verified earlier unpack (one
    whose files were damaged since is unpacked again from the bundle).

    When `cache_root` cannot be written (a read-only /data), a verified unpack already there
    is used as it is; else a temporary folder is, for this process only."""
    try:
        digest = bundle_digest(bundle)[:16]
    except OSError as e:
        raise BundleError(
            f"{bundle}: cannot read it ({e.strerror or e}); a bundle must be readable by the "
            f"server's user (tei-bundle pack writes it 0644)"
        ) from e
    name = f"{bundle.name.removesuffix('.tar')}-{digest}"
    writable = _writable(cache_root)
    cached = cache_root / name
    if (cached / BUNDLE_MANIFEST).is_file():
        try:
            verify_folder(cached)
            return cached
        except BundleError as e:
            # The bundle itself is intact (its digest names the folder): the earlier unpack
            # was damaged on disk since. Unpack it again rather than refuse to start.
            log.warning("%s; unpacking %s again", e, bundle.name)
            if writable is None:
                _discard(cached)
    elif writable is None and cached.exists():
        # No file list: an unpack cut short by hand, or not ours. Moved aside, not trusted.
        log.warning("%s holds no %s; unpacking %s again", cached, BUNDLE_MANIFEST, bundle.name)
        _discard(cached)
    base = cache_root if writable is None else _process_folder(cache_root, writable, bundle)
    target = base / name
    try:
        return unpack(bundle, target)
    except (BundleError, OSError) as e:
        # Another server may have finished the same unpack between our check and rename
        # (its rename wins; ours then finds the folder there: ENOTEMPTY).
        if (target / BUNDLE_MANIFEST).is_file():
            verify_folder(target)
            return target
        if isinstance(e, BundleError):
            raise
        raise BundleError(f"{bundle}: cannot unpack into {target}: {e}") from e


def _writable(folder: Path) -> OSError | None:
    """None where files can be made in `folder` (made if missing); else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a read-only /data fails here
            pass
    except OSError as e:
        return e
    return None


PROCESS_TAG = "process-"
"""A fallback unpack lives in `<tmp>/.tei-bundle.process-<random>`, flocked by its server for
as long as it runs: the next server removes those whose server is gone (SIGKILL, the OOM
killer), which atexit never saw."""
_held: list[contextlib.ExitStack] = []


def _process_folder(cache_root: Path, why: OSError, bundle: Path) -> Path:
    """A temporary folder of this process's own, held (flocked) until it exits."""
    stack = contextlib.ExitStack()
    try:
        anchor = Path(tempfile.gettempdir()) / "tei-bundle"  # no usable one: FileNotFoundError
        remove_abandoned(anchor, PROCESS_TAG)
        base = stack.enter_context(staging_folder(anchor, PROCESS_TAG))
    except OSError as no_tmp:
        stack.close()
        raise BundleError(
            f"{bundle}: nowhere to unpack it: {cache_root} is not writable "
            f"({why.strerror or why}) and neither is a temporary folder ({no_tmp}); mount a "
            f"writable volume at {cache_root} (or /tmp), or serve the unpacked folder"
        ) from no_tmp
    _held.append(stack)
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    # The unpack goes one level down: it flocks the folder it unpacks in, which must not be
    # the one this process holds its own lock on (flock does not nest across descriptors).
    inner = base / "bundles"
    inner.mkdir()
    log.warning("%s is not writable (%s); unpacking %s into %s for this process only",
                cache_root, why.strerror or why, bundle.name, inner)  # fmt: skip
    return inner


def _discard(folder: Path) -> None:
    """Move a damaged unpack out of the way in one rename, then remove it: a server starting
    beside us never sees a half-removed folder under the cache name, and one killed before
    removing it leaves a folder the next unpack there sweeps."""
    aside = aside_path(folder, UNPACK_TAG)
    try:
        folder.replace(aside)
    except FileNotFoundError:
        return  # another server moved it first
    except OSError as e:
        raise BundleError(
            f"{folder}: damaged and cannot be moved aside ({e.strerror or e}); remove it"
        ) from e
    shutil.rmtree(aside, ignore_errors=True)


def is_bundle_file(path: Path) -> bool:
    """What `--model-id` / tei-embed treat as a bundle: a file named *.tar, or a tei-bundle,
    or a compressed file (refused as a bundle, with how to decompress it)."""
    return path.is_file() and (
        path.suffix == ".tar" or is_bundle(path) or _compression(path) is not None
    )


def artifact_folder(path: Path, cache_root: Path) -> Path:
    """`path` as an artifact folder to load: a bundle is verified and unpacked once under
    `cache_root` (unpack_cached); an unpacked bundle folder is checked against its file list;
    any other folder is returned as it is."""
    if is_bundle_file(path):
        return unpack_cached(path, cache_root)
    if (path / BUNDLE_MANIFEST).is_file():
        verify_folder(path)
    return path
