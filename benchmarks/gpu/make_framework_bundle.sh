#!/usr/bin/env bash
# Build .gpu/frameworks.tar.xz for benchmarks/gpu/gpu_frameworks.sh: the megatron-core 0.19.2 modules a GPT training
# step can import (benchmarks/_mcore_closure.py follows the imports statically from the bench's; with FULL=1 all
# of megatron/core), Python sources only, from the wheel pip downloads here; the device has no network.
# The carried payload is limited to 64 MiB, so this stays under 1 MB (about 0.83 MB; FULL=1 about 1.2 MB).
#   bash benchmarks/gpu/make_framework_bundle.sh        # -> .gpu/frameworks.tar.xz, .gpu/titan_wheels/ (1.5 MB)
# .gpu/titan_wheels/ holds torchtitan 0.2.2 (the release the export targets) and what it imports that the device
# image lacks (torchdata, tyro and its two dependencies, datasets with the dill and multiprocess it pins), for
# Python 3.12; benchmarks/gpu/gpu_frameworks.sh installs them with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/../.."
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
  "$PY" benchmarks/_mcore_closure.py "$STAGE/site" > "$STAGE/files"
fi
tar cf - -C "$STAGE/site" -T "$STAGE/files" | xz -9e > .gpu/frameworks.tar.xz
echo "$(wc -l < "$STAGE/files") files"; ls -l .gpu/frameworks.tar.xz
mkdir -p .gpu/titan_wheels
"$PY" -m pip download --no-deps --python-version 3.12 --only-binary=:all: -d .gpu/titan_wheels \
  torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 datasets==4.0.0 \
  dill==0.3.8 multiprocess==0.70.16 > /dev/null
du -sh .gpu/titan_wheels
