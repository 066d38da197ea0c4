"""tei_bundle: an artifact as one verified tar for air-gapped hosts (`tei-bundle`).

A tool beside the runtime library, not part of it: `tei_serve` and `tei_corpus` read bundles
through `artifact_folder`; `tei_bundle.cli` is the command line.
"""

from __future__ import annotations

from tei_bundle.archive import (
    BUNDLE_MANIFEST,
    BundleError,
    BundleManifest,
    artifact_folder,
    is_bundle_file,
    unpack,
    verify,
    verify_folder,
    write_bundle,
)

__all__ = [
    "BUNDLE_MANIFEST",
    "BundleError",
    "BundleManifest",
    "artifact_folder",
    "is_bundle_file",
    "unpack",
    "verify",
    "verify_folder",
    "write_bundle",
]
