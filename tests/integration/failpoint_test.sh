#!/usr/bin/env bash
# Faults at exact moments, through failpoints (docs/TESTING.md): real
# dcr-relay processes on free loopback ports (root + rollout-a: a0 -> {a1,
# a2}, rollout-b: b0; file stores), each fault armed through DCR_FAILPOINTS
# in one process's environment only:
#   a. a malformed DCR_FAILPOINTS: exit 2 and a one-line error, in both
#      binaries
#   b. relay.vote=exit on the leaf a2: a2 exits 86, the refit aborts (1),
#      a2 is reported unreachable, every other store and the baseline keep
#      v0
#   c. relay.forward=drop@2 on the head a0: a1 and a2 miss a chunk and vote
#      incomplete, the refit aborts, every store keeps v0
#   d. coord.before_commit=exit on dcr refit: it exits 86 with the commit
#      decision durable; the relays, whose parent left before COMMIT,
#      restore v0 and go idle
#   e. without failpoints the same tree then commits v1 everywhere
#   f. store.data_sync=delay on a1: its record stays marked "unsynced"
#      after the commit; a kill -9 then loses nothing; a mark from another
#      boot makes the restart check the bits, and a lost write costs the
#      version until --full --node repairs it
# Usage: failpoint_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
T=$(mktemp -d /tmp/dcr-failpoint-test.XXXXXX)
declare -A PID=()  # relay name -> pid of the running dcr-relay

trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
unset DCR_FAILPOINTS  # only where a step sets it

# --- Model, ports, topology ------------------------------------------------
"$TRAINGEN" --out "$T/ck" --hidden 64 --layers 2 --vocab 512 --steps 1 \
  >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck

RELAYS=(a0 a1 a2 b0)  # fanout 2: a0 -> {a1, a2}; b0 alone
read -r -a PORTS < <(python3 - "$((${#RELAYS[@]} + 1))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
[[ ${#PORTS[@]} -eq $((${#RELAYS[@]} + 1)) ]] || fail "could not pick free ports"

TOPO=$T/tree.yaml
{
  # Small spans: the model makes a few dozen chunks, so "the 2nd chunk" is
  # one of many.
  echo "version: 1"
  echo "defaults: {fanout: 2, min_commit: all, span_elems: 4096}"
  echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
  echo "clusters:"
  echo "  - name: train"
  i=1
  for c in a b; do
    echo "  - name: rollout-$c"
    echo "    nodes:"
    for n in "${RELAYS[@]}"; do
      [[ $n == "$c"* ]] || continue
      echo "      - {name: $n, host: 127.0.0.1, port: ${PORTS[$i]}, store: {kind: file, path: \"$T/$n.safetensors\"}}"
      i=$((i + 1))
    done
  done
  echo "links:"
  echo "  - {from: train, to: rollout-a, bandwidth: 1Gbps, latency: 1ms}"
  echo "  - {from: train, to: rollout-b, bandwidth: 1Gbps, latency: 1ms}"
} >"$TOPO"
expect 0 "$DCR" topo validate "$TOPO"
expect 0 "$DCR" tree --topology "$TOPO" -o json
json '[[d["nodes"][k]["name"] for k in n["children"]] for n in d["nodes"] if n["name"] == "a0"] == [["a1", "a2"]]'

RELAY_ARGS=()
seed() {  # seed NAME...: the store holds v0 and no version record
  local n
  for n in "$@"; do
    cp "$V/v0.safetensors" "$T/$n.safetensors"
    rm -f "$T/$n.safetensors.dcr-version"
  done
}
start_relay() {  # start_relay NAME [FAILPOINTS]: in the background, ready within 10 s
  local n=$1
  rm -f "$T/$n.ready"
  DCR_FAILPOINTS=${2:-} "$RELAY" --topology "$TOPO" --node "$n" \
    --ready-file "$T/$n.ready" "${RELAY_ARGS[@]}" >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
  for _ in $(seq 100); do
    [[ -s "$T/$n.ready" ]] && return 0
    kill -0 "${PID[$n]}" 2>/dev/null || { cat "$T/$n.log" >&2; fail "relay $n exited before it was ready"; }
    sleep 0.1
  done
  cat "$T/$n.log" >&2
  fail "relay $n not ready within 10 s"
}
stop_relay() {  # stop_relay NAME: SIGTERM, gone within 5 s
  local p=${PID[$1]}
  kill -TERM "$p"
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "relay $1 still running 5 s after SIGTERM"
  wait "$p" || true
  unset "PID[$1]"
}
wait_exit() {  # wait_exit NAME CODE: relay NAME exits with CODE within 10 s
  local p=${PID[$1]} rc
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "relay $1 still running"
  set +e
  wait "$p"
  rc=$?
  set -e
  unset "PID[$1]"
  [[ $rc -eq $2 ]] || { cat "$T/$1.log" >&2; fail "relay $1 exited $rc, want $2"; }
}
wait_idle() {  # wait_idle NAME...: dcr status shows them idle within 10 s
  local names
  names=$(printf "'%s'," "$@")
  for _ in $(seq 100); do
    if "$DCR" status --topology "$TOPO" --timeout 2s -o json >"$T/out" 2>"$T/err" &&
      python3 -S - "$T/out" <<PY; then
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if all(n['detail'].startswith('idle') for n in d['nodes'] if n['node'] in ($names)) else 1)
PY
      return 0
    fi
    sleep 0.1
  done
  cat "$T/out" "$T/err" >&2
  fail "not idle within 10 s: $*"
}
refit() {  # refit CODE [ARGS...]: dcr refit v0 -> v1 -o json, exit CODE
  local code=$1
  shift
  expect "$code" "$DCR" refit --topology "$TOPO" --target "$V/v1.safetensors" \
    --timeout 10s --progress never -o json "$@"
}

seed "${RELAYS[@]}"
cp "$V/v0.safetensors" "$T/base.safetensors"

# --- a. Malformed specs: usage errors before anything starts --------------
DCR_FAILPOINTS="relay.vote=explode" expect 2 "$RELAY" --topology "$TOPO" --node a0
expect_err "dcr-relay: error: DCR_FAILPOINTS=\"relay.vote=explode\": unknown action 'explode' in 'relay.vote=explode'"
DCR_FAILPOINTS="relay.vote=exit;coord.before_commit=drop" expect 2 "$DCR" status --topology "$TOPO"
expect_err "dcr: error: DCR_FAILPOINTS=\"relay.vote=exit;coord.before_commit=drop\": coord.before_commit does not take drop in 'coord.before_commit=drop' (it takes exit, hang, delay, wait)"
DCR_FAILPOINTS="relay.vot=exit" expect 2 "$DCR" --help
expect_err "unknown failpoint 'relay.vot'"

# --- b. A leaf exits instead of voting -------------------------------------
start_relay a0
start_relay a1
start_relay a2 "relay.vote=exit"
start_relay b0
refit 1
json 'd["outcome"] == "aborted" and d["reason"] != ""' 'not any(n["committed"] for n in d["nodes"])'
node_json a2 'n["code"] == "unreachable" and n["phase"] == "vote"'
wait_exit a2 86
grep -qF "failpoint relay.vote (hit 1): exiting with code 86" "$T/a2.log" ||
  { cat "$T/a2.log" >&2; fail "a2 did not log its failpoint"; }
verify_all "$V/v0.safetensors" a0 a1 b0 base
# a2 died with the target's bits applied and the refit recorded in progress
# (nothing restores a killed process's store): reseed it by hand.
expect 1 "$DCR" verify "$T/a2.safetensors" "$V/v0.safetensors"
seed a2
start_relay a2

# --- c. The head drops the 2nd chunk on its way to its children ------------
# Without repair rounds a1 and a2 miss it, vote no and the refit aborts.
stop_relay a0
start_relay a0 "relay.forward=drop@2"
refit 1 --repair-rounds 0
json 'd["outcome"] == "aborted"' 'not any(n["committed"] for n in d["nodes"])' 'd["chunks"] > 2' 'd["repair_rounds"] == 0'
node_json a1 'n["code"] == "incomplete" and n["phase"] == "vote"'
node_json a2 'n["code"] == "incomplete" and n["phase"] == "vote"'
grep -qF "failpoint relay.forward (hit 2): drop" "$T/a0.log" ||
  { cat "$T/a0.log" >&2; fail "a0 did not log its failpoint"; }
wait_idle "${RELAYS[@]}"
verify_all "$V/v0.safetensors" "${RELAYS[@]}" base
# With them (the default), the root resends the tensor they name as
# overwrites and everyone commits.
stop_relay a0
start_relay a0 "relay.forward=drop@2"
refit 0
json 'd["outcome"] == "committed"' 'd["repair_rounds"] == 1' 'd["repair_bytes"] > 0'
verify_all "$V/v1.safetensors" "${RELAYS[@]}" base
# Back to v0 everywhere for the next case; relays that voted wait 2 s (not
# 10 min) for a decision once their parent is gone.
for n in "${RELAYS[@]}"; do stop_relay "$n"; done
seed "${RELAYS[@]}"
cp "$V/v0.safetensors" "$T/base.safetensors"
rm -f "$T/base.safetensors.dcr-version" "$T"/root/decisions/*.json
RELAY_ARGS=(--prepared-wait 2s)
for n in "${RELAYS[@]}"; do start_relay "$n"; done

# --- d. The coordinator exits once the decision is durable -----------------
declare -A LOGSIZE=()
for n in "${RELAYS[@]}"; do LOGSIZE[$n]=$(stat -c %s "$T/$n.log"); done
DCR_FAILPOINTS="coord.before_commit=exit" expect 86 "$DCR" refit \
  --topology "$TOPO" --target "$V/v1.safetensors" --timeout 10s --progress never -o json
grep -qF "failpoint coord.before_commit (hit 1): exiting with code 86" "$T/err" ||
  { cat "$T/err" >&2; fail "dcr refit did not log its failpoint"; }
mapfile -t DECISIONS < <(python3 -S - "$T/root/decisions" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    if d["decision"] == "commit" and d["target"]["step"] == 1:
        print(f)
PY
)
[[ ${#DECISIONS[@]} -eq 1 ]] || { ls -l "$T/root/decisions" >&2; fail "want one commit decision, got ${#DECISIONS[@]}"; }
wait_idle "${RELAYS[@]}"
verify_all "$V/v0.safetensors" "${RELAYS[@]}"
# root.baseline took the target's bits while streaming; its record still
# names the refit in progress (the decision stands, nothing is committed).
verify_all "$V/v1.safetensors" base
python3 -S -c "import json,sys; r=json.load(open('$T/base.safetensors.dcr-version')); sys.exit(0 if r.get('in_progress') else 1)" ||
  fail "root.baseline's record does not flag the refit in progress"
for n in "${RELAYS[@]}"; do
  tail -c +"$((LOGSIZE[$n] + 1))" "$T/$n.log" | grep -q "parent link lost during refit" ||
    { cat "$T/$n.log" >&2; fail "$n did not see its parent leave"; }
done

# --- e. The decision stands: --resume, then repair the stale tree -----------
# The relays gave up waiting (--prepared-wait 2s) and restored v0.
# --resume applies the recorded decision: nobody could commit any more
# (exit 3, every node stale), but the baseline commits v1 as decided. (A
# plain refit would finish it first the same way: fault row 20.)
expect 3 "$DCR" refit --topology "$TOPO" --resume --timeout 10s --progress never -o json
json 'd["outcome"] == "committed-partial"' 'not any(n["committed"] for n in d["nodes"])'
verify_all "$V/v1.safetensors" base
verify_all "$V/v0.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" refit --topology "$TOPO" --resume --progress never
expect_err "no interrupted refit to resume"
# A full refit of the baseline's version repairs every stale relay.
expect 0 "$DCR" refit --topology "$TOPO" --target "$V/v1.safetensors" --full \
  --timeout 10s --progress never -o json
json 'd["outcome"] == "committed"' 'all(n["committed"] for n in d["nodes"])'
verify_all "$V/v1.safetensors" "${RELAYS[@]}" base

# --- f. The store's background write-back (--data-sync background) ---------
# a1's write-back is held (store.data_sync=hang): once the refit back
# to v0 commits, a1's record names v0 marked "unsynced" with this boot's id,
# and its metrics say so. A kill -9 then loses nothing (the page
# cache holds the bits): the restart writes them back and drops the mark.
# A mark from another boot is what a host crash leaves: the restart hashes
# the store; bits that hold the version keep it, a store that lost a write
# loses it, and dcr refit --full --node repairs it.
a1_record() {  # a1_record EXPR: EXPR holds for r = a1's version record
  python3 -S - "$T/a1.safetensors.dcr-version" "$1" <<'PY' || { cat "$T/a1.safetensors.dcr-version" >&2; fail "a1's record: $1"; }
import json, sys
r = json.load(open(sys.argv[1]))
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}
a1_metric() {  # a1_metric NAME: the value of a1's metric NAME on stdout
  python3 -S - "$T/a1.ready" "$1" <<'PY'
import json, re, sys, urllib.request
port = json.load(open(sys.argv[1]))["metrics_port"]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
print(re.search("^" + sys.argv[2] + r"\{[^}]*\} (\S+)$", text, re.M).group(1))
PY
}
stop_relay a1
RELAY_ARGS=(--prepared-wait 2s --metrics-port 0)
# The write-back held (hang) until a1 is killed: the checks below see its
# mark however long they take.
start_relay a1 "store.data_sync=hang"
refit 0 --full  # v1 again, so that a1's write-back starts from a commit
expect 0 "$DCR" refit --topology "$TOPO" --target "$V/v0.safetensors" \
  --timeout 20s --progress never -o json
json 'd["outcome"] == "committed"'
a1_record 'r["format"] == 4 and r["unsynced"]["boot_id"] == boot and r["committed"] is not None'
[[ $(a1_metric dcr_relay_store_unsynced) == 1 ]] || fail "a1 does not report its pending write-back"
kill -KILL "${PID[a1]}"
wait "${PID[a1]}" || true
unset "PID[a1]"
start_relay a1
a1_record 'r["format"] == 3 and "unsynced" not in r and r["committed"] is not None'
[[ $(a1_metric dcr_relay_store_unsynced) == 0 ]] || fail "a1 still reports a pending write-back"
verify_all "$V/v0.safetensors" "${RELAYS[@]}"
mark_other_boot() {  # the record as a crash of the host would leave it
  python3 -S - "$T/a1.safetensors.dcr-version" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r["format"] = 4
r["unsynced"] = {"boot_id": "00000000-1111-2222-3333-444444444444", "since": "2026-01-01T00:00:00Z"}
open(sys.argv[1], "w").write(json.dumps(r, separators=(",", ":")) + "\n")
PY
}
stop_relay a1
mark_other_boot
start_relay a1
grep -qF "the bits were checked and hold it" "$T/a1.log" || { cat "$T/a1.log" >&2; fail "a1 did not check its bits"; }
a1_record '"unsynced" not in r and r["committed"] is not None'
stop_relay a1
mark_other_boot
python3 -S - "$T/a1.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:  # a write-back that never happened
    f.seek(-1, 2)
    b = f.read(1)
    f.seek(-1, 2)
    f.write(bytes([b[0] ^ 0x40]))
PY
start_relay a1
grep -qF "the bits on disk do not hold it" "$T/a1.log" || { cat "$T/a1.log" >&2; fail "a1 did not find its lost write"; }
a1_record '"unsynced" not in r and r["committed"] is None'
expect 0 "$DCR" refit --topology "$TOPO" --target "$V/v0.safetensors" --full \
  --node a1 --timeout 10s --progress never -o json
verify_all "$V/v0.safetensors" "${RELAYS[@]}" base
echo "failpoints: ok"
