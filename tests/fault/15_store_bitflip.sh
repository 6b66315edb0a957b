#!/usr/bin/env bash
# Row 15: a store bit flipped after apply, before the vote. The leaf b1
# is held when its Nth chunk arrives (relay.apply_chunk=wait@N; chunks
# 1..N-1 are applied by then) until the test has flipped one bit of b1's store
# file (a mapped file store: the relay sees it) at an offset picked by
# SEED; then it goes on. b1's digest check must catch it: it votes digest mismatch naming
# the tensor, the root's repair round overwrites that tensor, and b1
# commits the target's bits (0) whatever min_commit.
# Usage: 15_store_bitflip.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=15
source "$(dirname "$0")/lib.sh"
fault_model
N=$(pick 2 "$((CHUNKS + 1))")
if ((SEED % 2 == 0)); then MC=all; else MC=5; fi
fault_topology "$MC"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b1 ]]; then fault_start b1 "relay.apply_chunk=wait($T/b1.go)@$N"; else fault_start "$n"; fi
done
# A data byte of the safetensors file in the tensor last in manifest (name)
# order, and the base with that bit flipped: what b1 must hold afterwards.
# The first vote takes the digests a relay hashed ahead of the stream, of
# the tensors below the one an Apply reached (src/session/refit_session.h,
# "Hashing ahead"), and a change by something else after that is seen by
# the next vote only; the last tensor is never hashed ahead, so this first
# vote hashes it after the flip, wherever chunk N falls.
OFF=$(python3 -S - "$T/b1.safetensors" "$SEED" <<'PY'
import json, random, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
last = max(k for k in header if k != "__metadata__")
begin, end = header[last]["data_offsets"]
print(8 + n + random.Random(int(sys.argv[2])).randrange(begin, end))
PY
)
BIT=$(pick 0 8 2)
flip() {  # flip FILE: XOR bit BIT of byte OFF, in place
  python3 -S - "$1" "$OFF" "$BIT" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
off, bit = int(sys.argv[2]), int(sys.argv[3])
b = os.pread(fd, 1, off)[0] ^ (1 << bit)
os.pwrite(fd, bytes([b]), off)
os.close(fd)
PY
}
cp "$V/v0.safetensors" "$T/v0-flipped.safetensors"
flip "$T/v0-flipped.safetensors"
fault_snapshot
fault_refit_bg "$V/v1.safetensors"
fault_wait_log b1 "failpoint relay.apply_chunk (hit $N): wait"
flip "$T/b1.safetensors"
touch "$T/b1.go"
FAULTS[store_bitflip]=1
fault_refit_wait
# b1 votes no naming the tensor with the flipped bit; the repair round
# overwrites that tensor and b1 commits the target's bits.
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded "" \
  --corrupt-victims b1
cp "$T/report.json" "$T/out"
json 'd["repair_rounds"] >= 1'
node_json b1 'n["committed"]'
grep -q "vote no (store digest" "$T/b1.log" || { cat "$T/b1.log" >&2; fail "b1 did not vote no"; }
echo "row 15 (SEED=$SEED, bit $BIT of byte $OFF flipped at chunk $N, min_commit $MC): ok"
