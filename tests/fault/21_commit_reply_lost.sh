#!/usr/bin/env bash
# Row 21: a relay commits but its COMMIT_REPLY comes too late (issue 15,
# finding 9): b2 sits on COMMIT (relay.commit=wait@1) until the refit has
# given up on its reply at the phase deadline, then commits. The report must not call it
# "excluded, now stale": it voted yes and was sent COMMIT, so it is
# "commit unconfirmed" (exit 3, committed-partial); once it has committed,
# `dcr status` shows it at the target, not stale, its last refit result
# "committed (reply lost ...)"; the next refit takes it as any node at the
# base: committed everywhere, exit 0.
# Usage: 21_commit_reply_lost.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=21
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology 4
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b2 ]]; then fault_start b2 "relay.commit=wait($T/b2.go)@1"; else fault_start "$n"; fi
done
fault_snapshot
# A 3 s deadline for every phase (the healthy relays' plan, stream and
# vote on a loaded machine); b2's COMMIT_REPLY comes after the refit has
# returned (a relay that owes a decision reply is not judged silent
# meanwhile).
REFIT_TIMEOUT=3s fault_refit "$V/v1.safetensors"
touch "$T/b2.go"
FAULTS[late_commit_reply]=1
[[ $RC -eq 3 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "dcr refit exited $RC, want 3"; }
cp "$T/report.json" "$T/out"
node_json b2 "not n['committed'] and n['phase'] == 'commit' and n['detail'].startswith('commit unconfirmed')"
json "'b2' not in d['reason'].split('commit unconfirmed')[0]" \
  "'commit unconfirmed' in d['reason'] and 'b2' in d['reason']"
fault_wait_log b2 "committed step 1" 15
expect 0 "$DCR" status --topology "$TOPO" -o json --timeout 2s
node_json b2 "n['committed']['step'] == 1 and not n['stale'] and n['last_refit_result'].startswith('committed (reply lost')"
fault_wait_idle
fault_snapshot
fault_refit "$V/v2.safetensors"
fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
echo "row 21 (SEED=$SEED): ok"
