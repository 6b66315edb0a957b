#!/usr/bin/env bash
# Row 17: a full disk while writing the version record. One leaf (picked
# by SEED) keeps its store, version record and epoch file on a small tmpfs
# that the row fills to the last page (a real ENOSPC, no failpoint):
#  (a) full before the refit: the leaf cannot persist the PLAN (its epoch
#      file); it answers store error, is excluded, and its bits and record
#      stay as they were; the others commit v1 (committed-partial).
#  (b) space freed: the next refit v1 -> v2 catches the leaf up from the
#      history by itself: committed everywhere.
#  (c) full while the leaf sits on COMMIT (relay.commit=wait): writing the
#      commit's record fails; the leaf answers store error saying the disk
#      is full and naming the record, is excluded, keeps running, and its
#      record is the whole previous one (refit v2 -> v3 unfinished: it
#      refuses deltas), no temporary file left; the others commit v3.
#  (d) space freed: the next refit v3 -> v4 repairs the leaf (method
#      repair) and commits everywhere: no operator step.
# Needs root for a private mount namespace and a tmpfs (CI runs as root);
# exits 77 (skipped, ctest SKIP_RETURN_CODE) where that is not permitted.
# Usage: 17_disk_full.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=17
if [[ -z ${DCR_FAULT_MOUNT_NS:-} ]]; then
  # Rerun in a mount namespace of its own: the tmpfs is invisible outside
  # and goes away with the row's processes whatever happens.
  if [[ $(id -u) -ne 0 ]] || ! unshare --mount --propagation private sh -c \
    'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d" && umount "$d"; r=$?; rmdir "$d"; exit $r' 2>/dev/null; then
    echo "row 17: SKIP: needs root to mount a tmpfs in a private mount namespace (unshare -m)" >&2
    exit 77
  fi
  DCR_FAULT_MOUNT_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
fault_model 4
LEAVES=(a1 a2 b1 b2)
VIC=${LEAVES[$(pick 0 4)]}
MC=$(pick 3 6 1)
FULL=$T/full
mkdir "$FULL"
mount -t tmpfs -o size=4m tmpfs "$FULL"
fault_topology "$MC"
expect 0 "$DCR" topo set "$TOPO" "nodes.$VIC.store.path=$FULL/$VIC.safetensors"
others=()
for n in "${RELAYS[@]}"; do [[ $n == "$VIC" ]] || others+=("$n"); done
fault_seed "$V/v0.safetensors" "${others[@]}" base
cp "$V/v0.safetensors" "$FULL/$VIC.safetensors"
# The checker reads every store as $T/NAME.safetensors (and its record).
ln -s "$FULL/$VIC.safetensors" "$T/$VIC.safetensors"
ln -s "$FULL/$VIC.safetensors.dcr-version" "$T/$VIC.safetensors.dcr-version"
REC=$FULL/$VIC.safetensors.dcr-version

fill() {  # fill: zeros into the tmpfs until not one more byte fits
  dd if=/dev/zero of="$FULL/filler" bs=64k status=none 2>/dev/null || true
  if { printf x >>"$FULL/filler"; } 2>/dev/null; then fail "the tmpfs is not full"; fi
  FAULTS[disk_full]=$((${FAULTS[disk_full]:-0} + 1))
}
no_tmp() {  # no_tmp: no temporary file left beside the leaf's store
  local left
  left=$(find "$FULL" -name '*.tmp')
  [[ -z $left ]] || fail "temporary files left behind: $left"
}
full_node() {  # full_node CKPT: dcr refit --full --node VIC at CKPT, exit 0
  fault_refit "$1" --full --node "$VIC"
  [[ $RC -eq 0 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "--full --node $VIC exited $RC"; }
  expect 0 "$DCR" verify "$T/$VIC.safetensors" "$1"
  synced
}
synced() {  # synced: the leaf's background write-back dropped its record's mark
  local i
  for ((i = 0; i < 200; i++)); do
    grep -qF '"unsynced"' "$REC" || return 0
    sleep 0.05
  done
  fail "$VIC's record is still marked unsynced after 10 s: $(cat "$REC")"
}

# The leaf writes back at once (not after --write-back-delay's 30 s):
# `synced` waits for it.
for n in "${RELAYS[@]}"; do [[ $n == "$VIC" ]] || fault_start "$n"; done
fault_start "$VIC" "" --write-back-delay 0
FAULT_SEEDING=1 full_node "$V/v0.safetensors"  # seeds it: a record, committed v0
cp "$REC" "$T/record-a"

# (a) Full before the refit.
fill
fault_snapshot
fault_refit "$V/v1.safetensors"
DCR_FAULT_OUT="" fault_check "$V/v1.safetensors" --expect-outcome committed-partial --excluded "$VIC"
node_json "$VIC" 'n["code"] == "store error" and "No space left on device" in n["detail"]'
cmp -s "$T/record-a" "$REC" || fail "$VIC's record changed on a full disk"
no_tmp

# (b) Space freed: the next refit catches the leaf up by itself.
rm "$FULL/filler"
fault_snapshot
fault_refit "$V/v2.safetensors"
DCR_FAULT_OUT="" fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
synced

# (c) Full while the leaf sits on COMMIT: the commit's record write fails.
kill -TERM "${PID[$VIC]}"
fault_wait_exit "$VIC" 0
fault_start "$VIC" "relay.commit=wait($T/c.go)@1" --write-back-delay 0
fault_snapshot
fault_refit_bg "$V/v3.safetensors"
fault_wait_log "$VIC" "failpoint relay.commit (hit 1): wait"
cp "$REC" "$T/record-c"  # BeginRefit's: refit v2 -> v3 in progress
fill
touch "$T/c.go"  # the disk is full: let the leaf commit
FAULT_T0=$(date +%s.%N)
fault_refit_wait
CRASHED+=("$VIC")  # its record says the refit is unfinished, as it must
fault_check "$V/v3.safetensors" --expect-outcome committed-partial --excluded "$VIC"
node_json "$VIC" 'n["code"] == "store error" and "cannot write version record '"'$REC'"': the disk is full" in n["detail"]'
grep -qF "commit failed" "$T/$VIC.log" || { cat "$T/$VIC.log" >&2; fail "$VIC did not log the failed commit"; }
cmp -s "$T/record-c" "$REC" || fail "$VIC's record is not the previous one, whole"
python3 -S - "$REC" <<'PY' || fail "$VIC's record does not say refit v2 -> v3 is unfinished"
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if r["committed"]["step"] == 2 and r["in_progress"]["target"]["step"] == 3 else 1)
PY
no_tmp
kill -0 "${PID[$VIC]}" || fail "$VIC died"

# (d) Space freed: the next refit repairs the leaf and commits everywhere.
rm "$FULL/filler"
CRASHED=()
fault_snapshot
fault_refit "$V/v4.safetensors"
DCR_FAULT_OUT="" fault_check "$V/v4.safetensors" --expect-outcome committed --excluded ""
python3 -S -c "import json; r = json.load(open('$T/report.json')); assert [c['method'] for c in r['catch_up']] == ['repair'], r['catch_up']" ||
  fail "the leaf should be repaired from the history: $(cat "$T/report.json")"
no_tmp

for n in "${!PID[@]}"; do stop_relay "$n"; done
umount "$FULL"
echo "row 17 (SEED=$SEED, victim $VIC, min_commit $MC): ok"
