#!/bin/sh
# The device check of the tensor-core MXFP4 GEMV (src/backend/cuda/cuda_gemv_mma.cu, opt-in
# DI_CUDA_GEMV=mma), in one device call. Builds nothing: the binaries come from BIN_DIR, built on the
# development machine and carried over:
#
#   make -j2 build/cuda/test_cuda_gemv_mma build/cuda/test_cuda_ops build/deepinfer-cuda
#   mkdir -p .carry/mma && cp build/cuda/test_cuda_gemv_mma build/cuda/test_cuda_ops build/deepinfer-cuda .carry/mma/
#   run(command="sh scripts/gpu_gemv_mma.sh .carry/mma", carry=[".carry/mma"], timeout_s=600)
#
# Steps (each a row of the summary; exit status 0 when all pass):
#   1. test_cuda_gemv_mma: the new kernel (both column tiles) against the current GEMV (every bit) and the
#      CPU op at the expert shapes, M = 1 … 5 and 16, edge shapes, NaN / inf / extreme-scale inputs; then
#      its bench (DI_BENCH=1): µs, GB/s, % of 4470 GB/s for both kernels at M = 1 … 4;
#   2. the same binary with DI_QUICK=1 under compute-sanitizer memcheck (when present);
#   3. test_cuda_ops with DI_GEMV_ONLY=1 and DI_CUDA_GEMV=mma: its linear_fp4 rows (and every other GEMV /
#      moe_routed row) through the new path against the CPU backend;
#   4. deepinfer-cuda verify with DI_CUDA_GEMV=mma on the tiny golden cases (their FP4 shapes may fall
#      back to the current GEMV when K % 128 ≠ 0: this checks the switch breaks nothing).
#
#   sh scripts/gpu_gemv_mma.sh [BIN_DIR] [KERNELS]
#   BIN_DIR  the carried binaries (default .carry/mma); KERNELS the reference vectors
#            (default tests/data/kernels.safetensors)
set -u
BIN=${1:-.carry/mma}
KERNELS=${2:-tests/data/kernels.safetensors}
TMP=${TMPDIR:-/tmp}/di_gemv_mma.$$
mkdir -p "$TMP"
: >"$TMP/summary"
status=0
row() { printf '%-44s %-6s %s\n' "$1" "$2" "$3" >>"$TMP/summary"; [ "$2" = PASS ] || status=1; }
last() { grep -E '[0-9]+ passed, [0-9]+ failed' "$1" | tail -1; }

command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

# ---- 1. exactness + bench ----
if [ -x "$BIN/test_cuda_gemv_mma" ]; then
    echo "== test_cuda_gemv_mma (DI_BENCH=1)"
    t0=$(date +%s)
    DI_BENCH=1 timeout 400 "$BIN/test_cuda_gemv_mma" >"$TMP/out" 2>&1
    rc=$?
    cat "$TMP/out"
    row "test_cuda_gemv_mma" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(last "$TMP/out") ($(($(date +%s) - t0)) s)"
    # ---- 2. memcheck ----
    if command -v compute-sanitizer >/dev/null 2>&1; then
        echo "== compute-sanitizer memcheck test_cuda_gemv_mma (DI_QUICK=1)"
        DI_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$BIN/test_cuda_gemv_mma" >"$TMP/san" 2>&1
        rc=$?
        tail -5 "$TMP/san"
        row "memcheck test_cuda_gemv_mma" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$TMP/san")"
    fi
else
    row "test_cuda_gemv_mma" FAIL "not in $BIN"
fi

# ---- 3. the existing op rows through the switch ----
if [ -x "$BIN/test_cuda_ops" ]; then
    echo "== test_cuda_ops DI_GEMV_ONLY=1 DI_CUDA_GEMV=mma"
    DI_GEMV_ONLY=1 DI_CUDA_GEMV=mma timeout 150 "$BIN/test_cuda_ops" "$KERNELS" >"$TMP/out" 2>&1
    rc=$?
    grep -E 'linear_fp4|moe_routed|FAIL|passed' "$TMP/out"
    row "test_cuda_ops GEMV rows, DI_CUDA_GEMV=mma" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(last "$TMP/out")"
fi

# ---- 4. verify with the switch on ----
if [ -x "$BIN/deepinfer-cuda" ]; then
    for c in tests/data/v41-tiny-sel tests/data/v41-tiny-nosel; do
        [ -f "$c/golden.safetensors" ] || continue
        echo "== DI_CUDA_GEMV=mma verify --device cuda $(basename "$c")"
        DI_CUDA_GEMV=mma timeout 150 "$BIN/deepinfer-cuda" verify --model "$c" --golden "$c/golden.safetensors" \
            --kernels "$KERNELS" --device cuda >"$TMP/out" 2>&1
        rc=$?
        tail -3 "$TMP/out"
        row "verify cuda mma $(basename "$c")" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(grep '^prompt logits' "$TMP/out" | head -c 100)"
    done
fi

echo
echo "== summary ($(date -u +%Y-%m-%dT%H:%MZ))"
cat "$TMP/summary"
rm -rf "$TMP"
exit $status
