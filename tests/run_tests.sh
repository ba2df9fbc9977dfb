#!/bin/sh
# Runs cmocka test binaries with TAP output and prints one closing line "N passed, N failed".
# usage: run_tests.sh BUILD_DIR all|NAME...
# A binary that crashes or exits non-zero without reporting a failed test counts as one failure.
build="$1"; shift
if [ "$1" = all ]; then set -- $(ls "$build"/tests/ | grep '^test_' | grep -v '\.d$'); fi
passed=0; failed=0; skipped=0; failed_names=""
for t in "$@"; do
    bin="$build/tests/$t"
    out=$(CMOCKA_MESSAGE_OUTPUT=TAP "$bin" 2>&1); rc=$?
    ok=$(printf '%s\n' "$out" | grep -c '^ok ')
    # a cmocka skip (data that only exists on a developer machine) is neither a pass nor a failure
    skp=$(printf '%s\n' "$out" | grep -c '^not ok .*# SKIP')
    nok=$(($(printf '%s\n' "$out" | grep -c '^not ok ') - skp))
    if [ $rc -ne 0 ] && [ "$nok" -eq 0 ]; then nok=1; fi
    skipped=$((skipped + skp))
    [ "$skp" -gt 0 ] && printf '%s\n' "$out" | grep '^not ok .*# SKIP' | sed "s/^/  [$t] skipped: /"
    passed=$((passed + ok)); failed=$((failed + nok))
    if [ "$nok" -gt 0 ]; then
        printf '%s\n' "$out"
        failed_names="$failed_names $t"
        printf 'FAIL %-36s %d passed, %d failed (exit %d)\n' "$t" "$ok" "$nok" "$rc"
    else
        # keep lines tests print on purpose (measured errors, bounds) visible in CI logs
        printf '%s\n' "$out" | grep '^# ' | grep -v '^# \(ok\|not ok\)' | sed "s/^/  [$t] /"
        printf 'ok   %-36s %d passed\n' "$t" "$ok"
    fi
done
[ -n "$failed_names" ] && echo "failed:$failed_names"
[ "$skipped" -gt 0 ] && echo "$skipped skipped (not counted)"
echo "$passed passed, $failed failed"
[ -n "$SUMMARY_FILE" ] && echo "$passed $failed" > "$SUMMARY_FILE"
[ "$failed" -eq 0 ]
