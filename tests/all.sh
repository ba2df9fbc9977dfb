#!/bin/sh
# `make test`: build, unit tests, the ASan/UBSan subset, fuzz smoke and the CUDA compile check.
# Ends with one closing line "N passed, N failed" summed over every stage.
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
total_p=0; total_f=0
tally() { # tally NAME SUMMARY_FILE
    p=$(cut -d' ' -f1 "$2" 2>/dev/null || echo 0); f=$(cut -d' ' -f2 "$2" 2>/dev/null || echo 1)
    total_p=$((total_p + ${p:-0})); total_f=$((total_f + ${f:-1}))
    echo "== $1: $p passed, $f failed"
}
one() { # one NAME COMMAND...: a stage that counts as a single test
    name="$1"; shift
    if "$@"; then total_p=$((total_p + 1)); echo "== $name: ok"; else total_f=$((total_f + 1)); echo "== $name: FAILED"; fi
}
sum=$(mktemp)

echo "== build"
if ! make -j"$jobs" all >build.log 2>&1; then tail -60 build.log; echo "0 passed, 1 failed"; exit 1; fi
grep -E 'warning:' build.log | head -20; rm -f build.log

echo "== unit tests"
SUMMARY_FILE="$sum" sh tests/run_tests.sh build all; tally "unit tests" "$sum"

echo "== python (deepinfer_c)"
one "python deepinfer_c" python3 -m unittest discover -s python/tests

echo "== sanitizer subset (ASan + UBSan)"
if make -j"$jobs" asan-build >asan.log 2>&1; then
    SUMMARY_FILE="$sum" ASAN_OPTIONS=detect_leaks=1 sh tests/run_tests.sh build-asan $(make -s asan-list); tally "asan" "$sum"
else tail -40 asan.log; total_f=$((total_f + 1)); fi
rm -f asan.log

echo "== fuzz smoke"
one "fuzz smoke" make -s fuzz-smoke FUZZ_SECONDS="${FUZZ_SECONDS:-10}"

if command -v nvcc >/dev/null 2>&1; then
    echo "== CUDA compile (sm_90a)"
    one "cuda build" make -s -j"$jobs" cuda cuda-tests deepinfer-cuda
    # the CUDA sampler's kernel source run on the host (one thread per block) against the CPU sampler
    one "cuda sampler (host emulation)" sh -c 'make -s cuda-sample-emu && DI_QUICK=1 build/emu/test_cuda_sample_emu | tail -1 | grep -q " 0 failed"'
fi
# the exact bf16 GEMM kernels' source run on the host (threads as fibers) against the CPU op: no CUDA needed
one "cuda bf16 GEMMs (host emulation)" sh -c 'make -s cuda-bf16-emu && build/emu/test_cuda_gemm_bf16_emu | tail -1 | grep -q " 0 failed"'
one "cuda heap pipeline (host emulation)" sh -c 'make -s cuda-heap-emu && build/emu/test_cuda_heap_pipe_emu | tail -1 | grep -q " 0 failed"'
rm -f "$sum"
echo "$total_p passed, $total_f failed"
[ "$total_f" -eq 0 ]
