"""Open an artifact folder: read the manifest and verify the files the runtime will load."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from tei_runtime.checksum import sha256_file
from tei_runtime.errors import ManifestError, cannot_read
from tei_runtime.manifest import Manifest, Variant, read_manifest

TOKENIZER_JSON = "tokenizer.json"


class Artifact(msgspec.Struct, frozen=True, kw_only=True):
    root: Path
    manifest: Manifest


def open_artifact(artifact_dir: str | Path) -> Artifact:
    if not isinstance(artifact_dir, str | os.PathLike):
        raise ManifestError(f"an artifact folder's path is needed; got {artifact_dir!r}")
    root = Path(artifact_dir).expanduser()
    try:
        if not root.is_dir():
            bundle = root.is_file() and root.name.endswith((".tar", ".tar.gz", ".tgz"))
            hint = f" (a bundle: `tei-bundle unpack {root} FOLDER` first)" if bundle else ""
            raise ManifestError(
                f"{root}: not a folder; pass a tei-export artifact folder{hint}"
            )
        manifest = read_manifest(root)
    except PermissionError as e:
        raise cannot_read(e) from e
    if TOKENIZER_JSON not in manifest.tokenizer_files:
        raise ManifestError(f"{root / 'manifest.json'}: tokenizer_files lacks {TOKENIZER_JSON}")
    return Artifact(root=root, manifest=manifest)


def verify_file(path: Path, expected: str | None) -> None:
    """Raise ManifestError naming `path` when it is missing or its sha256 differs."""
    if not path.is_file():
        raise ManifestError(f"{path}: missing from the artifact (the manifest lists it)")
    if expected is None:
        raise ManifestError(f"{path}: the manifest gives no sha256 for it")
    try:
        actual = sha256_file(path)
    except PermissionError as e:
        raise cannot_read(e) from e
    if actual != expected.lower():
        raise ManifestError(
            f"{path}: sha256 mismatch (manifest {expected}, file {actual}); the artifact is "
            "corrupt or was modified, re-export or re-download it"
        )


def verify_tokenizer(artifact: Artifact) -> Path:
    """Check every tokenizer file and return tokenizer.json's path."""
    for name in artifact.manifest.tokenizer_files:
        verify_file(artifact.root / name, artifact.manifest.tokenizer_sha256.get(name))
    return artifact.root / TOKENIZER_JSON


def verify_variant(artifact: Artifact, variant: Variant) -> Path:
    path = artifact.root / variant.file
    verify_file(path, variant.sha256)
    for name, digest in variant.external_data.items():
        verify_file(artifact.root / name, digest)
    return path
