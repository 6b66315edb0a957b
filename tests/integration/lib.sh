# Helpers shared by the integration tests. Source it after setting T (the
# test's temp dir): commands' stdout goes to $T/out, stderr to $T/err.
# shellcheck shell=bash

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect CODE CMD...: runs CMD and checks its exit code.
expect() {
  local want=$1
  shift
  set +e
  "$@" >"$T/out" 2>"$T/err"
  local got=$?
  set -e
  [[ $got -eq $want ]] || {
    cat "$T/out" "$T/err" >&2
    fail "exit $got, want $want: $*"
  }
}

# expect_err TEXT: the last command's error is one line and contains TEXT.
expect_err() {
  [[ $(wc -l <"$T/err") -eq 1 ]] || { cat "$T/err" >&2; fail "error is not one line"; }
  grep -qF -- "$1" "$T/err" || { cat "$T/err" >&2; fail "error lacks '$1'"; }
}
