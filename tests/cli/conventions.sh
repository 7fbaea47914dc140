#!/usr/bin/env bash
# Every railnet CLI keeps the same conventions (issue 16): --help prints the usage on stdout and exits 0; --version
# prints "<tool> <version> (revision <git revision>)" and exits 0; an unknown flag prints a reason on stderr,
# nothing on stdout, and exits 2.
#   tests/cli/conventions.sh TOOL...        (meson passes the built executables)
set -u
failures=0
check() {  # what, condition
  if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}
for tool in "$@"; do
  name=$(basename "$tool")
  out=$("$tool" --help 2>/dev/null); status=$?
  check "$name --help exits 0" "[ $status -eq 0 ]"
  check "$name --help prints the usage on stdout" "grep -q 'usage' <<<\"\$out\""
  out=$("$tool" --version 2>/dev/null); status=$?
  check "$name --version exits 0" "[ $status -eq 0 ]"
  check "$name --version names the tool, version and revision" "grep -Eq '^$name [0-9]+\.[0-9]+\.[0-9]+ \(revision [^)]+\)$' <<<\"\$out\""
  out=$("$tool" --no-such-flag 2>/tmp/cli-conventions-err.$$); status=$?
  err=$(cat /tmp/cli-conventions-err.$$); rm -f /tmp/cli-conventions-err.$$
  check "$name with an unknown flag exits 2" "[ $status -eq 2 ]"
  check "$name with an unknown flag says why on stderr" "[ -n \"\$err\" ]"
  check "$name with an unknown flag prints nothing on stdout" "[ -z \"\$out\" ]"
done
echo "$failures failed"
[ "$failures" -eq 0 ]
