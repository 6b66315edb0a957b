#!/usr/bin/env bash
# Row 7: an XOR CHUNK frame replayed or duplicated. A proxy in front of the
# head a0 sends a0 the Kth CHUNK twice: back to back (odd SEED) or again
# just before END (even SEED), verbatim (valid checksum; it would verify
# under HMAC too). a0 forwards it to a1 and a2. Applying an XOR mask twice
# reverts the span, so each of a0, a1, a2 must drop the copy (applied-set
# per refit): the refit commits everywhere (0), every store is v1 bit for
# bit, and each of the three received the copy.
# Usage: 07_duplicate_xor.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=7
source "$(dirname "$0")/lib.sh"
fault_model
K=$(pick 1 "$((CHUNKS + 1))")
if ((SEED % 2 == 1)); then MODE=--dup-chunk EVENT=dup; else MODE=--dup-late EVENT=dup_late; fi
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == a0 ]]; then fault_start a0 "" --behind-proxy; else fault_start "$n"; fi
done
fault_proxy a0 "$MODE" "$K"
fault_snapshot
fault_refit "$V/v1.safetensors"
grep -q "\"event\": \"$EVENT\"" "$T/proxy-a0.log" || fail "the proxy did not duplicate chunk $K"
FAULTS[duplicate_xor]=3  # a0, and through it a1 and a2
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded "" --injected-frames 3
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
# Each of a0, a1, a2 received the copy (one CHUNK frame more than the
# refit's chunks) and did not apply it (v1 bit for bit, above).
python3 - "$T" <<'PY' || fail "the duplicate did not reach a0, a1 and a2"
import json, re, sys, urllib.request
t = sys.argv[1]
pre = json.load(open(f"{t}/pre.json"))["nodes"]
chunks = json.load(open(f"{t}/report.json"))["chunks"]
for n in ("a0", "a1", "a2"):
    port = json.load(open(f"{t}/{n}.ready"))["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
    got = float(re.search(r'^dcr_relay_chunks_received_total\{[^}]*\} (\S+)$', text, re.M).group(1))
    was = pre[n]["metrics"].get("dcr_relay_chunks_received_total", 0)
    assert got - was == chunks + 1, f"{n}: received {got - was} chunks, want {chunks + 1}"
PY
echo "row 7 (SEED=$SEED, chunk $K of $CHUNKS duplicated ${MODE#--}): ok"
