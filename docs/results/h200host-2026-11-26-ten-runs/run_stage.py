#!/usr/bin/env python3
# Runs one build's meson tests (from `meson introspect --tests` JSON) the way `meson test` does: each test's env,
# timeout, exit 77 = skip, cwd the build root. Usage: run_stage.py tests.json BUILD_ROOT RUNS LOG_PREFIX.
import json, os, subprocess, sys, time
tests = json.load(open(sys.argv[1]))
root = sys.argv[2]; runs = int(sys.argv[3]); prefix = sys.argv[4]
all_ok = True
for run in range(1, runs + 1):
    start = time.time(); passed = failed = skipped = 0; failures = []
    for t in tests:
        env = dict(os.environ); env.update(t['env'])
        try:
            p = subprocess.run(t['cmd'], env=env, cwd=t['workdir'] or root,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=t['timeout'])
            rc = p.returncode; out = p.stdout
        except subprocess.TimeoutExpired as e:
            rc = 'timeout'; out = e.stdout or b''
        should_fail = t.get('should_fail') or False
        if rc == 77: skipped += 1; continue
        ok = (rc == 0) != should_fail if rc != 'timeout' else False
        if ok: passed += 1
        else:
            failed += 1; failures.append(t['name'])
            lines = out.decode(errors='replace').splitlines()
            keep = [l for l in lines if 'FAIL' in l or 'Sanitizer' in l or 'ERROR' in l][:8] + lines[-4:]
            with open(f'{prefix}-failures.log', 'a') as f:
                f.write(f'=== run {run} {t["name"]} rc {rc}\n' + '\n'.join(keep) + '\n')
    all_ok = all_ok and failed == 0
    print(f'{prefix} run {run}: {passed} passed, {failed} failed, {skipped} skipped, {time.time()-start:.0f} s'
          + (' FAILED: ' + ' '.join(failures) if failures else ''), flush=True)
sys.exit(0 if all_ok else 1)
