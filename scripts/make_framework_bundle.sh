#!/usr/bin/env bash
# Build .gpu/frameworks.tar.xz for scripts/gpu_frameworks.sh: the megatron-core 0.19.2 modules a GPT training
# step can import (scripts/_mcore_closure.py follows the imports statically from the bench's; with FULL=1 all
# of megatron/core), Python sources only, from the wheel pip downloads here; the device has no network.
# The carried payload is limited to 64 MiB, so this stays under 1 MB (about 0.83 MB; FULL=1 about 1.2 MB).
#   bash scripts/make_framework_bundle.sh        # -> .gpu/frameworks.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="${WHEELS:-/tmp/wheels}"
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}"
ls "$WHEELS"/megatron_core-0.19.2-*.whl >/dev/null 2>&1 || \
  "$PY" -m pip download --no-deps --python-version 3.12 --only-binary=:all: megatron-core==0.19.2 -d "$WHEELS"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
"$PY" -m zipfile -e "$WHEELS"/megatron_core-0.19.2-*.whl "$STAGE/site"
mkdir -p .gpu
if [ "${FULL:-0}" = "1" ]; then
  (cd "$STAGE/site" && find megatron/core -name '*.py') > "$STAGE/files"
else
  "$PY" scripts/_mcore_closure.py "$STAGE/site" > "$STAGE/files"
fi
tar cf - -C "$STAGE/site" -T "$STAGE/files" | xz -9e > .gpu/frameworks.tar.xz
echo "$(wc -l < "$STAGE/files") files"; ls -l .gpu/frameworks.tar.xz
