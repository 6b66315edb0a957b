#!/usr/bin/env bash
# Row 20: the root dies while root.baseline takes the target's bits, which
# it does as the refit streams (issue 22), behind the delta history that is
# its undo log. No manual step may be needed, and the baseline ends exactly
# at the base (no decision) or the target (decision), checked by digest:
#   a. killed in the overlapped update (coord.baseline_write=exit@N, before
#      any decision; the baseline holds a mix, flagged unfinished): a plain
#      refit is refused (exit 2, names --resume); `dcr refit --resume`
#      aborts it: every store and the baseline back at v0 (bits and record);
#   b. killed after the decision, before COMMIT (coord.before_commit=exit;
#      the baseline holds v1's bits, flagged): the next plain `dcr refit
#      --target v2` finishes v1 first, then refits to v2: exit 0, every store
#      and the baseline at v2;
#   c. an abort after the baseline took the target's bits (the leaf b2
#      applies a damaged chunk, relay.apply_chunk=corrupt@N, and votes no;
#      min_commit all, no repair rounds): the refit restores the baseline
#      itself: exit 1, every store and the baseline at v2.
# Usage: 20_root_kill_baseline.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=20
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all

# --- a. killed during the overlapped update, then --resume --------------------
fault_snapshot
n=$(pick 1 $((CHUNKS / 2)) 1)
COORD_FAILPOINTS="coord.baseline_write=exit@$n" fault_refit "$V/v1.safetensors"
[[ $RC -eq 86 ]] || { cat "$T/refit.err" >&2; fail "dcr refit exited $RC, want 86 (the failpoint)"; }
grep -qF "failpoint coord.baseline_write (hit $n): exiting" "$T/refit.err" || fail "not stopped in the baseline update"
FAULTS[root_kill_baseline]=$((${FAULTS[root_kill_baseline]:-0} + 1))
[[ $(baseline_state) == "0 unfinished" ]] ||
  fail "root.baseline after the kill: $(baseline_state), want step 0 flagged unfinished"
ls "$T"/root/history/*.dcr.tmp >/dev/null 2>&1 || fail "no undo log (history temporary file) after the kill"
fault_refit "$V/v1.safetensors"
[[ $RC -eq 2 ]] && grep -q "dcr refit --resume" "$T/refit.err" ||
  { cat "$T/refit.err" >&2; fail "a refit before --resume exited $RC, want 2 naming --resume"; }
fault_refit "" --resume
[[ $RC -eq 1 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "--resume exited $RC, want 1 (aborted)"; }
grep -qF "root.baseline restored to step 0" "$T/refit.err" || { cat "$T/refit.err" >&2; fail "--resume does not say it restored the baseline"; }
fault_check "$V/v1.safetensors" --expect-outcome aborted
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v0.safetensors"
[[ $(baseline_state) == "0 clean" ]] || fail "root.baseline after --resume: $(baseline_state)"
[[ ! -e $T/root/current.json ]] || fail "current.json left after --resume"
if ls "$T"/root/history/*.dcr.tmp >/dev/null 2>&1; then fail "undo log left after the restore"; fi

# --- b. killed after the decision: the next refit finishes it first -------------
fault_snapshot
COORD_FAILPOINTS="coord.before_commit=exit" fault_refit "$V/v1.safetensors"
[[ $RC -eq 86 ]] || { cat "$T/refit.err" >&2; fail "dcr refit exited $RC, want 86 (the failpoint)"; }
FAULTS[root_kill_baseline]=$((${FAULTS[root_kill_baseline]:-0} + 1))
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
[[ $(baseline_state) == "0 unfinished" ]] || fail "root.baseline after the stop: $(baseline_state), want step 0 flagged"
fault_refit "$V/v2.safetensors"
[[ $RC -eq 0 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "the next refit exited $RC, want 0"; }
grep -qF "finished the interrupted refit" "$T/refit.err" || { cat "$T/refit.err" >&2; fail "the refit does not say it finished the interrupted one"; }
cp "$T/report.json" "$T/out"
json "d['base']['step'] == 1" "d['target']['step'] == 2"
fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v2.safetensors"
[[ $(baseline_state) == "2 clean" ]] || fail "root.baseline after the next refit: $(baseline_state)"

# --- c. an abort after the baseline took the target's bits -----------------------
kill -TERM "${PID[b2]}"
wait "${PID[b2]}" 2>/dev/null || true
fault_start b2 "relay.apply_chunk=corrupt@$(pick 1 $((CHUNKS / 2)) 3)"
fault_snapshot
fault_refit "$V/v3.safetensors" --repair-rounds 0
[[ $RC -eq 1 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "the refit exited $RC, want 1 (aborted)"; }
grep -qF "root.baseline restored to step 2" "$T/refit.err" || { cat "$T/refit.err" >&2; fail "the abort does not say it restored the baseline"; }
FAULTS[abort_after_baseline]=1
fault_check "$V/v3.safetensors" --expect-outcome aborted
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v2.safetensors"
[[ $(baseline_state) == "2 clean" ]] || fail "root.baseline after the abort: $(baseline_state)"
ls "$T"/root/history/aborted/*.dcr >/dev/null 2>&1 || fail "the aborted delta is not kept for repairs"
echo "row 20 (SEED=$SEED): ok"
