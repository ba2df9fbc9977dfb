#!/bin/sh
# Run every GPU test on an NVIDIA Hopper GPU (H100/H200) and print their tables.
#   sh scripts/gpu_tests.sh [BIN_DIR] [KERNELS]
#   BIN_DIR  where `make cuda-tests` put the binaries (default build/cuda)
#   KERNELS  the reference vectors (default tests/data/kernels.safetensors)
# Set DI_SANITIZE=1 to run each test once more under compute-sanitizer (memcheck).
# Exit status: 0 when every test binary passed.
set -u
BIN_DIR=${1:-build/cuda}
KERNELS=${2:-tests/data/kernels.safetensors}
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
else
    echo "nvidia-smi not found: is this the GPU machine?"
fi
status=0
found=0
for t in "$BIN_DIR"/test_*; do
    [ -x "$t" ] || continue
    found=1
    echo "== $t"
    "$t" "$KERNELS" || status=1
    if [ "${DI_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
        echo "== compute-sanitizer $t"
        compute-sanitizer --tool memcheck --print-limit 10 "$t" "$KERNELS" | tail -3 || status=1
    fi
done
if [ $found = 0 ]; then
    echo "no test binaries in $BIN_DIR (run make cuda-tests)"
    exit 1
fi
exit $status
