# Fault matrix fixture (tests/fault/README.md). Source it from a row script
# after setting ROW (e.g. ROW=4) and, optionally, SEED; it sources
# tests/integration/lib.sh for fail/expect/json/node_json/verify_all/cleanup.
#
# Usage of a row: tests/fault/NN_name.sh [DCR DCR_RELAY TRAINGEN]
#   (default: $DCR_BUILD_DIR or build/, as tools/demo does)
# Env: SEED (default 1) varies the fault (chunk number, byte count, ...);
#   DCR_FAULT_OUT: append the run's metrics (one JSON line) to this file;
#   DCR_FAULT_KEEP=1: keep the scratch dir.
# shellcheck shell=bash

FAULT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_root=$(cd "$FAULT_DIR/../.." && pwd)
_build=${DCR_BUILD_DIR:-$_root/build}
DCR=${1:-$_build/src/cli/dcr}
RELAY=${2:-$_build/src/cli/dcr-relay}
TRAINGEN=${3:-$_build/tools/dcr-traingen}
SEED=${SEED:-1}
[[ $SEED =~ ^[0-9]+$ ]] || { echo "SEED must be a decimal number" >&2; exit 2; }
for b in "$DCR" "$RELAY" "$TRAINGEN"; do
  [[ -x $b ]] || { echo "fault row $ROW: no binary $b (build first)" >&2; exit 2; }
done
mkdir -p /tmp/fault
T=$(mktemp -d "/tmp/fault/row$ROW.XXXXXX")
declare -A PID=()    # relay name -> pid (cleanup of integration/lib.sh)
declare -A XPID=()   # helper processes (proxies) -> pid
declare -A FAULTS=() # fault type -> count injected in this run
FAULT_T0=""          # when a relay failure was injected (s since the epoch)
# shellcheck source=tests/integration/lib.sh
source "$FAULT_DIR/../integration/lib.sh"
unset DCR_FAILPOINTS

_fault_exit() {
  local rc=$? n
  trap - EXIT
  if [[ $rc -ne 0 ]]; then
    echo "fault row $ROW (SEED=$SEED) failed; scratch dir $T kept" >&2
    DCR_FAULT_KEEP=1
  fi
  for n in "${!XPID[@]}"; do kill -KILL "${XPID[$n]}" 2>/dev/null || true; done
  release_all  # a held background refit (release_on_exit)
  if [[ ${DCR_FAULT_KEEP:-0} == 1 ]]; then
    local p
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
  else
    cleanup
  fi
  exit "$rc"
}
trap _fault_exit EXIT
trap 'exit 130' INT TERM

# pick N: N distinct integers in [0, M) from SEED (and the row), one a line.
pick() {
  python3 -S -c "import random,sys; r=random.Random($SEED*1000+$ROW+${3:-0}); print(r.randrange($1,$2))"
}

# --- Model -----------------------------------------------------------------
# fault_model: $V/v0..v3.safetensors (a small transformer, ~40 changed spans
# of 4096 elements per step) and CHUNKS, the chunk count of v0 -> v1.
# FAULT_MODEL (env) replaces traingen's model options, for figures on a
# larger model (e.g. "--hidden 1024 --layers 2 --vocab 8192 --lr 2.3e-6").
SPAN=4096
fault_model() {  # fault_model [STEPS]: v0..vSTEPS (default 3)
  # shellcheck disable=SC2086  # FAULT_MODEL: traingen's model options
  "$TRAINGEN" --out "$T/ck" ${FAULT_MODEL:---hidden 64 --layers 2 --vocab 512} --steps "${1:-3}" \
    >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
  V=$T/ck
  expect 0 "$DCR" diff "$V/v0.safetensors" "$V/v1.safetensors" -o "$T/v01.dcr" --span-elems $SPAN
  expect 0 "$DCR" inspect "$T/v01.dcr" -o json
  CHUNKS=$(python3 -S -c "import json; print(json.load(open('$T/out'))['chunks'])")
  [[ $CHUNKS -ge 12 ]] || fail "the model gives $CHUNKS chunks, want >= 12"
}

# --- Topology --------------------------------------------------------------
# root -> a0 -> {a1, a2}, root -> b0 -> {b1, b2} (two clusters, fanout 2):
# a0 and b0 are mid-tree relays. Every relay also gets a spare port
# (SPARE[name]) so that a proxy can sit at the topology's address while the
# relay listens on the spare one (fault_start --behind-proxy).
RELAYS=(a0 a1 a2 b0 b1 b2)
declare -A PORT=() SPARE=()
fault_topology() {  # fault_topology MIN_COMMIT [EXTRA_DEFAULTS]
  local ports i=1 n c
  read -r -a ports < <(free_ports $((2 * ${#RELAYS[@]} + 1)))
  [[ ${#ports[@]} -eq $((2 * ${#RELAYS[@]} + 1)) ]] || fail "could not pick free ports"
  for n in "${RELAYS[@]}"; do
    PORT[$n]=${ports[$i]}
    SPARE[$n]=${ports[$((i + ${#RELAYS[@]}))]}
    i=$((i + 1))
  done
  MIN_COMMIT=$1
  TOPO=$T/tree.yaml
  {
    echo "version: 1"
    echo "defaults: {transport: ${TRANSPORT/mixed/tcp}, fanout: 2, min_commit: $1, span_elems: $SPAN${2:+, $2}}"
    echo "root: {name: trainer, host: 127.0.0.1, port: ${ports[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
    echo "clusters:"
    echo "  - name: train"
    for c in a b; do
      echo "  - name: rollout-$c"
      echo "    nodes:"
      for n in "${RELAYS[@]}"; do
        [[ $n == "$c"* ]] || continue
        echo "      - {name: $n, host: 127.0.0.1, port: ${PORT[$n]}, store: {kind: file, path: \"$T/$n.safetensors\"}}"
      done
    done
    echo "links:"
    echo "  - {from: train, to: rollout-a, bandwidth: 1Gbps, latency: 1ms}"
    echo "  - {from: train, to: rollout-b, bandwidth: 1Gbps, latency: 1ms}"
  } >"$TOPO"
  expect 0 "$DCR" tree --topology "$TOPO" -o json
  json '[[d["nodes"][k]["name"] for k in n["children"]] for n in d["nodes"] if n["name"] in ("a0", "b0")] == [["a1", "a2"], ["b1", "b2"]]'
}

# fault_seed CKPT NAME...: those stores hold CKPT and no version record
# (NAME "base": the root's baseline).
fault_seed() {
  local ck=$1 n
  shift
  for n in "$@"; do
    cp "$ck" "$T/$n.safetensors"
    rm -f "$T/$n.safetensors.dcr-version"
  done
}

# --- Relays ----------------------------------------------------------------
# fault_start NAME [FAILPOINTS] [--behind-proxy] [RELAY ARGS...]: starts the
# relay with metrics on a free port and its own DCR_FAILPOINTS, ready
# within 10 s. --behind-proxy: it listens on SPARE[NAME] instead of the
# topology's port (fault_proxy then takes the topology's port).
fault_start() {
  local n=$1 fp=${2:-} extra=()
  shift $(($# >= 2 ? 2 : 1))
  if [[ ${1:-} == --behind-proxy ]]; then
    extra=(--listen "127.0.0.1:${SPARE[$n]}")
    shift
  fi
  rm -f "$T/$n.ready"
  DCR_FAILPOINTS=$fp "$RELAY" --topology "$TOPO" --node "$n" \
    --ready-file "$T/$n.ready" --metrics-port 0 --metrics-host 127.0.0.1 \
    "${extra[@]}" "$@" >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
  local i
  for i in $(seq 100); do
    [[ -s "$T/$n.ready" ]] && return 0
    kill -0 "${PID[$n]}" 2>/dev/null || { cat "$T/$n.log" >&2; fail "relay $n exited before it was ready"; }
    sleep 0.1
  done
  cat "$T/$n.log" >&2
  fail "relay $n not ready within 10 s"
}
fault_start_all() {  # fault_start_all: every relay of RELAYS without faults
  local n
  for n in "${RELAYS[@]}"; do fault_start "$n"; done
}

# fault_proxy NAME MODE...: a frame-aware TCP proxy (wire.py proxy) on the
# topology's port of NAME, forwarding to SPARE[NAME]; its events in
# $T/proxy-NAME.log.
fault_proxy() {
  local n=$1
  shift
  rm -f "$T/proxy-$n.ready"
  python3 "$FAULT_DIR/wire.py" proxy --listen "${PORT[$n]}" --to "${SPARE[$n]}" \
    --ready "$T/proxy-$n.ready" --events "$T/proxy-$n.log" "$@" 2>>"$T/proxy-$n.err" &
  XPID[$n]=$!
  disown "${XPID[$n]}"  # no "Killed" notice when the trap kills it
  local i
  for i in $(seq 100); do
    [[ -e "$T/proxy-$n.ready" ]] && return 0
    kill -0 "${XPID[$n]}" 2>/dev/null || { cat "$T/proxy-$n.err" >&2; fail "proxy of $n exited"; }
    sleep 0.1
  done
  fail "proxy of $n not ready within 10 s"
}

# fault_wait_log NAME TEXT [SECONDS]: TEXT appears in NAME's log (bounded).
fault_wait_log() {
  local i
  for i in $(seq $((${3:-10} * 20))); do
    grep -qF -- "$2" "$T/$1.log" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$T/$1.log" >&2
  fail "'$2' not in $1's log within ${3:-10} s"
}

# fault_wait_stopped NAME: the relay is stopped (SIGSTOP delivered: state T
# in /proc), within 5 s.
fault_wait_stopped() {
  local i
  for i in $(seq 500); do
    [[ $(awk '{print $3}' "/proc/${PID[$1]}/stat" 2>/dev/null) == T ]] && return 0
    sleep 0.01
  done
  fail "$1 not stopped within 5 s of SIGSTOP"
}

# fault_kill9 NAME: SIGKILL, gone within 5 s; FAULT_T0 = now.
fault_kill9() {
  local p=${PID[$1]}
  FAULT_T0=$(date +%s.%N)
  kill -KILL "$p"
  wait "$p" 2>/dev/null || true
  unset "PID[$1]"
  CRASHED+=("$1")
}
CRASHED=()  # relays that died mid-refit: their stores may hold a mix

fault_wait_exit() {  # fault_wait_exit NAME CODE: NAME exits CODE within 10 s
  local p=${PID[$1]} rc i
  for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "relay $1 still running"
  set +e
  wait "$p"
  rc=$?
  set -e
  unset "PID[$1]"
  [[ $rc -eq $2 ]] || { cat "$T/$1.log" >&2; fail "relay $1 exited $rc, want $2"; }
}

fault_wait_idle() {  # fault_wait_idle: every running relay idle within 20 s
  local names="" n i
  for n in "${!PID[@]}"; do names+="'$n',"; done
  for i in $(seq 200); do
    # exit 1 while a crashed relay is unreachable: the JSON says enough
    "$DCR" status --topology "$TOPO" --timeout 2s -o json >"$T/status.json" 2>"$T/err" || true
    if [[ -s $T/status.json ]] && python3 -S - "$T/status.json" <<PY; then
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if all(n['reachable'] and n['detail'].startswith('idle') for n in d['nodes'] if n['node'] in ($names)) else 1)
PY
      return 0
    fi
    sleep 0.1
  done
  cat "$T/status.json" "$T/err" >&2
  fail "relays not idle within 20 s"
}

# --- Refit and the end state -------------------------------------------------
# fault_snapshot: before a refit, every store's digest and every running
# relay's metrics (the checker compares against them).
fault_snapshot() {
  python3 "$FAULT_DIR/check.py" snapshot --dcr "$DCR" --dir "$T" \
    --nodes "${RELAYS[*]}" --alive "${!PID[*]}" >"$T/pre.json" || fail "snapshot"
}

# fault_refit TARGET [ARGS...]: dcr refit -o json; RC = its exit code,
# report in $T/report.json, stderr in $T/refit.err, REFIT_END = when it
# returned. Does not judge the exit code (the checker does).
MANUAL_REPAIRS=0  # dcr refit --node runs a row needed to repair a node
fault_refit() {  # fault_refit TARGET|"" [ARGS...] ("": no --target, e.g. --resume)
  local targs=(--target "$1") a
  for a in "$@"; do
    if [[ $a == --node && ${FAULT_SEEDING:-0} != 1 ]]; then MANUAL_REPAIRS=$((MANUAL_REPAIRS + 1)); fi
  done
  [[ -n $1 ]] || targs=()
  shift
  set +e
  DCR_FAILPOINTS=${COORD_FAILPOINTS:-} "$DCR" refit --topology "$TOPO" \
    "${targs[@]}" --progress never -o json --timeout "${REFIT_TIMEOUT:-10s}" \
    "$@" >"$T/report.json" 2>"$T/refit.err"
  RC=$?
  set -e
  REFIT_END=$(date +%s.%N)
  echo "$RC $REFIT_END" >"$T/refit.done"
  # In the background, $T/out belongs to the foreground's commands until
  # fault_refit_wait: copying here could replace a command's output between
  # its run and its check.
  [[ ${FAULT_REFIT_BG:-0} == 1 ]] || cp "$T/report.json" "$T/out"
}
# fault_refit_bg TARGET [ARGS...]: fault_refit in the background (REFIT_PID);
# fault_refit_wait then sets RC and REFIT_END and puts the report in $T/out.
fault_refit_bg() {
  rm -f "$T/refit.done"
  FAULT_REFIT_BG=1 fault_refit "$@" &
  REFIT_PID=$!
}
fault_refit_wait() {
  wait "$REFIT_PID" || true
  [[ -s $T/refit.done ]] || fail "dcr refit did not finish"
  read -r RC REFIT_END <"$T/refit.done"
  cp "$T/report.json" "$T/out"
}

# fault_check TARGET [CHECK ARGS...]: the end-state checker (check.py
# check) after the last refit: waits until every running relay is idle,
# then checks the invariants, prints a summary and, with DCR_FAULT_OUT,
# appends the run's metrics. Extra args: --expect-outcome OUTCOME,
# --excluded a1,a2 (exactly these are not committed), --tainted NODE=FILE
# (a store damaged on purpose must hold FILE's bits), --corrupt-victims,
# --injected-frames N, --hostile N:M ...
fault_check() {
  local target=$1 f faults=""
  shift
  fault_wait_idle
  for f in "${!FAULTS[@]}"; do faults+="$f=${FAULTS[$f]},"; done
  python3 "$FAULT_DIR/check.py" check --dcr "$DCR" --dir "$T" \
    --nodes "${RELAYS[*]}" --alive "${!PID[*]}" --crashed "${CRASHED[*]}" \
    --checkpoints "$V" --target "$target" --report "$T/report.json" --rc "$RC" \
    --status "$T/status.json" --row "$ROW" --seed "$SEED" --faults "$faults" \
    --t0 "${FAULT_T0:-}" --t-end "${REFIT_END:-}" --out "${DCR_FAULT_OUT:-}" \
    --manual-repairs "$MANUAL_REPAIRS" "$@" ||
    fail "end state (above)"
}

# baseline_state: "STEP clean|unfinished" from root.baseline's version
# record (step 0 when it never committed).
baseline_state() {
  python3 -S -c "
import json; r = json.load(open('$T/base.safetensors.dcr-version'))
print((r['committed'] or {'step': 0})['step'], 'unfinished' if r.get('in_progress') else 'clean')"
}
