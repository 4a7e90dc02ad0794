#!/usr/bin/env bash
# A Fortran application under streamcoll's routes: Quantum ESPRESSO's pw.x (Debian's
# quantum-espresso, Open MPI) on a small silicon SCF (the pseudopotential from
# quantum-espresso-data's examples), once without streamcoll and once with every
# collective route ht takes forced onto it (STREAMCOLL_ROUTE), with the statistics. Prints
# each run's energies and streamcoll's statistics table; the energies must agree.
#   scripts/fortran-qe.sh [NP [OUTDIR]]     (NP default 4; OUTDIR default a temporary one)
# pw.x runs with -nd 1 (no ScaLAPACK diagonalisation): ScaLAPACK's BLACS calls MPI with
# user-defined ops and derived datatypes, which go to the MPI whatever the route; a run
# without -nd 1 shows them on pmpi (PW_ARGS="" to see it).
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-4}
out=${2:-$(mktemp -d)}
build=${BUILD_DIR:-build}
command -v pw.x >/dev/null && [ -d /usr/share/doc/quantum-espresso/examples ] ||
  apt-get install -y --no-install-recommends quantum-espresso quantum-espresso-data >/dev/null
lib=$(cd "$build" && pwd)/libstreamcoll.so
[ -f "$lib" ] || { echo "fortran-qe: build $build first (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$out"
cd "$out"
zcat /usr/share/doc/quantum-espresso/examples/EPW/sic/pp/Si.pz-vbc.UPF.gz > Si.pz-vbc.UPF
cat > si.scf.in <<'IN'
 &control
    calculation = 'scf', prefix = 'si', pseudo_dir = './', outdir = './tmp'
 /
 &system
    ibrav = 2, celldm(1) = 10.20, nat = 2, ntyp = 1, ecutwfc = 30.0
 /
 &electrons
    conv_thr = 1.0d-10
 /
ATOMIC_SPECIES
 Si  28.086  Si.pz-vbc.UPF
ATOMIC_POSITIONS alat
 Si 0.00 0.00 0.00
 Si 0.25 0.25 0.25
K_POINTS automatic
 6 6 6 1 1 1
IN
export OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe -np "$np")
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
pw_args=${PW_ARGS--nd 1}
"${mpirun[@]}" pw.x $pw_args -in si.scf.in > plain.out 2>&1
routes=allreduce:ht,reduce:ht,bcast:ht,allgather:ht,reduce_scatter_block:ht
LD_PRELOAD=$lib STREAMCOLL_STATS=1 STREAMCOLL_THREAD_MULTIPLE=1 STREAMCOLL_ROUTE=$routes \
  "${mpirun[@]}" -x LD_PRELOAD -x STREAMCOLL_STATS -x STREAMCOLL_THREAD_MULTIPLE \
  -x STREAMCOLL_ROUTE -x OMP_NUM_THREADS pw.x $pw_args -in si.scf.in > ht.out 2>&1
status=0
for run in plain ht; do
  echo "=== $run ($np ranks): mpirun -np $np pw.x $pw_args -in si.scf.in"
  grep -E "^!|one-electron|hartree contrib|xc contribution|ewald contrib|highest occupied|convergence has been|PWSCF.*WALL" "$run.out"
done
if ! diff <(grep -E "^!|contribution|highest occupied" plain.out) \
          <(grep -E "^!|contribution|highest occupied" ht.out) >/dev/null; then
  echo "fortran-qe: the energies differ"; status=1
fi
sed -n '/streamcoll statistics/,$p' ht.out
echo "outputs: $out"
exit $status
