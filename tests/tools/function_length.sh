#!/usr/bin/env bash
# The house rule "no function over ~150 lines" (docs/design.md, layout), checked: every
# function of the library and the tools (algorithms/, base/, config/, core/, shim/,
# streamext/, tools/) measured by pmccabe (its fifth column: the function's lines). Exit 0
# when none is longer than 150 lines, 1 (naming them) otherwise, 77 (skipped) without pmccabe
# (apt-get install pmccabe: scripts/install-deps.sh installs it).
#   tests/tools/function_length.sh SOURCE_ROOT [LIMIT]
set -euo pipefail
root=${1:?source root}
limit=${2:-150}
command -v pmccabe >/dev/null || { echo "function_length: pmccabe not installed: skipped"; exit 77; }
cd "$root"
mapfile -t files < <(ls algorithms/*.cpp algorithms/*.cu base/*.cpp config/*.cpp core/*.cpp shim/*.cpp \
                        streamext/*.cpp tools/*.cpp 2>/dev/null)
long=$(pmccabe "${files[@]}" 2>/dev/null | awk -v lim="$limit" '$5 > lim {print $5 " lines: " $6 " " $7}')
echo "function_length: ${#files[@]} files, longest: $(pmccabe "${files[@]}" 2>/dev/null |
  sort -k5 -n | tail -1 | awk '{print $5 " lines, " $6 " " $7}')"
if [ -n "$long" ]; then
  echo "functions over $limit lines:"
  echo "$long"
  exit 1
fi
