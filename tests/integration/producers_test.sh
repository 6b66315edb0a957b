#!/usr/bin/env bash
# Producers' refits (issue 17) with real processes on loopback: `dcr refit
# --producers 4` as a long-running coordinator, two dcr-relay processes,
# and trainer ranks (producers_driver.py, the `dcr` Python module) that
# stream the shards `dcr-traingen --layout` wrote, one refit per step.
#   a. usage errors name what to fix (exit 2);
#   b. two steps commit; after each, both relays and root.baseline hold the
#      gathered canonical checkpoint of that step (dcr verify);
#   c. a rank that never connects: the others are refused, naming it;
#   d. ranks at different trainer steps: refused, naming both;
#   e. a rank that dies mid-refit (failpoint producer.send_chunk=exit):
#      the refit aborts, relays and root.baseline hold the base again, the
#      other ranks are told "aborted"; the rank, restarted without its
#      baseline, gets the tree's from root.baseline and commits the next;
#   f. SIGTERM ends a coordinator waiting for the next step, exit 0;
#   g. a coordinator that dies before or after its decision: dcr refit
#      --resume aborts or commits, root.baseline settled from its journal;
#      the ranks that missed the decision are resynced by the next refit;
#   h. HEARTBEATs both ways: a rank silent past the coordinator's --timeout
#      while it diffs, ranks waiting past their own timeout for a decision;
#      a rank whose shards change before the decision: without a step
#      log it drops its baseline and fetches the tree's at the next
#      refit; with one its baseline holds the bits it sent and the next
#      refit diffs against them.
# Usage: producers_test.sh DCR DCR_RELAY TRAINGEN PYTHON_MODULE_DIR LAYOUTS
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
MODULE=$4
LAYOUTS=$5
T=$(mktemp -d /tmp/dcr-producers-test.XXXXXX)
# Every frame is keyed (defaults.auth_key_file): the ranks take the file.
head -c 32 /dev/urandom >"$T/frame.key"
chmod 600 "$T/frame.key"
UNKEYED_DRIVER="/usr/bin/python3 $(dirname "$0")/producers_driver.py $MODULE"
DRIVER="$UNKEYED_DRIVER --auth-key-file $T/frame.key"
declare -A PID
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
COORD_PID=""
trap '[[ -n $COORD_PID ]] && kill -KILL $COORD_PID 2>/dev/null; cleanup' EXIT

# A tiny model under the shipped traingen layout's scheme (tp 2, pp 2).
sed -e 's/32000/300/g; s/1024/64/g; s/2752/192/g; s/layers: 8/layers: 4/' \
  -e 's/heads: 16/heads: 4/; s/kv_heads: 4/kv_heads: 2/; s/head_dim: 64/head_dim: 16/' \
  "$LAYOUTS/traingen-tp2-pp2.yaml" >"$T/tiny.yaml"
"$TRAINGEN" --hidden 64 --layers 4 --heads 4 --kv-heads 2 --vocab 300 \
  --steps 10 --out "$T/ck" --layout "$T/tiny.yaml" >/dev/null 2>"$T/traingen.log" ||
  { cat "$T/traingen.log" >&2; fail "traingen"; }
for n in root a b; do cp "$T/ck/v0.safetensors" "$T/$n.safetensors"; done

read -r -a PORTS < <(free_ports 4)
[[ ${#PORTS[@]} -eq 4 ]] || fail "could not pick free ports"
COORD=127.0.0.1:${PORTS[3]}
TOPO=$T/tree.yaml
cat >"$TOPO" <<EOF
version: 1
defaults: {transport: tcp, fanout: 2, span_elems: 4096, auth_key_file: "$T/frame.key"}
root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: "$T/state", baseline: "$T/root.safetensors"}
clusters:
  - name: train
  - name: rollout
    nodes:
      - {name: a, host: 127.0.0.1, port: ${PORTS[1]}, store: {kind: file, path: "$T/a.safetensors"}}
      - {name: b, host: 127.0.0.1, port: ${PORTS[2]}, store: {kind: file, path: "$T/b.safetensors"}}
links:
  - {from: train, to: rollout, bandwidth: 1Gbps, latency: 1ms}
EOF
for n in a b; do
  "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
done
wait_ready a b

# verify_step K: both relays and root.baseline hold step K's canonical file.
verify_step() {
  verify_all "$T/ck/v$1.safetensors" a b root
}
VERIFY="$DCR verify $T/a.safetensors $T/ck/v{k}.safetensors >/dev/null && \
$DCR verify $T/b.safetensors $T/ck/v{k}.safetensors >/dev/null && \
$DCR verify $T/root.safetensors $T/ck/v{k}.safetensors >/dev/null"

# start_coord ARGS...: a coordinator in the background, its output in
# $T/coord.out and $T/coord.err; stop_coord WANT: its exit code is WANT.
start_coord() {
  # Emptied here, not by the background job's redirection, which may come
  # after the wait below has read the last coordinator's "waiting for".
  : >"$T/coord.err"
  "$DCR" refit --topology "$TOPO" --producers 4 --layout "$T/tiny.yaml" \
    --listen "$COORD" --progress never -o json --timeout "${COORD_TIMEOUT:-10s}" "$@" \
    >"$T/coord.out" 2>"$T/coord.err" &
  COORD_PID=$!
  for _ in $(seq 100); do
    grep -q "waiting for 4 producers" "$T/coord.err" && return
    kill -0 "$COORD_PID" 2>/dev/null || { cat "$T/coord.err" >&2; fail "coordinator exited: $*"; }
    sleep 0.1
  done
  fail "the coordinator did not listen"
}
stop_coord() {
  local want=$1 rc
  set +e
  wait "$COORD_PID"
  rc=$?
  set -e
  COORD_PID=""
  [[ $rc -eq $want ]] || { cat "$T/coord.err" >&2; fail "coordinator exited $rc, want $want"; }
}
# decisions K EXPR: EXPR holds for every rank's decision r of step K
# (driver output in $T/driver.out).
decisions() {
  python3 -S - "$T/driver.out" "$1" "$2" <<'PY' || { cat "$T/driver.out" >&2; fail "decisions of step $1: $2"; }
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
step = [l for l in lines if l["step"] == int(sys.argv[2])]
assert step, "no line for the step"
for rank, r in step[-1]["ranks"].items():
    assert eval(sys.argv[3]), (rank, r)
PY
}

# --- a. Usage ------------------------------------------------------------
expect 2 "$DCR" refit --topology "$TOPO" --producers 3 --layout "$T/tiny.yaml"
grep -q "the layout $T/tiny.yaml has 4 ranks (tp 2 x pp 2 x ep 1)" "$T/err" ||
  fail "--producers 3: $(cat "$T/err")"
expect 2 "$DCR" refit --topology "$TOPO" --producers 4
grep -q -- "--producers needs --layout" "$T/err" || fail "no --layout"
expect 2 "$DCR" refit --topology "$TOPO" --layout "$T/tiny.yaml"
grep -q -- "--layout and --refits go with --producers" "$T/err" || fail "no --producers"
expect 2 "$DCR" refit --topology "$TOPO" --producers 4 --layout "$T/tiny.yaml" \
  --target "$T/ck/v1.safetensors"
grep -q "give no --target" "$T/err" || fail "--producers with --target"
# A layout of another model than root.baseline's: refused at start.
expect 2 "$DCR" refit --topology "$TOPO" --producers 4 \
  --layout "$LAYOUTS/traingen-tp2-pp2.yaml"
grep -q "places other tensors than root.baseline" "$T/err" ||
  fail "layout of another model: $(cat "$T/err")"
expect 0 "$DCR" refit --help
grep -q -- "--producers" "$T/out" || fail "--help lacks --producers"

# --- b. Two steps commit -------------------------------------------------
# (Coded in the context of root.baseline's bits: --context on.)
start_coord --refits 2 --context on
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 0 --steps 1,2 \
  --verify "$VERIFY" >"$T/driver.out" ||
  { cat "$T/driver.out" "$T/coord.err" >&2; fail "steps 1 and 2"; }
stop_coord 0
decisions 1 'r["outcome"] == "committed" and r["target_step"] == 1 and r["chunks"] > 0'
decisions 2 'r["outcome"] == "committed" and r["target_step"] == 2'
python3 -S - "$T/coord.out" <<'PY' || fail "coordinator reports"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["outcome"] for r in rs] == ["committed"] * 2, rs
assert [r["trainer_step"] for r in rs] == [1, 2] and all(r["producers"] == 4 for r in rs)
assert all(n["committed"] for r in rs for n in r["nodes"])
assert all(r["chunks"] > 0 and r["changed_elements"] > 0 for r in rs)
assert all(r["context_chunks"] > 0 for r in rs), [r["context_chunks"] for r in rs]
PY
verify_step 2

# --- b2. A rank without the frame key ------------------------------------
start_coord --refits 1
set +e
$UNKEYED_DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --ranks 0 \
  --timeout 5 >"$T/driver.out" 2>&1
set -e
kill -TERM "$COORD_PID"
stop_coord 0
decisions 3 '"error" in r'
grep -q "authentication" "$T/coord.err" ||
  { cat "$T/coord.err" >&2; fail "the coordinator does not say why it dropped the unkeyed rank"; }
verify_step 2
# Bad transport files are refused when the producer is made, naming them.
cp "$T/frame.key" "$T/open.key"
chmod 644 "$T/open.key"
/usr/bin/python3 -S - "$MODULE" "$T/tiny.yaml" "$T/open.key" <<'PY' || fail "producer transport files"
import sys
sys.path.insert(0, sys.argv[1])
import dcr
layout = dcr.Layout(sys.argv[2])
for kw, want in (({"auth_key_file": sys.argv[3]}, "mode 0644"),
                 ({"tls_ca_file": "/nonexistent/ca.pem"}, "TLS needs tls_ca_file")):
    try:
        dcr.Producer(layout, 0, "127.0.0.1:1", **kw)
        raise SystemExit(f"{kw} was taken")
    except ValueError as e:
        assert want in str(e), (kw, str(e))
PY

# --- c. A rank that never connects ---------------------------------------
start_coord --refits 1 --producer-wait 1s
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --ranks 0,1,2 \
  >"$T/driver.out"
stop_coord 1
decisions 3 'r["outcome"] == "refused" and "rank 3 did not connect" in r["reason"]'
grep -q "rank 3 did not connect" "$T/coord.err" || fail "coordinator names rank 3"
verify_step 2

# --- d. Ranks at different steps -----------------------------------------
start_coord --refits 1
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --ranks 0,1 \
  --step-label 7 >"$T/driver.out" &
other=$!
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --ranks 2,3 \
  --step-label 8 >"$T/driver2.out"
wait $other
stop_coord 1
cat "$T/driver2.out" >>"$T/driver.out"
decisions 3 'r["outcome"] == "refused" and "step 7 (ranks 0, 1), step 8 (ranks 2, 3)" in r["reason"]'
verify_step 2

# --- e. A rank dies mid-refit --------------------------------------------
start_coord --refits 2
DCR_FAILPOINTS="producer.send_chunk=exit@3" \
  $DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --ranks 3 \
  >/dev/null 2>"$T/dead.err" &
dead=$!
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --ranks 0,1,2 \
  >"$T/driver.out"
set +e
wait $dead
rc=$?
set -e
[[ $rc -eq 86 ]] || fail "the failpoint's rank exited $rc, want 86"
decisions 3 'r["outcome"] == "aborted" and "producer rank 3" in r["reason"]'
verify_step 2
# Restarted without its baseline (its trainer lost the shards of step 2),
# rank 3 gets the tree's from root.baseline and joins the next refit.
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 2 --steps 3 --no-baseline 3 \
  --verify "$VERIFY" >"$T/driver.out" ||
  { cat "$T/driver.out" "$T/coord.err" >&2; fail "step 3 after the abort"; }
grep -q "producer rank 3 had no baseline: sent its" "$T/coord.err" ||
  fail "the coordinator does not say it sent rank 3 its baseline"
stop_coord 1  # one of its two refits aborted
decisions 3 'r["outcome"] == "committed"'
python3 -S - "$T/coord.out" <<'PY' || fail "the aborted refit's report"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["outcome"] for r in rs] == ["aborted", "committed"], rs
assert "producer rank 3" in rs[0]["reason"], rs[0]["reason"]
PY
verify_step 3

# --- g. The coordinator dies: dcr refit --resume settles root.baseline --
# Before the decision (its last CHUNK queued): the resume aborts; the
# relays and root.baseline (from its journal) hold the base again.
DCR_FAILPOINTS="coord.after_stream=exit" start_coord --refits 1
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 3 --steps 4 >"$T/driver.out"
stop_coord 86
decisions 4 '"error" in r'
refit_json 1 "$TOPO" --resume
json 'd["outcome"] == "aborted"'
verify_step 3
# After a durable commit decision: the resume commits, and root.baseline
# (which took the whole stream before the vote) records the target.
DCR_FAILPOINTS="coord.before_commit=exit" start_coord --refits 1
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 3 --steps 4 >"$T/driver.out"
stop_coord 86
refit_json 0 "$TOPO" --resume
json 'd["outcome"] == "committed"'
verify_step 4
[[ ! -e $T/root.safetensors.dcr-journal ]] || fail "root.baseline's journal left behind"
# The ranks never heard the decision: their baselines are step 3's. The
# next refit finds them by its base check, sends them the tree's (step 4)
# from root.baseline, and commits their step 5.
start_coord --refits 1
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 3 --steps 5 \
  --verify "$VERIFY" >"$T/driver.out" ||
  { cat "$T/driver.out" "$T/coord.err" >&2; fail "stale ranks at step 5"; }
stop_coord 0
decisions 5 'r["outcome"] == "committed"'
[[ $(grep -c "held another version than the tree's: sent its" "$T/coord.err") -eq 4 ]] ||
  { cat "$T/coord.err" >&2; fail "the four stale ranks were not resynced"; }
verify_step 5

# --- h. Heartbeats --------------------------------------------------------
# A rank that sends no chunk for longer than the coordinator's --timeout
# (here its first chunk waits 4 s, as behind a long run of unchanged
# weights) is kept alive by its HEARTBEATs.
COORD_TIMEOUT=2s start_coord --refits 1
DCR_FAILPOINTS="producer.send_chunk=delay(4000)@1" \
  $DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 5 --steps 6 \
  --verify "$VERIFY" >"$T/driver.out" ||
  { cat "$T/driver.out" "$T/coord.err" >&2; fail "a rank silent for 4 s"; }
stop_coord 0
decisions 6 'r["outcome"] == "committed"'
verify_step 6
# Ranks that wait longer than their own timeout (2.5 s) for a decision the
# coordinator takes 5 s to send hear its HEARTBEATs (every second)
# meanwhile. Rank 1's trainer changes its shards 2.5 s into its refit
# (its diff took well under that; the decision is 5 s away). Without a
# step log (--step-log-bytes 0) the commit stands, its baseline (neither
# version) is dropped, and the next refit fetches it.
DCR_FAILPOINTS="coord.before_commit=delay(5000)" start_coord --refits 2
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 6 --steps 7,8 --timeout 2.5 \
  --mutate-rank 1 --mutate-after 2.5 --step-log-bytes 0 \
  --verify "$VERIFY" >"$T/driver.out" ||
  { cat "$T/driver.out" "$T/coord.err" >&2; fail "a decision after 3 s"; }
stop_coord 0
decisions 7 'r["outcome"] == "committed" and r["baseline_dropped"] == (rank == "1")'
decisions 7 'rank != "1" or "did the trainer step again" in r["reason"]'
decisions 8 'r["outcome"] == "committed" and not r["baseline_dropped"]'
grep -q "producer rank 1 had no baseline: sent its" "$T/coord.err" ||
  fail "rank 1's dropped baseline was not fetched at step 8"
verify_step 8
# With a step log the same trainer loses nothing: at the diff its
# baseline took the bits it sent, so the commit keeps them whatever its
# shards hold by then, and the next refit diffs against them. (This tiny
# model's shards change more than the default bound, a quarter of their
# bytes, holds: 1 MiB here.)
DCR_FAILPOINTS="coord.before_commit=delay(3000)" start_coord --refits 2
$DRIVER "$T/tiny.yaml" "$COORD" "$T/ck" --base 8 --steps 9,10 \
  --mutate-rank 1 --mutate-after 1.5 --step-log-bytes 1048576 \
  --verify "$VERIFY" >"$T/driver.out" ||
  { cat "$T/driver.out" "$T/coord.err" >&2; fail "a logged step"; }
stop_coord 0
decisions 9 'r["outcome"] == "committed" and not r["baseline_dropped"]'
decisions 10 'r["outcome"] == "committed" and not r["baseline_dropped"]'
if grep -q "producer rank 1 had no baseline" "$T/coord.err"; then
  fail "rank 1's baseline was dropped although its step kept a log"
fi
verify_step 10

# --- f. SIGTERM while waiting for the next step --------------------------
start_coord
kill -TERM "$COORD_PID"
stop_coord 0
grep -q "SIGTERM: no further refits" "$T/coord.err" || fail "SIGTERM message"

echo "producers_test: OK"
