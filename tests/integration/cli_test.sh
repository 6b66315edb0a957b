#!/usr/bin/env bash
# The offline CLI as a user runs it: round trip, exit codes, and every bad
# input refused with a one-line error and the target's bits unchanged.
# Usage: cli_test.sh DCR_BINARY TRAINGEN_BINARY [DCR_RELAY_BINARY]
set -euo pipefail
DCR=$1
TRAINGEN=$2
RELAY=${3:-}
T=$(mktemp -d /tmp/dcr-cli-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"


"$TRAINGEN" --out "$T/ck" --hidden 64 --layers 2 --vocab 512 --steps 2 \
  --lr 5e-6 >/dev/null 2>&1
V0=$T/ck/v0.safetensors V1=$T/ck/v1.safetensors V2=$T/ck/v2.safetensors

# Help and usage.
expect 0 "$DCR" --help
grep -q "Exit codes" "$T/out" || fail "--help lacks the exit codes"
expect 0 "$DCR" diff --help
grep -q "Example" "$T/out" || fail "diff --help lacks an example"
expect 2 "$DCR"
expect 2 "$DCR" diff "$V0"
expect 2 "$DCR" inspect "$T/missing.safetensors"
expect_err "missing.safetensors"

# Round trip v0 -> v1 -> v2 on a copy, verified bit for bit.
cp "$V0" "$T/node.safetensors"
expect 0 "$DCR" diff "$V0" "$V1" -o "$T/v1.dcr" --format json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["chunks"]>0 and 0<d["change_rate"]<1, d' "$T/out"
expect 0 "$DCR" diff "$V1" "$V2" -o "$T/v2.dcr"
expect 0 "$DCR" apply "$T/v1.dcr" "$T/node.safetensors"
expect 0 "$DCR" verify "$T/node.safetensors" "$V1"
expect 0 "$DCR" apply "$T/v2.dcr" "$T/node.safetensors" -o json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["to"]["step"]==2, d' "$T/out"
expect 0 "$DCR" verify "$T/node.safetensors" "$V2"

# inspect: both kinds, text and JSON.
expect 0 "$DCR" inspect "$T/v1.dcr" -o json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["type"]=="delta" and d["base"]["step"]==0 and d["target"]["step"]==1, d' "$T/out"
expect 0 "$DCR" inspect "$V1" --tensors -o json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["type"]=="checkpoint" and d["step"]==1 and len(d["tensor_list"])==d["tensors"], d' "$T/out"
expect 0 "$DCR" inspect "$T/v1.dcr"
grep -q "changed" "$T/out" || fail "inspect text lacks the change rate"

# verify names the differing tensor and its first element; exit 1.
expect 1 "$DCR" verify "$V0" "$V1"
grep -q "first at element" "$T/out" || fail "verify does not name the element"
expect 1 "$DCR" verify "$V0" "$V1" -o json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["identical"] and d["differences"], d' "$T/out"

# Every bad input: error, exit code, and the target untouched.
cp "$V0" "$T/t.safetensors"
cp "$V0" "$T/orig.safetensors"
unchanged() { cmp -s "$T/t.safetensors" "$T/orig.safetensors" || fail "target changed: $1"; }

expect 5 "$DCR" apply "$T/v2.dcr" "$T/t.safetensors"   # delta for another base
expect_err "applies to base step 1"
unchanged "wrong base"

size=$(stat -c %s "$T/v1.dcr")
head -c $((size / 2)) "$T/v1.dcr" >"$T/trunc.dcr"
expect 4 "$DCR" apply "$T/trunc.dcr" "$T/t.safetensors"
expect_err "trunc"
unchanged "truncated delta"

cp "$T/v1.dcr" "$T/flip.dcr"
printf '\x5a' | dd of="$T/flip.dcr" bs=1 seek=$((size - 100)) conv=notrunc status=none
expect 4 "$DCR" apply "$T/flip.dcr" "$T/t.safetensors"
expect_err "checksum"
unchanged "bit-flipped delta"

printf 'not a delta at all, just text' >"$T/junk.dcr"
expect 4 "$DCR" apply "$T/junk.dcr" "$T/t.safetensors"
unchanged "junk delta"

# Applying twice: the second is refused (XOR would silently revert).
expect 0 "$DCR" apply "$T/v1.dcr" "$T/t.safetensors"
cp "$T/t.safetensors" "$T/orig.safetensors"
expect 5 "$DCR" apply "$T/v1.dcr" "$T/t.safetensors"
expect_err "applied already"
unchanged "applied twice"

# A checkpoint with other tensors (manifest mismatch).
"$TRAINGEN" --out "$T/other" --hidden 64 --layers 1 --vocab 512 --steps 0 \
  >/dev/null 2>&1
cp "$T/other/v0.safetensors" "$T/t2.safetensors"
expect 5 "$DCR" apply "$T/v1.dcr" "$T/t2.safetensors"
expect_err "other tensors"
cmp -s "$T/t2.safetensors" "$T/other/v0.safetensors" || fail "manifest mismatch changed the target"
expect 2 "$DCR" diff "$V0" "$T/other/v0.safetensors" -o "$T/x.dcr"
expect_err "different tensors"
[[ ! -e $T/x.dcr && ! -e $T/x.dcr.tmp ]] || fail "failed diff left a file behind"

# A malformed safetensors header: names the file.
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2' >"$T/bad.safetensors"
expect 4 "$DCR" inspect "$T/bad.safetensors"
expect_err "bad.safetensors"
expect 4 "$DCR" apply "$T/v1.dcr" "$T/bad.safetensors"

# A FIFO (or any other non-regular file) where a file is read is refused at
# once, exit 2, naming the path and what it is; opening a FIFO for reading
# would block until a writer comes. `timeout` turns a hang into a failure.
mkfifo "$T/fifo"
fifo_refused() {
  expect 2 timeout 10 "$@"
  expect_err "$T/fifo' is a FIFO, not a regular file"
}
fifo_refused "$DCR" inspect "$T/fifo"
fifo_refused "$DCR" diff "$T/fifo" "$V1" -o "$T/x.dcr"
fifo_refused "$DCR" diff "$V0" "$T/fifo" -o "$T/x.dcr"
fifo_refused "$DCR" apply "$T/fifo" "$T/t.safetensors"
fifo_refused "$DCR" apply "$T/v1.dcr" "$T/fifo"
fifo_refused "$DCR" verify "$T/fifo" "$V0"
fifo_refused "$DCR" verify "$V0" "$T/fifo"
fifo_refused "$DCR" topo validate "$T/fifo"
fifo_refused "$DCR" status --topology "$T/fifo"
{
  echo "version: 1"
  echo "root: {name: trainer, host: 127.0.0.1, port: 1, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
  echo "clusters:"
  echo "  - {name: train, region: local}"
  echo "  - name: rollout"
  echo "    region: local"
  echo "    nodes: [{name: a0, host: 127.0.0.1, port: 2, store: {kind: file, path: \"$T/fifo\"}}]"
  echo "links: [{from: train, to: rollout, bandwidth: 1Gbps}]"
} >"$T/topo.yaml"
cp "$V0" "$T/base.safetensors"
fifo_refused "$DCR" refit --topology "$T/topo.yaml" --target "$T/fifo"
if [[ -n $RELAY ]]; then
  fifo_refused "$RELAY" --name a0 --listen 127.0.0.1:0 --store "file:$T/fifo"
  fifo_refused "$RELAY" --topology "$T/fifo" --node a0
  fifo_refused "$RELAY" --topology "$T/topo.yaml" --node a0
fi

# An unwritable target (root ignores permissions: run as nobody).
if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null; then
  chmod 755 "$T"
  cp "$V0" "$T/ro.safetensors"
  chmod 444 "$T/ro.safetensors" "$T/v1.dcr"
  expect 1 setpriv --reuid=65534 --regid=65534 --clear-groups \
    "$DCR" apply "$T/v1.dcr" "$T/ro.safetensors"
  expect_err "for writing"
  cmp -s "$T/ro.safetensors" "$V0" || fail "unwritable target changed"
elif [[ $(id -u) -ne 0 ]]; then
  cp "$V0" "$T/ro.safetensors"
  chmod 444 "$T/ro.safetensors"
  expect 1 "$DCR" apply "$T/v1.dcr" "$T/ro.safetensors"
  expect_err "for writing"
else
  fail "running as root without setpriv: cannot test an unwritable target"
fi

echo "cli_test: all checks passed"
