#!/usr/bin/env bash
# Row 12: a peer with the hop key (HMAC) but not the root's signing key
# injects chunks. The topology authenticates every frame (auth_key_file)
# and the root signs its refit manifest (signing_key_file; relays hold the
# public key). The head a0 holds the hop key and forges the Kth CHUNK on
# its way to a1 and a2 (relay.forward=forge@K: a value changed, the chunk
# re-encoded with valid checksums and a valid hop tag). a1 and a2 apply it,
# then find at vote time that it is not in the manifest the root signed:
# they vote rejected, are excluded and restore their base; the rest commit
# (min_commit 4: committed-partial, exit 3). SEED picks K.
# Usage: 12_forged_chunk.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=12
source "$(dirname "$0")/lib.sh"
fault_model
K=$(pick 1 "$((CHUNKS + 1))")
head -c 32 /dev/urandom >"$T/hop.key"
chmod 600 "$T/hop.key"
expect 0 "$DCR" keygen --private "$T/root.key" --public "$T/root.pub"
fault_topology 4 "auth_key_file: \"$T/hop.key\", signing_public_key_file: \"$T/root.pub\""
sed -i "s|baseline: \"$T/base.safetensors\"}|baseline: \"$T/base.safetensors\", signing_key_file: \"$T/root.key\"}|" "$TOPO"
grep -q signing_key_file "$TOPO" || fail "no signing key in the topology"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == a0 ]]; then fault_start a0 "relay.forward=forge@$K"; else fault_start "$n"; fi
done
fault_snapshot
fault_refit "$V/v1.safetensors"
fault_wait_log a0 "failpoint relay.forward (hit $K): forge"
FAULTS[forged_chunk]=1
fault_check "$V/v1.safetensors" --expect-outcome committed-partial --excluded "a1 a2" \
  --corrupt-victims "a1 a2"
cp "$T/report.json" "$T/out"
for c in a1 a2; do
  node_json "$c" 'not n["committed"] and n["code"] == "rejected" and "signed manifest" in n["detail"]'
done
echo "row 12 (SEED=$SEED, a0 forges chunk $K): ok"
