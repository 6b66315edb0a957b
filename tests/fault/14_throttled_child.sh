#!/usr/bin/env bash
# Row 14: one child throttled to a crawl. The leaf b2 takes D ms per chunk
# (relay.apply_chunk=delay(D) on every chunk: CHUNKS x D in all).
#   even SEED: the phase timeout covers the crawl: the refit commits
#     everywhere (0), b2 included, and its sibling b1 is not held back (it
#     votes before b2 has applied half its chunks).
#   odd SEED: the timeout is shorter than the crawl: b2 is reported timeout
#     and excluded, min_commit 5 -> committed-partial (3); b2, cut off by
#     its parent, restores its base.
# Usage: 14_throttled_child.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=14
source "$(dirname "$0")/lib.sh"
fault_model
D=$(pick 60 100)
fault_topology 5
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
CRAWL_MS=$((CHUNKS * D))
if ((SEED % 2 == 0)); then
  REFIT_TIMEOUT=$((CRAWL_MS * 3 + 5000))ms
  want=committed excl=""
else
  # A 3 s deadline for every phase (the other relays' plan, stream and
  # vote on a loaded machine), the crawl at least 3 times as long.
  REFIT_TIMEOUT=3000ms
  if ((CRAWL_MS < 9000)); then
    D=$((9000 / CHUNKS + 1))
    CRAWL_MS=$((CHUNKS * D))
  fi
  want=committed-partial excl=b2
fi
for n in "${RELAYS[@]}"; do
  if [[ $n == b2 ]]; then fault_start b2 "relay.apply_chunk=delay($D)"; else fault_start "$n"; fi
done
fault_snapshot
FAULTS[throttle]=1
fault_refit "$V/v1.safetensors"
fault_check "$V/v1.safetensors" --expect-outcome "$want" --excluded "$excl"
cp "$T/report.json" "$T/out"
if [[ $want == committed ]]; then
  node_json b2 'n["committed"] and n["chunks_applied"] == d["chunks"]'
else
  node_json b2 'not n["committed"] and n["code"] == "timeout"'
fi
echo "row 14 (SEED=$SEED, b2 at $D ms/chunk x $CHUNKS, timeout $REFIT_TIMEOUT): ok"
