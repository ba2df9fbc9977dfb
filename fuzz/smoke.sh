#!/bin/sh
# Runs each libFuzzer harness for a few seconds from its seed corpus (fuzz/corpus/NAME/).
secs="$1"; shift
status=0
for bin in "$@"; do
    name=$(basename "$bin")
    corpus="fuzz/corpus/$name"
    work=$(mktemp -d)
    [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/ 2>/dev/null
    echo "fuzz $name for ${secs}s" >&2
    if ! "$bin" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 "$work" >"$work.log" 2>&1; then
        tail -40 "$work.log"; echo "fuzz $name: FAILED" >&2; status=1
    else
        grep -E '^(Done|#[0-9]+ *DONE)' "$work.log" | tail -1 >&2
    fi
    rm -rf "$work" "$work.log"
done
exit $status
