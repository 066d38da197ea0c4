#!/usr/bin/env bash
# Make a local Debian base image for building tei-onnx images where no registry serves one.
#
#   docker/make-local-base.sh [TAG]     # default: localhost/tei-onnx-base:bookworm
#   podman build --format docker --build-arg BASE_IMAGE=localhost/tei-onnx-base:bookworm \
#       --build-arg BUILD_IMAGE=localhost/tei-onnx-base:bookworm ...
#
# debootstrap writes a minimal Debian root filesystem from the Debian mirror apt already uses;
# its tar is kept under the cache folder (keyed by release) so that a second run only imports it.
# Needs root, debootstrap and podman (or docker: ENGINE=docker).
# Environment: DEBIAN_RELEASE (bookworm), DEBIAN_MIRROR (the first deb.debian.org-style URI in
# apt's sources, else http://deb.debian.org/debian), TEI_ONNX_CACHE (~/.cache/tei-onnx).
set -euo pipefail

release="${DEBIAN_RELEASE:-bookworm}"
tag="${1:-localhost/tei-onnx-base:${release}}"
engine="${ENGINE:-podman}"
cache="${TEI_ONNX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tei-onnx}/debootstrap"
tarball="$cache/debian-${release}-minbase.tar"

mirror_from_apt() {
    # deb822 sources (Debian 12+) first, then the one-line format.
    { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
      grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '{print $2}'; } | grep -v -- '-security' | head -n 1 || true
}

if [ ! -f "$tarball" ]; then
    mirror="${DEBIAN_MIRROR:-$(mirror_from_apt)}"
    mirror="${mirror:-http://deb.debian.org/debian}"
    mkdir -p "$cache"
    root="$(mktemp -d "$cache/.rootfs.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase "$release" "$root" "$mirror" >&2
    # The image's apt reads the same mirror; the apt lists debootstrap left are not needed.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    # Written to a temporary name first: an interrupted run never leaves a truncated base.
    tar --numeric-owner -C "$root" -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
fi
"$engine" import --change 'CMD ["/bin/bash"]' "$tarball" "$tag" >/dev/null
echo "$tag"
