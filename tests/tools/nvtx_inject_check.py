#!/usr/bin/python3
"""Check the report(s) of the NVTX injection library (tests/tools/nvtx_inject.cpp).

    nvtx_inject_check.py REPORT [REPORT...] [checks...]

Several reports (one per process, e.g. per MPI rank) are added together: counts, payloads
and threads summed, depth the largest. Checks (each may repeat):
  --range D M N          range M of domain D: exactly N pushes and N pops
  --range-min D M N      range M of domain D: at least N pushes
  --range-prefix D P N   the ranges of D whose message starts with P: at least N pushes
  --mark D M N           mark M of domain D: exactly N
  --mark-prefix D P N    the marks of D whose message starts with P: at least N
  --payload D M SUM      the uint64 payloads of range (or mark) M of D add up to SUM
  --threads D M N        range (or mark) M of D came from exactly N threads
  --depth D N            the deepest nesting of D's push/pop ranges is exactly N
  --category D ID NAME   category ID of D is named NAME
  --no-domain D          nothing at all recorded in domain D
  --expect LINE          LINE is in a report as is ("\\t" may stand for a tab)
  --balanced             no pop without a push, nothing open at exit, pushes == pops
  --stats-log FILE       streamcoll's ranges against its statistics table in FILE
                         (STREAMCOLL_STATS=1 at MPI_Finalize): per collective, the
                         pushes of "MPI_<Coll>" (e.g. MPI_Iallreduce) equal its calls; per
                         (collective, route) the ranges "<coll> <route> ..." likewise
  --dump                 print the summed report first
The default domain (non-domain API) is "(default)". Exit 0 when every check holds, 1 with
one line per failed check otherwise (2 for bad usage or an unreadable report).
"""
import argparse
import collections
import sys


def fatal(msg):
    print('nvtx_inject_check: ' + msg, file=sys.stderr)
    sys.exit(2)


def load(paths):
    stats = collections.defaultdict(lambda: [0, 0, 0, 0])  # (kind, D, M): push pop pay thr
    cats, depth, lines, unbalanced = {}, {}, set(), [0, 0]
    for path in paths:
        try:
            text = open(path, encoding='utf-8', errors='replace').read()
        except OSError as e:
            fatal(f'cannot read {path}: {e.strerror} '
                  '(no NVTX call made, or NVTX_INJECTION64_PATH not set?)')
        for line in text.splitlines():
            lines.add(line)
            f = line.split('\t')
            if f[0] in ('range', 'mark') and len(f) == 7:
                s = stats[(f[0], f[1], f[2])]
                for i in range(4):
                    s[i] += int(f[3 + i])
            elif f[0] == 'category' and len(f) == 4:
                cats[(f[1], f[2])] = f[3]
            elif f[0] == 'depth' and len(f) == 3:
                depth[f[1]] = max(depth.get(f[1], 0), int(f[2]))
            elif f[0] == 'unbalanced' and len(f) == 3:
                unbalanced[0] += int(f[1])
                unbalanced[1] += int(f[2])
            elif line:
                fatal(f'{path}: bad line: {line!r}')
    return stats, cats, depth, lines, unbalanced


def stats_table(path):
    """{(collective, route): calls} from streamcoll's statistics table in a log."""
    calls, inside = collections.Counter(), False
    try:
        lines = open(path, encoding='utf-8', errors='replace').read().splitlines()
    except OSError as e:
        fatal(f'cannot read {path}: {e.strerror}')
    for line in lines:
        f = line.split()
        if f[:3] == ['collective', 'route', 'memory']:
            inside = True
        elif inside and len(f) >= 4 and f[3].isdigit():
            calls[(f[0], f[1])] += int(f[3])
        elif inside:
            break
    if not inside:
        fatal(f'{path}: no statistics table')
    return calls


def against_stats(stats, path):
    fails, table = [], stats_table(path)
    per_coll = collections.Counter()
    for (coll, route), n in table.items():
        per_coll[coll] += n
        got = sum(s[0] for (k, d, m), s in stats.items()
                  if k == 'range' and d == 'streamcoll' and m.startswith(f'{coll} {route} '))
        if got != n:
            fails.append(f'{coll} on {route}: {got} ranges, the statistics count {n} calls')
    for coll, n in per_coll.items():
        name = 'MPI_' + coll[0].upper() + coll[1:]
        s = stats.get(('range', 'streamcoll', name))
        if (s[0] if s else 0) != n:
            fails.append(f'{name}: {s[0] if s else 0} ranges, the statistics count {n} calls')
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('reports', nargs='+')
    for opt, n in [('range', 3), ('range-min', 3), ('range-prefix', 3), ('mark', 3),
                   ('payload', 3), ('threads', 3), ('depth', 2), ('category', 3), ('mark-prefix', 3),
                   ('no-domain', None), ('expect', None)]:
        ap.add_argument('--' + opt, nargs=n, action='append', default=[])
    ap.add_argument('--balanced', action='store_true')
    ap.add_argument('--dump', action='store_true')
    ap.add_argument('--stats-log')
    a = ap.parse_args()
    stats, cats, depth, lines, unbalanced = load(a.reports)
    if a.dump:
        for (kind, d, m), s in sorted(stats.items()):
            print(kind, d, m, *s, sep='\t')
        for d, n in sorted(depth.items()):
            print('depth', d, n, sep='\t')
        print('unbalanced', *unbalanced, sep='\t')

    def get(kind, d, m):
        if kind is None:  # range, else mark
            return stats.get(('range', d, m)) or stats.get(('mark', d, m))
        return stats.get((kind, d, m))

    fails = []
    for d, m, n in a.range:
        s = get('range', d, m)
        if not s or s[0] != int(n) or s[1] != int(n):
            fails.append(f'range {d}/{m}: expected {n} pushes and pops, got '
                         + (f'{s[0]} pushes, {s[1]} pops' if s else 'none'))
    for d, m, n in a.range_min:
        s = get('range', d, m)
        if not s or s[0] < int(n):
            fails.append(f'range {d}/{m}: expected at least {n} pushes, got {s[0] if s else 0}')
    for d, p, n in a.range_prefix:
        got = sum(s[0] for (k, dd, m), s in stats.items()
                  if k == 'range' and dd == d and m.startswith(p))
        if got < int(n):
            fails.append(f'ranges {d}/{p}*: expected at least {n} pushes, got {got}')
    for d, p, n in a.mark_prefix:
        got = sum(s[0] for (k, dd, m), s in stats.items()
                  if k == 'mark' and dd == d and m.startswith(p))
        if got < int(n):
            fails.append(f'marks {d}/{p}*: expected at least {n}, got {got}')
    for d, m, n in a.mark:
        s = get('mark', d, m)
        if (s[0] if s else 0) != int(n):
            fails.append(f'mark {d}/{m}: expected {n}, got {s[0] if s else 0}')
    for d, m, n in a.payload:
        s = get(None, d, m)
        if not s or s[2] != int(n):
            fails.append(f'payload {d}/{m}: expected sum {n}, got {s[2] if s else "no such range"}')
    for d, m, n in a.threads:
        s = get(None, d, m)
        if not s or s[3] != int(n):
            fails.append(f'threads {d}/{m}: expected {n}, got {s[3] if s else "no such range"}')
    for d, n in a.depth:
        if depth.get(d, 0) != int(n):
            fails.append(f'depth {d}: expected {n}, got {depth.get(d, 0)}')
    for d, i, name in a.category:
        if cats.get((d, i)) != name:
            fails.append(f'category {d}/{i}: expected {name!r}, got {cats.get((d, i))!r}')
    for d in a.no_domain:
        found = [m for (k, dd, m) in stats if dd == d] + [i for (dd, i) in cats if dd == d]
        if found:
            fails.append(f'domain {d}: expected nothing, got {found[:5]}')
    for line in a.expect:
        if line.replace('\\t', '\t') not in lines:
            fails.append(f'line not in the report: {line!r}')
    if a.balanced:
        if unbalanced != [0, 0]:
            fails.append(f'unbalanced: {unbalanced[0]} pops without a push, '
                         f'{unbalanced[1]} ranges open at exit')
        for (k, d, m), s in sorted(stats.items()):
            if k == 'range' and s[0] != s[1]:
                fails.append(f'range {d}/{m}: {s[0]} pushes, {s[1]} pops')
    if a.stats_log:
        fails += against_stats(stats, a.stats_log)
    for f in fails:
        print('nvtx_inject_check: FAIL: ' + f)
    return 1 if fails else 0


if __name__ == '__main__':
    sys.exit(main())
