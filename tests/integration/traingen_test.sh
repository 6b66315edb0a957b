#!/usr/bin/env bash
# Integration test of dcr-traingen: a tiny model writes v0..v2, the JSON
# report parses and shows a partial change per step, and the output is a
# function of the seed only (same bytes again, and with another --threads).
# Usage: traingen_test.sh PATH/TO/dcr-traingen
set -euo pipefail

bin="${1:?usage: traingen_test.sh PATH/TO/dcr-traingen}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

tiny=(--hidden 64 --layers 2 --vocab 256 --steps 2)
fail() { echo "traingen_test: FAIL: $*" >&2; exit 1; }

if ! "$bin" "${tiny[@]}" --seed 7 --threads 2 --out "$tmp/a" -o json \
    >"$tmp/a.json" 2>"$tmp/a.log"; then
  cat "$tmp/a.log" >&2
  fail "first run failed"
fi
for k in 0 1 2; do
  [[ -s "$tmp/a/v$k.safetensors" ]] || fail "v$k.safetensors missing or empty"
done
[[ ! -e "$tmp/a/v3.safetensors" ]] || fail "wrote more than --steps checkpoints"

python3 - "$tmp/a.json" <<'PY' || fail "bad JSON report"
import json, sys
with open(sys.argv[1]) as f:
    report = json.load(f)
assert report["params"] > 0, report
assert report["checkpoint_bytes"] > 2 * report["params"], report
steps = report["steps"]
assert [s["step"] for s in steps] == [1, 2], steps
for s in steps:
    assert 0 < s["change_rate"] < 1, s
    assert s["changed"] > 0, s
    assert s["floor_bytes"] > 0, s
    assert abs(s["floor_bytes"] - s["position_bytes"] - s["value_bytes"]) < 1e-6 * s["floor_bytes"], s
PY

"$bin" "${tiny[@]}" --seed 7 --threads 2 --out "$tmp/b" >/dev/null 2>&1 || fail "second run"
"$bin" "${tiny[@]}" --seed 7 --threads 1 --out "$tmp/c" >/dev/null 2>&1 || fail "--threads 1 run"
"$bin" "${tiny[@]}" --seed 7 --threads 3 --out "$tmp/d" >/dev/null 2>&1 || fail "--threads 3 run"
for k in 0 1 2; do
  for other in b c d; do
    cmp -s "$tmp/a/v$k.safetensors" "$tmp/$other/v$k.safetensors" \
      || fail "v$k differs between run a and run $other"
  done
done
cmp -s "$tmp/a/v0.safetensors" "$tmp/a/v1.safetensors" && fail "v0 equals v1"

# Tensors of several seeding blocks (embeddings of 2048 x 64 elements) are
# also independent of --threads.
multi=(--hidden 64 --layers 1 --vocab 2048 --steps 1)
"$bin" "${multi[@]}" --threads 1 --out "$tmp/m1" >/dev/null 2>&1 || fail "multi-block run 1"
"$bin" "${multi[@]}" --threads 4 --out "$tmp/m4" >/dev/null 2>&1 || fail "multi-block run 4"
cmp -s "$tmp/m1/v1.safetensors" "$tmp/m4/v1.safetensors" \
  || fail "multi-block v1 differs between --threads 1 and 4"

# Another seed gives other bits.
"$bin" "${tiny[@]}" --seed 8 --out "$tmp/e" >/dev/null 2>&1 || fail "--seed 8 run"
cmp -s "$tmp/a/v0.safetensors" "$tmp/e/v0.safetensors" && fail "--seed has no effect"

# Bad options exit 2 with a message on stderr.
set +e
"$bin" --out "$tmp/f" --heads 7 >/dev/null 2>"$tmp/f.log"; rc=$?
set -e
[[ $rc -eq 2 && -s "$tmp/f.log" ]] || fail "bad --heads: exit $rc, expected 2"

echo "traingen_test: OK"
