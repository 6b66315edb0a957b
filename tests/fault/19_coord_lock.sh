#!/usr/bin/env bash
# Row 19: no split brain on `dcr refit --resume` (issue 15, finding 1).
#   a. A coordinator stalls after its commit decision
#      (coord.before_commit=wait). Meanwhile `dcr refit --resume` and a new
#      `dcr refit` on the same state_dir are refused at once (exit 2),
#      naming the running coordinator's pid; `dcr status` shows it running
#      and takes no lock. The stalled run then commits: exit 0, every store
#      and the baseline at v1, and the lock is gone with it.
#   b. Fencing, for what a lock cannot stop (a copy of the state_dir on
#      another machine): a coordinator stalls after its decision (v1 -> v2)
#      and a `--resume` on a copy of its state_dir takes a newer epoch. The
#      relays refuse that one (they have a live parent) but record its
#      epoch, so they refuse or drop the stalled run's COMMIT as stale. It
#      must not advance root.baseline (DESIGN.md invariant 8): exit 1, outcome
#      unfinished, baseline still v1 (its update flagged unfinished),
#      current.json kept. `dcr refit --resume` then commits v2 everywhere
#      (exit 0, baseline v2), and the next refit (v3) commits everywhere.
# Usage: 19_coord_lock.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=19
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all

# wait_refit_log TEXT: the background refit's stderr shows TEXT within 10 s.
wait_refit_log() {
  local i
  for i in $(seq 200); do
    grep -qF -- "$1" "$T/refit.err" 2>/dev/null && return 0
    kill -0 "$REFIT_PID" 2>/dev/null || break
    sleep 0.05
  done
  cat "$T/refit.err" >&2
  fail "'$1' not in the coordinator's log within 10 s"
}
# baseline_step: the step root.baseline's record commits (and whether its
# update is flagged unfinished), as "STEP UNFINISHED".
baseline_state() {
  python3 -S -c "
import json; r = json.load(open('$T/base.safetensors.dcr-version'))
print((r['committed'] or {'step': 0})['step'], 'unfinished' if r.get('in_progress') else 'clean')"
}

# --- a. the lock -----------------------------------------------------------
fault_snapshot
# The coordinator is held after its decision (coord.before_commit=wait)
# until the refusals and statuses below are checked.
release_on_exit "$T/a.go"
REFIT_TIMEOUT=30s COORD_FAILPOINTS="coord.before_commit=wait($T/a.go)" \
  fault_refit_bg "$V/v1.safetensors"
wait_refit_log "failpoint coord.before_commit (hit 1): wait"
COORD=$(pgrep -P "$REFIT_PID" -x dcr || true)
[[ -n $COORD ]] || fail "no running coordinator"
FAULTS[concurrent_coordinator]=1
t0=$(date +%s%N)
expect 2 "$DCR" refit --topology "$TOPO" --resume --progress never -o json --timeout 10s
expect_err "pid $COORD"
grep -qF "dcr refit --resume" "$T/err" || fail "the refusal does not say what to do"
expect 2 "$DCR" refit --topology "$TOPO" --target "$V/v2.safetensors" --progress never --timeout 10s
expect_err "another coordinator (pid $COORD"
expect 0 "$DCR" status --topology "$TOPO" -o json --timeout 2s
json "d['root']['running']['pid'] == $COORD" "d['root']['running']['command'] == 'dcr refit'"
expect 0 "$DCR" status --topology "$TOPO" --timeout 2s
grep -qF "a refit is running (pid $COORD" "$T/out" || { cat "$T/out" >&2; fail "dcr status does not show the running refit"; }
refused_ms=$((($(date +%s%N) - t0) / 1000000))
echo "row 19: refusals and status took ${refused_ms} ms" >&2
kill -0 "$COORD" 2>/dev/null || fail "the held coordinator ended before the refusals were checked (${refused_ms} ms)"
touch "$T/a.go"
fault_refit_wait
[[ $RC -eq 0 ]] || { cat "$T/refit.err" >&2; fail "the stalled refit exited $RC, want 0"; }
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
expect 0 "$DCR" status --topology "$TOPO" -o json --timeout 2s
json "d['root']['running'] is None"

# --- b. a COMMIT fenced off never moves the baseline --------------------------
fault_snapshot
# The coordinator is held after its decision until the copies and a whole
# resume (its --timeout 3s) are done. The hold stops the root's
# heartbeats: at 3 s the relays drop a silent parent only after 12 s (an
# orphan would take the copy's resume as its new parent).
release_on_exit "$T/b.go"
REFIT_TIMEOUT=3s COORD_FAILPOINTS="coord.before_commit=wait($T/b.go)" \
  fault_refit_bg "$V/v2.safetensors" --heartbeat 3s
wait_refit_log "failpoint coord.before_commit (hit 1): wait"
t0=$(date +%s%N)
cp -a "$T/root" "$T/copy-root"
cp "$T/base.safetensors" "$T/copy-base.safetensors"
cp "$T/base.safetensors.dcr-version" "$T/copy-base.safetensors.dcr-version"
COPY=$T/copy.yaml
sed -e "s|state_dir: \"$T/root\"|state_dir: \"$T/copy-root\"|" \
  -e "s|baseline: \"$T/base.safetensors\"|baseline: \"$T/copy-base.safetensors\"|" "$TOPO" >"$COPY"
FAULTS[fenced_coordinator]=1
set +e
"$DCR" refit --topology "$COPY" --resume --progress never -o json --timeout 3s >"$T/copy.json" 2>"$T/copy.err"
copy_rc=$?
set -e
echo "row 19: the resume on the copy took $((($(date +%s%N) - t0) / 1000000)) ms" >&2
kill -0 "$REFIT_PID" 2>/dev/null || fail "the held refit ended before the copy's resume did"
touch "$T/b.go"
[[ $copy_rc -eq 1 ]] || { cat "$T/copy.err" "$T/copy.json" >&2; fail "the resume on the copy exited $copy_rc, want 1 (unfinished: every relay refused it)"; }
fault_refit_wait
[[ $RC -eq 1 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "the fenced-off refit exited $RC, want 1"; }
cp "$T/report.json" "$T/out"
json "d['outcome'] == 'unfinished'" "'--resume' in d['reason']" "not any(n['committed'] for n in d['nodes'])"
[[ $(baseline_state) == "1 unfinished" ]] || fail "root.baseline after a fenced-off COMMIT: $(baseline_state), want step 1, flagged unfinished"
[[ -s $T/root/current.json ]] || fail "the unfinished refit's current.json was removed"
fault_refit "" --resume
[[ $RC -eq 0 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "--resume exited $RC, want 0"; }
fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
[[ $(baseline_state) == "2 clean" ]] || fail "root.baseline after --resume: $(baseline_state), want step 2"
fault_refit "$V/v3.safetensors"
[[ $RC -eq 0 ]] || { cat "$T/refit.err" "$T/report.json" >&2; fail "the next refit exited $RC, want 0"; }
echo "row 19 (SEED=$SEED): ok"
