"""`tei-bundle`: write, check or unpack a bundle (one verified tar of an artifact).

    tei-bundle pack ARTIFACT model.tar     # verify the artifact, write the bundle
    tei-bundle verify model.tar            # check every file, unpack nothing
    tei-bundle unpack model.tar DIR        # verified unpack (tei-serve does this by itself)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tei_bundle.archive import (
    BUNDLE_MANIFEST,
    unpack,
    verify,
    verify_artifact,
    verify_folder,
    write_bundle,
)
from tei_runtime.errors import TeiRuntimeError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tei-bundle",
        description="Pack a tei-onnx artifact into one verified tar, check one, or unpack one.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="verify an artifact folder and write it as one tar")
    pk.add_argument("artifact", type=Path)
    pk.add_argument("bundle")  # a string: `newdir/` keeps the slash that says "a folder"
    vf = sub.add_parser(
        "verify",
        help="check every file of a bundle (tar), an unpacked bundle or an artifact folder",
    )
    vf.add_argument("bundle", type=Path)
    up = sub.add_parser("unpack", help="verified unpack into a new folder")
    up.add_argument("bundle", type=Path)
    up.add_argument("dest", type=Path)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "pack":
            out = write_bundle(args.artifact, args.bundle)
            listing = verify(out)
            size = out.stat().st_size / (1 << 20)
            print(f"{out}: {len(listing.files)} files, {size:.1f} MiB")
        elif args.command == "verify":
            what = ""
            if args.bundle.is_dir() and not (args.bundle / BUNDLE_MANIFEST).exists():
                # An artifact folder as tei-export wrote it: its manifest's files are checked.
                verify_artifact(args.bundle)
                what = " (an artifact: every file its manifest lists)"
            elif args.bundle.is_dir():
                verify_folder(args.bundle)
            else:
                verify(args.bundle)
            print(f"{args.bundle}: ok{what}")
        else:
            print(unpack(args.bundle, args.dest))
    except (TeiRuntimeError, OSError) as e:
        print(f"tei-bundle: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
