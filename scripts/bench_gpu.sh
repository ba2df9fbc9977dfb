#!/bin/sh
# Layer benchmarks on the GPU machine (issue 10, item 3), one command: write the checkpoint (if absent),
# time the PyTorch peer (bench/torch_layer.py), then `deepinfer bench gpu --device cuda --peer` on the same
# checkpoint, which prints the combined table (per role: decode ms, GB/s, % of HBM roofline at each
# batch x context; prefill TFLOP/s, % of FP8 peak; the peer's ms and peer/ours).
#   sh scripts/bench_gpu.sh [PRESET] [OUT_DIR]
#   PRESET   full-layer (default; ~35 GB written to $CKPT) or small (the quick check)
#   OUT_DIR  where results go (default $OUT, else ./bench-out): gpu.txt, mkmodel.log,
#            torch_layer-PRESET.json (one JSON document), .partial.json (rewritten after every layer) and
#            .log, deepinfer_bench_gpu-PRESET.json (the rows) and .log (progress + the combined table)
# Environment:
#   DEEPINFER   the deepinfer binary for mkmodel (default: first of .carry/deepinfer-static,
#               build/deepinfer-static, the CUDA CLI, build/deepinfer — the device machine lacks
#               jansson/PCRE2/utf8proc, so carry a static one: `make deepinfer-static` or `make deepinfer-cuda`)
#   TORCH_LAYER the peer script (default: bench/torch_layer.py, else .carry/torch_layer.py)
#   CKPT        checkpoint directory (default for full-layer: /mnt/ck/fl on a tmpfs mounted there when
#               /tmp is no tmpfs and mounting works, else /tmp/fl; /tmp/sm for small; reused if present)
#   CKPT_TMPFS  the full-layer checkpoint's tmpfs mount point (default /mnt/ck)
#   DEEPINFER_CUDA the CUDA-enabled CLI for `bench gpu` (default: .carry/deepinfer-cuda, build/deepinfer-cuda,
#               else DEEPINFER)
#   TORCH_ARGS  extra arguments for torch_layer.py (e.g. --small, --layers 0,2, --no-compile); small
#               presets should pass --small so both sides time the same shapes
#   SHAPES      bench gpu's shapes (default: the peer's: full-layer B 1,8,64,256 x ctx 4K,64K + 8K prefill;
#               otherwise B 1,64 x ctx 4K + 2K prefill, 8 iterations unless SHAPES or BENCH_ARGS name --iters)
#   DEVICE      bench gpu's --device (default cuda; cpu runs the whole script as a smoke test)
#   BENCH_ARGS  extra arguments for `deepinfer bench gpu` (e.g. --iters 20, --hbm-gbps 4470)
#   SKIP_TORCH  1: do not run the peer (an earlier torch_layer-PRESET.json in OUT_DIR is still joined)
#   TIMEOUT_MKMODEL, TIMEOUT_TORCH, TIMEOUT_BENCH  seconds each stage may run (coreutils timeout; unset =
#               no limit): a stage cut short still leaves its partial output (bench gpu prints every
#               shape's rows on its log as the shape finishes; the peer rewrites its .partial.json)
# On the device machine (10 minutes per command): `make deepinfer-cuda` here, then run
#   sh scripts/bench_gpu.sh full-layer        with carry build/deepinfer-cuda
# The checkpoint and the peer's per-layer partial JSON survive a cut-short run on a warm machine; run
# again with SKIP_TORCH=1 to time only our layers against what the peer finished.
# Exit status: 0 when the checkpoint exists, the PyTorch peer ran every shape and bench gpu succeeded.
set -u
PRESET=${1:-full-layer}
OUTD=${2:-${OUT:-bench-out}}
mkdir -p "$OUTD"

pick() { for f in "$@"; do [ -e "$f" ] && { echo "$f"; return; }; done; }
# limit SECONDS CMD...: CMD under coreutils timeout when SECONDS is set (exit 124 when cut short)
limit() {
    t=$1
    shift
    if [ -n "$t" ] && command -v timeout >/dev/null 2>&1; then timeout -k 5 "$t" "$@"; else "$@"; fi
}
DICUDA=${DEEPINFER_CUDA:-$(pick .carry/deepinfer-cuda build/deepinfer-cuda)}
# mkmodel runs with any CLI: the static one, else the CUDA one (its libraries are linked in statically)
DI=${DEEPINFER:-$(pick .carry/deepinfer-static build/deepinfer-static "$DICUDA" build/deepinfer)}
TL=${TORCH_LAYER:-$(pick bench/torch_layer.py .carry/torch_layer.py)}
# The full-layer checkpoint (~36 GB) goes on a tmpfs: the 39acd46 run loaded it from one in 8.1 s, while
# session 3's runs, which wrote it to /tmp (the VM's disk, /dev/vda) and loaded it right after, printed
# nothing for 100-120 s (bench/NOTES-gpu.md, "Load time of bench gpu"). CKPT_TMPFS names the mount point
# (default /mnt/ck, mounted when absent).
if [ -z "${CKPT:-}" ]; then
    case $PRESET in
        full-layer)
            CKPT=/tmp/fl
            TMPFS=${CKPT_TMPFS:-/mnt/ck}
            if [ "$(stat -f -c %T /tmp 2>/dev/null)" != tmpfs ]; then
                if [ "$(stat -f -c %T "$TMPFS" 2>/dev/null)" = tmpfs ] ||
                    { mkdir -p "$TMPFS" && mount -t tmpfs -o size=42g tmpfs "$TMPFS"; } 2>/dev/null; then
                    CKPT=$TMPFS/fl
                fi
            fi
            ;;
        *) CKPT=/tmp/sm ;;
    esac
fi

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1
    df -h /tmp | tail -1
    free -g | head -2
    mkdir -p "$CKPT" 2>/dev/null
    fs=$(stat -f -c %T "$CKPT" 2>/dev/null)
    echo "checkpoint directory $CKPT on ${fs:-unknown}"
    [ "$fs" = tmpfs ] || [ "$PRESET" != full-layer ] ||
        echo "warning: the full-layer checkpoint is not on a tmpfs: bench gpu may read it from the disk (slow load)"
} | tee "$OUTD/gpu.txt"

# (a) the checkpoint (the index is written after the last weight shard: a cut-short write has none)
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
    if [ -z "$DI" ]; then
        echo "no deepinfer binary (set DEEPINFER or carry .carry/deepinfer-static)"
        exit 1
    fi
    t0=$(date +%s)
    limit "${TIMEOUT_MKMODEL:-}" "$DI" mkmodel --preset "$PRESET" --out "$CKPT" >"$OUTD/mkmodel.log" 2>&1
    rc=$?
    t1=$(date +%s)
    echo "mkmodel --preset $PRESET: exit $rc, $((t1 - t0)) s, $(du -sh "$CKPT" 2>/dev/null | cut -f1)" | tee -a "$OUTD/mkmodel.log"
    [ $rc = 0 ] || { tail -5 "$OUTD/mkmodel.log"; exit 1; }
fi

# A checkpoint on a disk: write everything out before the timed load, so its write-back does not run
# during the load, and report how long that took (the disk's write speed, and what a load straight after
# mkmodel would have competed with: session 3's silent 100-120 s).
if [ "$(stat -f -c %T "$CKPT" 2>/dev/null)" != tmpfs ]; then
    t0=$(date +%s)
    dw=$(grep -E '^(Dirty|Writeback):' /proc/meminfo 2>/dev/null | tr -s ' ' | tr '\n' ' ')
    sync
    echo "sync before the load: $(($(date +%s) - t0)) s (before it: ${dw:-no /proc/meminfo})" | tee -a "$OUTD/gpu.txt"
fi

# (b) the PyTorch peer
status=0
if [ "${SKIP_TORCH:-0}" = 1 ]; then
    echo "torch_layer.py: skipped (SKIP_TORCH=1)"
elif [ -z "$TL" ]; then
    echo "no torch_layer.py (set TORCH_LAYER)"
    status=1
else
    # shellcheck disable=SC2086
    # --partial keeps the finished layers if the run is cut short (the device's 10-minute command limit)
    limit "${TIMEOUT_TORCH:-}" env PYTHONUNBUFFERED=1 python3 "$TL" "$CKPT" --json --partial "$OUTD/torch_layer-$PRESET.partial.json" \
        ${TORCH_ARGS:-} >"$OUTD/torch_layer-$PRESET.json" 2>"$OUTD/torch_layer-$PRESET.log"
    status=$?
    cat "$OUTD/torch_layer-$PRESET.log"
    echo "torch_layer.py: exit $status"
fi

# (c) our layers: `deepinfer bench gpu` on the same checkpoint, the peer's times joined in by role and shape
case $PRESET in
    full-layer) DEF_SHAPES="--batch 1,8,64,256 --context 4096,65536 --prefill 8192" ;;
    *) DEF_SHAPES="--batch 1,64 --context 4096 --prefill 2048" ;; # torch_layer.py --small's shapes
esac
SHAPES=${SHAPES:-$DEF_SHAPES}
# the small check repeats 8 times (the peer's --small count) unless SHAPES / BENCH_ARGS say otherwise
case " $SHAPES ${BENCH_ARGS:-} " in
    *" --iters "*) ;;
    *) [ "$PRESET" = full-layer ] || SHAPES="$SHAPES --iters 8" ;;
esac
DIB=${DICUDA:-$DI}
if [ -z "$DIB" ]; then
    echo "deepinfer bench gpu: skipped (no CUDA CLI: make deepinfer-cuda, or set DEEPINFER_CUDA)"
    exit 1
fi
PEER=""
for f in "$OUTD/torch_layer-$PRESET.json" "$OUTD/torch_layer-$PRESET.partial.json"; do
    # an empty or cut-short stdout document falls back to the per-layer partial one
    if [ -s "$f" ] && python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$f" 2>/dev/null; then
        PEER="--peer $f"
        break
    fi
done
# shellcheck disable=SC2086
limit "${TIMEOUT_BENCH:-}" "$DIB" bench gpu --model "$CKPT" --device "${DEVICE:-cuda}" $SHAPES $PEER ${BENCH_ARGS:-} --json \
    >"$OUTD/deepinfer_bench_gpu-$PRESET.json" 2>"$OUTD/deepinfer_bench_gpu-$PRESET.log"
brc=$?
# the log holds the progress lines and the combined table (ours | peer ms | speedup = peer / ours)
cat "$OUTD/deepinfer_bench_gpu-$PRESET.log"
echo "deepinfer bench gpu: exit $brc"
[ $brc = 0 ] || status=1
exit $status
