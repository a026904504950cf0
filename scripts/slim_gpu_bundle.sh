#!/usr/bin/env bash
# Shrink .gpu/site.tar.xz (from ../shared/device/make-gpu-bundle) so that a device call's payload keeps room
# under its 64 MiB limit for the tree and carried caches: drops every __pycache__ (bytecode, rebuilt on the
# device at first import and hardly compressible), the bundled packages' own tests and Transformer Engine's JAX
# half. On 2026-12-01: 57.8 MB -> 43.7 MB; the GPU tests, studies and benches ran from the slim bundle.
#   bash scripts/slim_gpu_bundle.sh          # in place; the original is kept outside the tree, as $KEEP (default /tmp/site.full.tar.xz):
#                                          # inside .gpu it would travel with carry=[".gpu"]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/site.tar.xz ] || { echo "no .gpu/site.tar.xz: run ../shared/device/make-gpu-bundle first" >&2; exit 2; }
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
tar xJf .gpu/site.tar.xz -C "$STAGE"
find "$STAGE" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$STAGE" -path "$STAGE/transformer_engine" -prune -o -name tests -type d -prune -exec rm -rf {} +
rm -rf "$STAGE/test" "$STAGE/transformer_engine/jax"
KEEP="${KEEP:-/tmp/site.full.tar.xz}"
mv .gpu/site.tar.xz "$KEEP"
tar cf - -C "$STAGE" . | xz -6 -T2 > .gpu/site.tar.xz
ls -l "$KEEP" .gpu/site.tar.xz
