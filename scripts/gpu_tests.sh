#!/bin/sh
# Every GPU check on an NVIDIA Hopper GPU (H100/H200), then one summary table:
#   1. the test binaries of `make cuda-tests` (op kernels against the CPU ops, cache codecs and a device
#      cache against the host cache), each with its own table; then test_cuda_ops and test_cuda_index_seqs
#      once more with the heap path's serial steps (DI_CUDA_HEAP=serial; the pipeline is the default);
#   2. `deepinfer verify --device cuda` on every golden case: op vectors (kernels.safetensors),
#      free-running prefill within 3x the case's noise floor, teacher-forced blocks within 1.5e-2;
#      again with the top-k gather in slices of a few queries (DI_FWD_GATHER_ROWS=24: the same output, byte
#      for byte); then once more with DI_CUDA_KERNELS=tensor (the tensor-core kernels, same bounds, not
#      bit-exact);
#   3. `deepinfer generate --device cuda` greedy (plain, chunked prefill, DSpark drafts with rollback)
#      against `--device cpu` of the same binary on the tiny models: the token ids must be equal;
#   4. `deepinfer run --device cuda --json` (the engine: continuous batching, paged device caches, the
#      GPU sampler) on the tiny models and a `mkmodel --preset tiny` one (real vocabulary) with a batch file of seeded greedy / temperature / top-k / top-p / min-p requests with
#      logprobs, against `run --device cpu` of the same binary: every request's token ids equal (the
#      detail says whether the whole choice objects, logprobs included, are identical too).
# The test binaries include test_cuda_sample (the GPU sampler against the CPU sampler, bit for bit) and
# test_cuda_engine (the engine on the GPU: batch invariance, seeded sampling against the CPU backend,
# GPU sampling path against the host sampling path) when `make cuda-tests` built them.
#
#   sh scripts/gpu_tests.sh [BIN_DIR] [KERNELS]
#   BIN_DIR  where `make cuda-tests` put the test binaries (default build/cuda)
#   KERNELS  the reference vectors (default tests/data/kernels.safetensors)
#   DI_CLI   the CUDA-enabled CLI (default build/deepinfer-cuda, `make deepinfer-cuda`)
#   DI_GOLDEN_CASES  golden case directories (default: the two tiny cases in tests/data and
#                    ../shared/golden/v41-mid-nosel when present)
# DI_GPU_SECTIONS  which sections run (default "bins verify generate run"); DI_TINY_CASES the tiny
#                  models of sections 3-4 (default tests/data/v41-tiny-sel and v41-tiny-nosel).
#   5. (opt-in: DI_GPU_SECTIONS names "bench") `bench gpu` on the full-layer preset through
#      scripts/bench_gpu.sh — the checkpoint written to a tmpfs, the load phase by phase (open, where the
#      checkpoint's bytes are, upload progress with page-in / copy / drain), then the shapes
#      (DI_BENCH_SHAPES, default B 1,64 x ctx 4K + an 8K prefill, --op-times); bounded by DI_BENCH_S
#      (default 300 s) and DI_MKMODEL_S (default 120 s); its files go to DI_BENCH_OUT (default $OUT/bench
#      when OUT is set, else a temporary directory).
# Each test binary runs under DI_BIN_TIMEOUT seconds (default 300): one that hangs is cut and counted failed.
# One device call for all of it (binaries and the CLI built here: make cuda-tests deepinfer-cuda):
#   DI_GPU_SECTIONS="bins verify bench" DI_GOLDEN_CASES="tests/data/v41-tiny-sel tests/data/v41-tiny-nosel" \
#     sh scripts/gpu_tests.sh build/cuda tests/data/kernels.safetensors
# Set DI_SANITIZE=1 to run each test binary (DI_QUICK shapes) and each verify once more under
# compute-sanitizer memcheck. DI_CUDA_TOPK=fast switches the CUDA selections to the parallel kernels
# (tie rule: higher score, then lower position), which v41-tiny-sel's teacher-forced bound rejects.
# Exit status: 0 when every check passed.
set -u
BIN_DIR=${1:-build/cuda}
KERNELS=${2:-tests/data/kernels.safetensors}
CLI=${DI_CLI:-build/deepinfer-cuda}
CASES=${DI_GOLDEN_CASES:-"tests/data/v41-tiny-sel tests/data/v41-tiny-nosel ../shared/golden/v41-mid-nosel"}
TINY=${DI_TINY_CASES:-"tests/data/v41-tiny-sel tests/data/v41-tiny-nosel"}
SECTIONS=${DI_GPU_SECTIONS:-"bins verify generate run"}
section() { case " $SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }
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

# A model with the real 129,280-token vocabulary and the V4.1 tokenizer (random weights) for the engine
# checks (test_cuda_engine's DI_ENGINE_MODELS, section 4): the GPU sampler on full-size rows, grammars.
BIGV=""
if [ -x "$CLI" ] && "$CLI" mkmodel --preset tiny --out "$TMP/tiny-vocab" >"$TMP/mk" 2>&1; then
    BIGV="$TMP/tiny-vocab"
else
    echo "== mkmodel --preset tiny failed: $(tail -1 "$TMP/mk" 2>/dev/null)"
fi
DI_ENGINE_MODELS=${DI_ENGINE_MODELS:-"$TINY $BIGV"}
export DI_ENGINE_MODELS

# ---- 1. test binaries ----
found=0
section bins || found=1
for t in "$BIN_DIR"/test_*; do
    section bins || break
    [ -x "$t" ] || continue
    found=1
    echo "== $t"
    t0=$(date +%s)
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 5 "${DI_BIN_TIMEOUT:-300}" "$t" "$KERNELS" >"$TMP/out" 2>&1
    else
        "$t" "$KERNELS" >"$TMP/out" 2>&1
    fi
    rc=$?
    cat "$TMP/out"
    [ $rc = 124 ] && echo "== $t: cut after ${DI_BIN_TIMEOUT:-300} s"
    last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$TMP/out" | tail -1)
    row "$(basename "$t")" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "${last:-exit $rc} ($(($(date +%s) - t0)) s)"
    if [ "${DI_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
        echo "== compute-sanitizer $t"
        DI_QUICK=1 compute-sanitizer --tool memcheck --print-limit 10 "$t" "$KERNELS" >"$TMP/san" 2>&1
        rc=$?
        tail -3 "$TMP/san"
        row "memcheck $(basename "$t")" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$TMP/san")"
    fi
done
[ $found = 1 ] || row "test binaries" FAIL "none in $BIN_DIR (run make cuda-tests)"

# The heap path's serial steps (DI_CUDA_HEAP=serial; the default is the pipeline of cuda_heap_pipe.cuh) on
# the binaries with heap-path rows (the torch-order top-k of rows ≥ 64·k entries, tied / NaN rows, the
# batched selection): both forms must give the CPU's bits.
for t in test_cuda_ops test_cuda_index_seqs; do
    section bins || break
    [ -x "$BIN_DIR/$t" ] || continue
    echo "== DI_CUDA_HEAP=serial $t"
    t0=$(date +%s)
    DI_CUDA_HEAP=serial timeout -k 5 "${DI_BIN_TIMEOUT:-300}" "$BIN_DIR/$t" "$KERNELS" >"$TMP/out" 2>&1
    rc=$?
    grep -E 'topk torch|candidate_mask torch|topk_rows|FAIL' "$TMP/out" | head -40
    last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$TMP/out" | tail -1)
    row "$t (heap serial)" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "${last:-exit $rc} ($(($(date +%s) - t0)) s)"
done

# ---- 2. verify --device cuda on the golden cases ----
if [ -x "$CLI" ]; then
    for c in $CASES; do
        section verify || break
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
        # the top-k gather in slices of a few queries (forward_block.c attend_sliced, what prefills longer than
        # 262,144 / top-k tokens run): the same output, byte for byte
        cp "$TMP/out" "$TMP/out_whole"
        DI_FWD_GATHER_ROWS=24 timeout 300 "$CLI" verify --model "$c" --golden "$c/golden.safetensors" \
            --kernels "$KERNELS" --device cuda >"$TMP/out" 2>&1
        rc=$?
        row "verify cuda (sliced gather) $name" "$([ $rc = 0 ] && cmp -s "$TMP/out" "$TMP/out_whole" && echo PASS || echo FAIL)" \
            "DI_FWD_GATHER_ROWS=24: output $(cmp -s "$TMP/out" "$TMP/out_whole" && echo identical || echo DIFFERENT)"
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
    for c in $TINY; do
        section generate || break
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

    # ---- 4. run --device cuda --json: the engine on the GPU against --device cpu ----
    cat >"$TMP/requests.jsonl" <<'EOF'
{"custom_id": "greedy", "prompt_ids": [5, 17, 42, 99, 3, 250, 7, 1, 64], "max_tokens": 12, "temperature": 0, "logprobs": 5, "ignore_eos": true}
{"custom_id": "t1", "prompt_ids": [128, 9, 33, 2, 11, 301, 77, 6, 45, 200, 13], "max_tokens": 12, "temperature": 1.0, "seed": 7, "logprobs": 3, "ignore_eos": true}
{"custom_id": "topk-topp", "prompt_ids": [40, 41, 42], "max_tokens": 16, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 11, "ignore_eos": true}
{"custom_id": "minp", "prompt_ids": [7, 7, 7, 7, 300, 301, 302, 5, 9, 11, 13, 17, 19, 23, 29, 31, 37, 41], "max_tokens": 10, "temperature": 1.3, "min_p": 0.05, "seed": 3, "ignore_eos": true}
{"custom_id": "topp", "prompt_ids": [500, 3], "max_tokens": 20, "temperature": 0.7, "top_p": 0.5, "seed": 12345, "logprobs": 1, "ignore_eos": true}
{"custom_id": "short", "prompt_ids": [66], "max_tokens": 4, "temperature": 0.5, "seed": 1, "ignore_eos": true}
EOF
    for c in $TINY $BIGV; do
        section run || break
        [ -f "$c/config.json" ] || continue
        name=$(basename "$c")
        ok=1
        rm -f "$TMP/run_cpu.jsonl" "$TMP/run_cuda.jsonl"
        for dev in cpu cuda; do
            timeout 120 "$CLI" run --model "$c" --input "$TMP/requests.jsonl" --output "$TMP/run_$dev.jsonl" \
                --max-seqs 4 --max-context 64 --prefill-chunk 5 --device $dev --quiet --json >"$TMP/json_$dev" \
                2>"$TMP/err_$dev" || ok=0
            echo "== run --device $dev $name: $(cat "$TMP/json_$dev") $(head -c 300 "$TMP/err_$dev")"
        done
        # per custom_id: the token ids (the pass criterion) and the whole choice objects
        cmp=$(python3 - "$TMP/run_cpu.jsonl" "$TMP/run_cuda.jsonl" <<'EOF'
import json, sys
def load(path):
    out = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        d = json.loads(line)
        body = (d.get("response") or {}).get("body") or {}
        ch = body.get("choices") or [{}]
        out[d["custom_id"]] = (d.get("error"), ch[0].get("token_ids"), ch)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
# every line must succeed on both devices with equal token ids
def err(x):
    return (x[0] or {}).get("message")
bad = [k for k in a if k not in b or err(a[k]) or err(b[k]) or a[k][1] != b[k][1] or not a[k][1]]
failed = [k for k in a if err(a[k])]
same = sum(1 for k in a if k in b and a[k][2] == b[k][2])
toks = sum(len(a[k][1] or []) for k in a)
print("%s %d requests, %d tokens; token ids %s; whole choices (logprobs incl.) identical %d/%d%s" %
      ("OK" if not bad and len(a) == 6 and len(b) == 6 else "BAD", len(b), toks,
       "equal" if not bad else "differ in " + ",".join(bad), same, len(a),
       "; failed: %s" % ",".join(failed) if failed else ""))
EOF
)
        echo "== run $name: $cmp"
        case "$cmp" in OK*) ;; *) ok=0 ;; esac
        row "run --device cuda --json $name" "$([ $ok = 1 ] && echo PASS || echo FAIL)" "${cmp#OK }"
    done
else
    row "verify / generate / run" FAIL "no CUDA CLI at $CLI (make deepinfer-cuda)"
fi

# ---- 5. bench gpu full-layer: the load phase by phase, then the shapes (opt-in) ----
if section bench; then
    if [ -x "$CLI" ]; then
        if [ -n "${DI_BENCH_OUT:-}" ]; then BOUT=$DI_BENCH_OUT; elif [ -n "${OUT:-}" ]; then BOUT=$OUT/bench; else BOUT=$TMP/bench; fi
        mkdir -p "$BOUT"
        t0=$(date +%s)
        echo "== bench gpu full-layer (files in $BOUT)"
        DEEPINFER_CUDA="$CLI" DEEPINFER="$CLI" SKIP_TORCH=1 TIMEOUT_MKMODEL="${DI_MKMODEL_S:-120}" \
            TIMEOUT_BENCH="${DI_BENCH_S:-300}" \
            SHAPES="${DI_BENCH_SHAPES:---batch 1,64 --context 4096 --prefill 8192 --iters 3 --warmup 1 --prefill-iters 1 --prefill-warmup 0}" \
            BENCH_ARGS="${DI_BENCH_ARGS:---op-times}" sh scripts/bench_gpu.sh full-layer "$BOUT" >"$TMP/bench" 2>&1
        rc=$?
        # the load lines, the checkpoint's place and every finished shape's rows (the log holds them all)
        grep -E "^(bench gpu: |checkpoint directory|warning|mkmodel|sync before|deepinfer bench gpu: exit|swa|r[0-9]+-|role)" "$TMP/bench"
        loaded=$(grep -o 'loaded on [a-z]* in [0-9.]* s' "$TMP/bench" | head -1)
        # a load cut short: where it was (the last phase or progress line)
        [ -n "$loaded" ] || loaded="not loaded, last: $(grep -E '^bench gpu: (opening|opened|backend|weights to)' "$TMP/bench" |
            tail -1 | sed 's/^bench gpu: //')"
        store=$(grep -m1 'checkpoint before the upload' "$TMP/bench" |
            sed 's/.*before the upload: //; s/ (page cache \/ tmpfs); MemTotal [^,]*, MemAvailable [^,]*,/;/')
        synced=$(grep -m1 '^sync before the load' "$TMP/bench")
        up=$(grep -m1 '^bench gpu: weights on cuda' "$TMP/bench" | sed 's/^bench gpu: weights on cuda: //; s/, [0-9.]* GB of host.*//')
        rows=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["rows"]))' \
            "$BOUT/deepinfer_bench_gpu-full-layer.json" 2>/dev/null || echo 0)
        row "bench gpu full-layer" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
            "${loaded:-no load line}; ${store:-no storage line}; upload ${up:-none}; ${synced:+$synced; }$rows rows in the JSON ($(($(date +%s) - t0)) s)"
    else
        row "bench gpu full-layer" FAIL "no CUDA CLI at $CLI (make deepinfer-cuda)"
    fi
fi

echo
echo "== summary ($(date -u +%Y-%m-%dT%H:%MZ))"
printf '%-34s %-6s %s\n' check result detail
cat "$SUMMARY"
rm -rf "$TMP"
exit $status
