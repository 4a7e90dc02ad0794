#!/usr/bin/env bash
# The function-length check, checked (tests/tools/function_length.sh): it must fail a long
# function hidden where pmccabe alone sees nothing (a C++17 nested namespace, a member
# declared `const override`, a struct with alignas), fail a file it cannot read, and pass
# short functions written the same ways. Exit 0 when it does all of that, 1 otherwise,
# 77 without pmccabe.
#   tests/tools/function_length_selftest.sh PATH/TO/function_length.sh
set -euo pipefail
check=${1:?function_length.sh}
command -v pmccabe >/dev/null || { echo "function_length_selftest: pmccabe not installed: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

body() {  # N statement lines
  for ((i = 0; i < $1; ++i)); do echo "  x += $i;"; done
}
# $1 case name, $2 expected exit code (0 or 1), $3 text the output must hold; the file is
# read from standard input and placed at core/case.cpp of a fresh root.
expect() {
  local root="$work/$1" out rc=0
  mkdir -p "$root/core"
  cat > "$root/core/case.cpp"
  printf 'namespace streamcoll::base {\nint short_one() { return 1; }\n}\n' > "$root/core/other.cpp"
  out=$(bash "$check" "$root" 150 2>&1) || rc=$?
  if [ "$rc" != "$2" ] || ! grep -qF -- "$3" <<< "$out"; then
    echo "FAIL $1: exit $rc (want $2), output:"
    echo "$out" | sed 's/^/  /'
    echo "$1" >> "$work/failed"  # expect runs in a pipeline's subshell
  else
    echo "ok   $1"
  fi
}

{ echo 'namespace streamcoll::core {'; echo 'int long_one(int x) {'; body 160; echo '  return x;'
  echo '}'; echo '}  // namespace streamcoll::core'; } | expect nested-namespace-long 1 'long_one'
{ echo 'namespace streamcoll::core {'; echo 'int short_one(int x) {'; body 20; echo '  return x;'
  echo '}'; echo '}  // namespace streamcoll::core'; } | expect nested-namespace-short 0 '2 functions'
{ echo 'namespace a::b {'; echo 'struct alignas(64) S {'; echo '  virtual int f(int x) const;'
  echo '};'; echo 'struct T : S {'; echo '  int f(int x) const override {'; body 160
  echo '    return x;'; echo '  }'; echo '};'; echo '}'; } | expect override-long 1 'f'
{ echo 'namespace a {'; echo '#define MEMBER(n) int n = 0;'; echo '#define ALL(X) X(a) X(b)'
  echo 'struct Table {'; echo '  ALL(MEMBER)'; echo '};'
  echo '__attribute__((constructor)) void hook(int x) {'; body 160; echo '}'; echo '}'; } |
  expect macro-members-long 1 'hook'
{ echo 'namespace a {'; echo 'int broken(int x) {'; echo '  if (x) {'; echo '  return x;'
  echo '}'; } | expect unreadable 1 'cannot read'

if [ -s "$work/failed" ]; then
  echo "function_length_selftest: $(wc -l < "$work/failed") case(s) failed"
  exit 1
fi
echo "function_length_selftest: the check fails what it must"
