#!/usr/bin/env bash
# Row 20: the root dies during its baseline pass (issue 15): after the
# commit decision and COMMIT, while root.baseline takes the target's bits
# (coord.baseline_write=exit@N: SIGKILL-like, the baseline holds a mix and
# its record flags the refit unfinished). No manual step may be needed:
#   a. `dcr refit --resume` finishes it: exit 0, every store and the
#      baseline at v1 (bits and record);
#   b. killed the same way on v1 -> v2, the next plain `dcr refit --target
#      v3` finishes v2 first, then refits to v3: exit 0, every store and the
#      baseline at v3.
# Usage: 20_root_kill_baseline.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=20
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all

# baseline_state: "STEP clean|unfinished" from root.baseline's record.
baseline_state() {
  python3 -S -c "
import json; r = json.load(open('$T/base.safetensors.dcr-version'))
print((r['committed'] or {'step': 0})['step'], 'unfinished' if r.get('in_progress') else 'clean')"
}
# killed_in_baseline TARGET: the refit to TARGET dies in its baseline pass,
# at a seed-chosen span of the ~CHUNKS it writes.
killed_in_baseline() {
  local n
  n=$(pick 1 $((CHUNKS / 2)) "$1")
  COORD_FAILPOINTS="coord.baseline_write=exit@$n" fault_refit "$V/v$1.safetensors"
  [[ $RC -eq 86 ]] || { cat "$T/refit.err" >&2; fail "dcr refit exited $RC, want 86 (the failpoint)"; }
  grep -qF "failpoint coord.baseline_write (hit $n): exiting" "$T/refit.err" || fail "not stopped in the baseline pass"
  FAULTS[root_kill_baseline]=$((${FAULTS[root_kill_baseline]:-0} + 1))
  [[ $(baseline_state) == "$(($1 - 1)) unfinished" ]] ||
    fail "root.baseline after the kill: $(baseline_state), want step $(($1 - 1)) flagged unfinished"
}

# --- a. --resume finishes it ---------------------------------------------------
fault_snapshot
killed_in_baseline 1
fault_refit "" --resume
[[ $RC -eq 0 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "--resume exited $RC, want 0"; }
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
[[ $(baseline_state) == "1 clean" ]] || fail "root.baseline after --resume: $(baseline_state)"
[[ ! -e $T/root/current.json ]] || fail "current.json left after --resume"

# --- b. the next plain refit finishes it first ---------------------------------
fault_snapshot
killed_in_baseline 2
fault_refit "$V/v3.safetensors"
[[ $RC -eq 0 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "the next refit exited $RC, want 0"; }
grep -qF "finished the interrupted refit" "$T/refit.err" || { cat "$T/refit.err" >&2; fail "the refit does not say it finished the interrupted one"; }
cp "$T/report.json" "$T/out"
json "d['base']['step'] == 2" "d['target']['step'] == 3"
fault_check "$V/v3.safetensors" --expect-outcome committed --excluded ""
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v3.safetensors"
[[ $(baseline_state) == "3 clean" ]] || fail "root.baseline after the next refit: $(baseline_state)"
echo "row 20 (SEED=$SEED): ok"
