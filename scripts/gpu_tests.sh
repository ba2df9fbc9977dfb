#!/bin/sh
# Every GPU check on an NVIDIA Hopper GPU (H100/H200), then one summary table:
#   1. the test binaries of `make cuda-tests` (op kernels against the CPU ops, cache codecs and a device
#      cache against the host cache), each with its own table;
#   2. `deepinfer verify --device cuda` on every golden case: op vectors (kernels.safetensors),
#      free-running prefill within 3x the case's noise floor, teacher-forced blocks within 1.5e-2;
#      then once more with DI_CUDA_KERNELS=tensor (the tensor-core kernels, same bounds, not bit-exact);
#   3. `deepinfer generate --device cuda` greedy (plain, chunked prefill, DSpark drafts with rollback)
#      against `--device cpu` of the same binary on the tiny models: the token ids must be equal.
#
#   sh scripts/gpu_tests.sh [BIN_DIR] [KERNELS]
#   BIN_DIR  where `make cuda-tests` put the test binaries (default build/cuda)
#   KERNELS  the reference vectors (default tests/data/kernels.safetensors)
#   DI_CLI   the CUDA-enabled CLI (default build/deepinfer-cuda, `make deepinfer-cuda`)
#   DI_GOLDEN_CASES  golden case directories (default: the two tiny cases in tests/data and
#                    ../shared/golden/v41-mid-nosel when present)
# Set DI_SANITIZE=1 to run each test binary (DI_QUICK shapes) and each verify once more under
# compute-sanitizer memcheck. DI_CUDA_TOPK=fast switches the CUDA selections to the parallel kernels
# (tie rule: higher score, then lower position), which v41-tiny-sel's teacher-forced bound rejects.
# Exit status: 0 when every check passed.
set -u
BIN_DIR=${1:-build/cuda}
KERNELS=${2:-tests/data/kernels.safetensors}
CLI=${DI_CLI:-build/deepinfer-cuda}
CASES=${DI_GOLDEN_CASES:-"tests/data/v41-tiny-sel tests/data/v41-tiny-nosel ../shared/golden/v41-mid-nosel"}
TMP=${TMPDIR:-/tmp}/di_gpu_tests.$$
mkdir -p "$TMP"
SUMMARY="$TMP/summary"
: >"$SUMMARY"
status=0
row() { printf '%-34s %-6s %s\n' "$1" "$2" "$3" >>"$SUMMARY"; [ "$2" = PASS ] || status=1; }

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
else
    echo "nvidia-smi not found: is this the GPU machine?"
fi

# ---- 1. test binaries ----
found=0
for t in "$BIN_DIR"/test_*; do
    [ -x "$t" ] || continue
    found=1
    echo "== $t"
    "$t" "$KERNELS" >"$TMP/out" 2>&1
    rc=$?
    cat "$TMP/out"
    last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$TMP/out" | tail -1)
    row "$(basename "$t")" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "${last:-exit $rc}"
    if [ "${DI_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
        echo "== compute-sanitizer $t"
        DI_QUICK=1 compute-sanitizer --tool memcheck --print-limit 10 "$t" "$KERNELS" >"$TMP/san" 2>&1
        rc=$?
        tail -3 "$TMP/san"
        row "memcheck $(basename "$t")" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$TMP/san")"
    fi
done
[ $found = 1 ] || row "test binaries" FAIL "none in $BIN_DIR (run make cuda-tests)"

# ---- 2. verify --device cuda on the golden cases ----
if [ -x "$CLI" ]; then
    for c in $CASES; do
        [ -f "$c/golden.safetensors" ] || { echo "== verify $c: absent, skipped"; continue; }
        name=$(basename "$c")
        echo "== verify --device cuda $name"
        timeout 300 "$CLI" verify --model "$c" --golden "$c/golden.safetensors" --kernels "$KERNELS" --device cuda \
            >"$TMP/out" 2>&1
        rc=$?
        cat "$TMP/out"
        worst_tf=$(awk '$1 ~ /^[0-9]+$/ && $5 != "-" { if ($5 > m) m = $5 } END { printf "%.3e", m }' "$TMP/out")
        logits=$(grep '^prompt logits' "$TMP/out" | sed 's/^prompt logits: //; s/;.*//')
        argmax=$(grep -o 'argmax agrees on [0-9/]* positions' "$TMP/out")
        row "verify cuda $name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
            "worst tf $worst_tf; logits $logits; $argmax"
        # the opt-in tensor-core kernels (backend_cuda.cu): not bit-exact, must stay within the same bounds
        DI_CUDA_KERNELS=tensor timeout 300 "$CLI" verify --model "$c" --golden "$c/golden.safetensors" \
            --kernels "$KERNELS" --device cuda >"$TMP/out" 2>&1
        rc=$?
        worst_tf=$(awk '$1 ~ /^[0-9]+$/ && $5 != "-" { if ($5 > m) m = $5 } END { printf "%.3e", m }' "$TMP/out")
        logits=$(grep '^prompt logits' "$TMP/out" | sed 's/^prompt logits: //; s/;.*//')
        row "verify cuda (tensor kernels) $name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
            "worst tf $worst_tf; logits $logits"
        if [ "${DI_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
            compute-sanitizer --tool memcheck --print-limit 10 "$CLI" verify --model "$c" \
                --golden "$c/golden.safetensors" --no-ops --device cuda >"$TMP/san" 2>&1
            rc=$?
            row "memcheck verify $name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$TMP/san")"
        fi
    done

    # ---- 3. generate: CUDA greedy ids against the CPU's ----
    for c in tests/data/v41-tiny-sel tests/data/v41-tiny-nosel; do
        [ -f "$c/config.json" ] || continue
        name=$(basename "$c")
        for mode in plain chunk dspark; do
            extra=""
            [ $mode = chunk ] && extra="--chunk 7"
            [ $mode = dspark ] && extra="--dspark"
            args="--model $c --prompt-ids 5,17,42,99,3,250,7,1,64,128,9,33,2,11,301,77,6,45 --max-tokens 24 $extra"
            # shellcheck disable=SC2086
            cpu=$(timeout 120 "$CLI" generate $args --device cpu 2>"$TMP/err_cpu" | head -1)
            # shellcheck disable=SC2086
            gpu=$(timeout 120 "$CLI" generate $args --device cuda 2>"$TMP/err_gpu" | head -1)
            echo "== generate $name $mode: cpu [$cpu] cuda [$gpu]"
            cat "$TMP/err_cpu" "$TMP/err_gpu"
            if [ -n "$gpu" ] && [ "$cpu" = "$gpu" ]; then
                row "generate $name $mode" PASS "24 greedy ids equal to --device cpu"
            else
                first=$(awk -v a="$cpu" -v b="$gpu" 'BEGIN { n = split(a, x, ","); split(b, y, ",");
                    for (i = 1; i <= n; i++) if (x[i] != y[i]) { print i - 1; exit } print "none" }')
                row "generate $name $mode" FAIL "first differing output index $first ($(head -c 120 "$TMP/err_gpu"))"
            fi
        done
    done
else
    row "verify / generate" FAIL "no CUDA CLI at $CLI (make deepinfer-cuda)"
fi

echo
echo "== summary ($(date -u +%Y-%m-%dT%H:%MZ))"
printf '%-34s %-6s %s\n' check result detail
cat "$SUMMARY"
rm -rf "$TMP"
exit $status
