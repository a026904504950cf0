# Sourced by the benchmarks/gpu/gpu_*.sh scripts on the device machine: unpack the carried bundle
# (.gpu/site.tar.xz: Transformer Engine, Optuna, MLflow, ...) into $SITE once, put it and the source
# tree on PYTHONPATH, keep NVLink multicast off, and make $OUT (default given by the caller).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-${DEFAULT_OUT:-/tmp/gpu_out}}"
SITE="${SITE:-/tmp/site}"
mkdir -p "$OUT" "$SITE"
if [ ! -d "$SITE/transformer_engine" ]; then
    [ -f .gpu/site.tar.xz ] || { echo "no $SITE/transformer_engine and no .gpu/site.tar.xz: carry .gpu" >&2; exit 2; }
    tar xJf .gpu/site.tar.xz -C "$SITE" || exit 2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# gpu_util_log FILE [SECONDS]: sample the GPU's memory and utilisation into FILE every SECONDS (default 20)
# until this shell exits. All three of the sampler's streams are redirected and it is killed on exit: a
# background process holding the caller's stdout or stderr open keeps a `script | tail` pipe from ending
# (on 2026-12-01 that held a device call to its time limit for 150 s after the work was done).
gpu_util_log() {
    nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv -l "${2:-20}" </dev/null >"$1" 2>&1 &
    _GPU_UTIL_PID=$!
    trap 'kill "$_GPU_UTIL_PID" 2>/dev/null' EXIT
}

# gpu_frameworks_env: unpack the carried frameworks (make_framework_bundle.sh: .gpu/frameworks.tar.xz, the
# megatron/core sources, or a full megatron_core wheel; .gpu/titan_wheels/, torchtitan and what it imports) into
# /tmp/fw once, and put it on PYTHONPATH.
gpu_frameworks_env() {
    local fw=/tmp/fw
    if [ ! -d "$fw/megatron/core" ]; then
        mkdir -p "$fw"
        if [ -f .gpu/frameworks.tar.xz ]; then
            tar xJf .gpu/frameworks.tar.xz -C "$fw"
        elif ls .gpu/megatron_core-*.whl >/dev/null 2>&1; then  # a full wheel, where the payload has room
            pip install --no-deps --target "$fw" .gpu/megatron_core-*.whl > "$OUT/pip.log" 2>&1
        else
            echo "no .gpu/frameworks.tar.xz: run benchmarks/gpu/make_framework_bundle.sh here first" >&2
        fi
    fi
    if [ ! -d "$fw/torchtitan" ] && ls .gpu/titan_wheels/torchtitan-*.whl >/dev/null 2>&1; then
        python3 -m pip install --no-deps --target "$fw" .gpu/titan_wheels/*.whl > "$OUT/pip_titan.log" 2>&1 \
            || tail -3 "$OUT/pip_titan.log"
    fi
    export PYTHONPATH="$fw:$PYTHONPATH"
}
