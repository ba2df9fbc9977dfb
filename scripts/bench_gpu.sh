#!/bin/sh
# Layer benchmarks on the GPU machine (issue 10, item 3): generate the checkpoint, time the PyTorch peer
# (bench/torch_layer.py), then `deepinfer bench gpu` on the same checkpoint.
#   sh scripts/bench_gpu.sh [PRESET] [OUT_DIR]
#   PRESET   full-layer (default; ~35 GB written to $CKPT) or small (the quick check)
#   OUT_DIR  where results go (default $OUT, else ./bench-out): gpu.txt, mkmodel.log,
#            torch_layer-PRESET.json (one JSON document), .partial.json (rewritten after every layer) and
#            .log, deepinfer_bench_gpu-PRESET.json and .log
# Environment:
#   DEEPINFER   the deepinfer binary (default: first of .carry/deepinfer-static, build/deepinfer-static,
#               build/deepinfer — the device machine lacks jansson/PCRE2/utf8proc, so carry the static one
#               built with `make deepinfer-static`)
#   TORCH_LAYER the peer script (default: bench/torch_layer.py, else .carry/torch_layer.py)
#   CKPT        checkpoint directory (default /tmp/fl for full-layer, /tmp/sm for small; reused if present)
#   TORCH_ARGS  extra arguments for torch_layer.py (e.g. --small, --layers 0,2, --no-compile)
# Exit status: 0 when the checkpoint exists and the PyTorch peer ran every shape.
set -u
PRESET=${1:-full-layer}
OUTD=${2:-${OUT:-bench-out}}
mkdir -p "$OUTD"

pick() { for f in "$@"; do [ -e "$f" ] && { echo "$f"; return; }; done; }
DI=${DEEPINFER:-$(pick .carry/deepinfer-static build/deepinfer-static build/deepinfer)}
TL=${TORCH_LAYER:-$(pick bench/torch_layer.py .carry/torch_layer.py)}
case $PRESET in
    full-layer) CKPT=${CKPT:-/tmp/fl} ;;
    *) CKPT=${CKPT:-/tmp/sm} ;;
esac

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1
    df -h /tmp | tail -1
} | tee "$OUTD/gpu.txt"

# (a) the checkpoint
if [ ! -f "$CKPT/config.json" ]; then
    if [ -z "$DI" ]; then
        echo "no deepinfer binary (set DEEPINFER or carry .carry/deepinfer-static)"
        exit 1
    fi
    t0=$(date +%s)
    "$DI" mkmodel --preset "$PRESET" --out "$CKPT" >"$OUTD/mkmodel.log" 2>&1
    rc=$?
    t1=$(date +%s)
    echo "mkmodel --preset $PRESET: exit $rc, $((t1 - t0)) s, $(du -sh "$CKPT" 2>/dev/null | cut -f1)" | tee -a "$OUTD/mkmodel.log"
    [ $rc = 0 ] || { tail -5 "$OUTD/mkmodel.log"; exit 1; }
fi

# (b) the PyTorch peer
status=0
if [ -z "$TL" ]; then
    echo "no torch_layer.py (set TORCH_LAYER)"
    status=1
else
    # shellcheck disable=SC2086
    # --partial keeps the finished layers if the run is cut short (the device's 10-minute command limit)
    PYTHONUNBUFFERED=1 python3 "$TL" "$CKPT" --json --partial "$OUTD/torch_layer-$PRESET.partial.json" \
        ${TORCH_ARGS:-} >"$OUTD/torch_layer-$PRESET.json" 2>"$OUTD/torch_layer-$PRESET.log"
    status=$?
    cat "$OUTD/torch_layer-$PRESET.log"
    echo "torch_layer.py: exit $status"
fi

# (c) our CUDA layer; until `deepinfer bench gpu` exists (issue 10) it reports why and is skipped
if [ -n "$DI" ]; then
    if "$DI" bench gpu --json "$CKPT" >"$OUTD/deepinfer_bench_gpu-$PRESET.json" 2>"$OUTD/deepinfer_bench_gpu-$PRESET.log"; then
        echo "deepinfer bench gpu: done"
    else
        echo "deepinfer bench gpu: skipped ($(head -c 300 "$OUTD/deepinfer_bench_gpu-$PRESET.log" | tr '\n' ' '))"
        rm -f "$OUTD/deepinfer_bench_gpu-$PRESET.json"
    fi
fi
exit $status
