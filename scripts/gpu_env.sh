# Sourced by the scripts/gpu_*.sh scripts on the device machine: unpack the carried bundle
# (.gpu/site.tar.xz: Transformer Engine, Optuna, MLflow, ...) into $SITE once, put it and the source
# tree on PYTHONPATH, keep NVLink multicast off, and make $OUT (default given by the caller).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-${DEFAULT_OUT:-/tmp/gpu_out}}"
SITE="${SITE:-/tmp/site}"
mkdir -p "$OUT" "$SITE"
if [ ! -d "$SITE/transformer_engine" ]; then
    [ -f .gpu/site.tar.xz ] || { echo "no $SITE/transformer_engine and no .gpu/site.tar.xz: carry .gpu" >&2; exit 2; }
    tar xJf .gpu/site.tar.xz -C "$SITE" || exit 2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
