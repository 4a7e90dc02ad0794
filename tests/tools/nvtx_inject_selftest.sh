#!/usr/bin/env bash
# The NVTX injection library (nvtx_inject.cpp) reports exactly what nvtx_inject_selftest
# emits, the checker (nvtx_inject_check.py) accepts it and rejects wrong expectations and
# an unbalanced run, and without NVTX_INJECTION64_PATH the program runs and nothing is
# written.
#   nvtx_inject_selftest.sh SELFTEST_EXE INJECT_LIB OUT_DIR
set -euo pipefail
exe=$1 lib=$2 out=$3
check=(/usr/bin/python3 "$(dirname "$0")/nvtx_inject_check.py")
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }

NVTX_INJECTION64_PATH=$lib NVTX_INJECT_OUT="$out/report.%p.txt" "$exe" || fail "selftest exited $?"
reports=("$out"/report.*.txt)
[ "${#reports[@]}" = 1 ] && [ -f "${reports[0]}" ] || fail "expected one report, got: ${reports[*]}"
cat "${reports[0]}"
"${check[@]}" "${reports[0]}" --balanced \
  --range selftest outer 6 --range selftest inner 6 --range '(default)' plain 1 \
  --payload selftest outer 600 --payload selftest inner 9 --payload selftest done 5 \
  --threads selftest outer 2 --threads selftest inner 2 --threads selftest done 1 \
  --mark selftest done 1 --mark '(default)' hello 1 --depth selftest 2 \
  --category selftest 7 seven --range-prefix selftest in 6 --no-domain streamcoll \
  --expect 'range\tselftest\touter\t6\t6\t600\t2' --expect 'unbalanced\t0\t0' ||
  fail "the report is not what the selftest emitted"
[ "$(wc -l <"${reports[0]}")" = 9 ] || fail "expected 9 lines in the report"

# Wrong expectations fail, one message each.
if "${check[@]}" "${reports[0]}" --range selftest outer 5 --mark selftest done 2 \
     --payload selftest inner 8 --range-prefix selftest out 7 --no-domain selftest \
     >"$out/wrong.txt"; then
  fail "the checker accepted wrong expectations"
fi
[ "$(grep -c FAIL "$out/wrong.txt")" = 5 ] || { cat "$out/wrong.txt"; fail "expected 5 failures"; }

# A pop without a push and a range left open.
NVTX_INJECTION64_PATH=$lib NVTX_INJECT_OUT="$out/unbalanced.txt" "$exe" unbalanced
grep -qx $'unbalanced\t1\t1' "$out/unbalanced.txt" || fail "unbalanced run not reported"
if "${check[@]}" "$out/unbalanced.txt" --balanced >/dev/null; then
  fail "the checker called an unbalanced run balanced"
fi

# No injection: runs, writes nothing.
rm -f "$out"/report.*.txt
env -u NVTX_INJECTION64_PATH NVTX_INJECT_OUT="$out/report.%p.txt" "$exe" || fail "plain run failed"
! ls "$out"/report.*.txt >/dev/null 2>&1 || fail "a report was written without injection"
echo "nvtx-inject-selftest: ok"
