#!/usr/bin/env python3
"""Runs a build folder's tests from meson-info/intro-tests.json, without meson.

For a GPU node (../shared/gpu/README.md) where the build folder travelled from another
machine and the node's meson cannot read it: the JSON holds each test's command,
environment and timeout.
  scripts/run-tests-json.py BUILD_DIR SUITE [--timeout-cap S] [--log FILE] [NAME ...]
SUITE is a suite name (gpu, fake, ...); NAMEs, if given, pick tests by name instead.
Exit status: 0 when no test failed (skips, exit 77, are not failures), else 1.
"""
import argparse, json, os, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("suite")
ap.add_argument("names", nargs="*")
ap.add_argument("--timeout-cap", type=float, default=0)
ap.add_argument("--log")
a = ap.parse_intermixed_args()
tests = json.load(open(os.path.join(a.build, "meson-info", "intro-tests.json")))
if a.names:
    tests = [t for t in tests if t["name"] in a.names]
else:
    tests = [t for t in tests if any(s.split(":")[-1] == a.suite for s in t["suite"])]
log = open(a.log, "w") if a.log else sys.stdout
failed = 0
for t in tests:
    env = dict(os.environ)
    env.update(t["env"])
    timeout = t["timeout"] or 30
    if a.timeout_cap:
        timeout = min(timeout, a.timeout_cap)
    t0 = time.time()
    try:
        p = subprocess.run(t["cmd"], env=env, cwd=t["workdir"] or a.build, timeout=timeout,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rc, out = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out = "TIMEOUT", (e.stdout or b"").decode(errors="replace")
    dt = time.time() - t0
    verdict = "OK" if rc == 0 else "SKIP" if rc == 77 else "FAIL"
    failed += verdict == "FAIL"
    line = f"{verdict:5} {t['name']:40} rc={rc} {dt:6.1f}s"
    print(line, flush=True)
    if log is not sys.stdout:
        log.write(f"==== {line}\n$ {' '.join(t['cmd'])}\n{out}\n")
        log.flush()
print(f"{len(tests)} tests, {failed} failed", flush=True)
sys.exit(1 if failed else 0)
