#!/usr/bin/env bash
# The house rule "no function over ~150 lines" (docs/design.md, layout), checked: every
# function of the library and the tools (algorithms/, base/, config/, core/, shim/,
# streamext/, tools/, their sources and headers) measured by pmccabe (its fifth column: the
# function's lines). Exit 0 when none is longer than LIMIT lines, 1 (naming them) otherwise,
# 77 (skipped) without pmccabe (apt-get install pmccabe: scripts/install-deps.sh installs it).
#   tests/tools/function_length.sh SOURCE_ROOT [LIMIT]
#
# pmccabe predates C++17 and is blind without a word to some of it: a file whose namespace
# opens as `namespace a::b {` yields no functions at all, and `__attribute__((...))` or a
# macro that opens a brace loses its place. So each file is read through a copy in which
# nested namespace names become one name and attributes are dropped (lines keep their
# numbers), and the check fails when pmccabe reports that it lost the structure of any file
# (a diagnostic on stderr) or finds no function in a file that defines one: a file it cannot
# read is never passed (tests/tools/function_length_selftest.sh tests both).
set -euo pipefail
root=${1:?source root}
limit=${2:-150}
command -v pmccabe >/dev/null || { echo "function_length: pmccabe not installed: skipped"; exit 77; }
cd "$root"
mapfile -t files < <(ls algorithms/*.cpp algorithms/*.cu algorithms/*.hpp base/*.cpp base/*.hpp \
                        config/*.cpp config/*.hpp core/*.cpp core/*.hpp shim/*.cpp shim/*.hpp \
                        streamext/*.cpp streamext/*.hpp tools/*.cpp 2>/dev/null)
[ ${#files[@]} -gt 0 ] || { echo "function_length: no sources under $root"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in "${files[@]}"; do
  mkdir -p "$work/$(dirname "$f")"
  # namespace a::b::c {  ->  namespace a__b__c {;  `const override {` and `struct alignas(64) S {`
  # lose the keyword; __attribute__((x)) goes; a line that is only a macro's expansion
  # (`  X_FUNCTIONS(X_MEMBER)`, members made by an X-macro) ends in `;`.
  sed -E -e ':a' -e 's/^([[:space:]]*(inline[[:space:]]+)?namespace[[:space:]]+[A-Za-z_0-9]+)::/\1__/' -e 'ta' \
         -e 's/\b(override|final)\b//g' -e 's/\balignas[[:space:]]*\([^()]*\)//g' \
         -e 's/__attribute__[[:space:]]*\(\([^()]*(\([^()]*\)[^()]*)*\)\)//g' \
         -e 's/^([[:space:]]+[A-Z][A-Z0-9_]*\([^;{}]*\))[[:space:]]*$/\1;/' "$f" > "$work/$f"
done

cd "$work"
bad=0
measured=$(mktemp)
for f in "${files[@]}"; do
  diag=$(pmccabe "$f" 2>&1 >/dev/null || true)
  if [ -n "$diag" ]; then
    echo "function_length: pmccabe cannot read $f:"
    echo "$diag" | sed 's/^/  /' | head -5
    bad=1
    continue
  fi
  out=$(pmccabe "$f" 2>/dev/null || true)
  # A file defines a function where a line ends a parameter list and opens a body.
  if [ -z "$out" ] && grep -Eq '\)[[:space:]]*(const[[:space:]]*)?(noexcept[[:space:]]*)?(override[[:space:]]*)?(final[[:space:]]*)?\{' "$f"; then
    echo "function_length: pmccabe finds no function in $f, which defines some"
    bad=1
    continue
  fi
  [ -n "$out" ] && echo "$out" >> "$measured"
done

echo "function_length: ${#files[@]} files, $(wc -l < "$measured") functions, longest: $(
  sort -k5 -n "$measured" | tail -1 | awk '{print $5 " lines, " $6 " " $7}')"
long=$(awk -v lim="$limit" '$5 > lim {print $5 " lines: " $6 " " $7}' "$measured")
rm -f "$measured"
if [ -n "$long" ]; then
  echo "functions over $limit lines:"
  echo "$long"
  bad=1
fi
exit $bad
