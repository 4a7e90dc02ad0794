#!/usr/bin/env bash
# The house's measures (issue 55's before/after table): library files and lines, the files
# over 500 and 1,000 lines, the longest functions (tests/tools/function_length.sh), and the
# counts of what should be written once: hand-written driver-result tests, small agreements
# written as PMPI_(I)allreduce of flags outside core/service, request types, switches on the
# collective. Read-only; run from any checkout:
#   scripts/house-metrics.sh [SOURCE_ROOT]
set -euo pipefail
root=${1:-$(dirname "$0")/..}
cd "$root"
lib=(algorithms base config core shim streamext)
mapfile -t files < <(find "${lib[@]}" -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.def' | sort)
total=$(cat "${files[@]}" | wc -l)
echo "library files: ${#files[@]}, lines: $total"
echo "files over 1000 lines:"; wc -l "${files[@]}" | awk '$2 != "total" && $1 > 1000 {print "  " $1 " " $2}'
echo "files over 500 lines:  $(wc -l "${files[@]}" | awk '$2 != "total" && $1 > 500' | wc -l)"
echo "route files (algorithms/*.cpp of a route) lines:"
for r in nccl ht blueconnect nvgroup ccube fusion self pmpi; do
  [ -f "algorithms/$r.cpp" ] && echo "  $r $(wc -l < "algorithms/$r.cpp")"
done
if command -v pmccabe >/dev/null; then
  echo "function-length check: $(bash tests/tools/function_length.sh . 2>/dev/null | head -1)"
fi
count() { grep -rEn "$1" "${lib[@]}" --include=*.cpp --include=*.hpp 2>/dev/null | grep -v "${2:-^$}" | wc -l; }
echo "hand-written driver-result tests (== / != CUDA_SUCCESS): $(count '[!=]= CUDA_SUCCESS')"
echo "flag agreements by hand (PMPI_(I)allreduce of MPI_INT under MIN/MAX outside core/service): $(
  count 'PMPI_I?[Aa]llreduce\(.*MPI_INT, MPI_M(IN|AX)' 'core/service.cpp')"
echo "ManagedRequest subclasses: $(count 'public ManagedRequest')"
echo "switches on the collective: $(count 'switch \(.*coll\)')"
