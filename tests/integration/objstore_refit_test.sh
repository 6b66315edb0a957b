#!/usr/bin/env bash
# Refits through an object store, with real processes: the root's cluster
# "train" (one relay on its link), cluster "near" fed over a tree link, and
# cluster "far" with source: objstore (its head pulls the chunks from the
# store; the link from the root carries PLAN, votes and COMMIT), frames
# keyed with an HMAC key:
#   a. a delta refit commits everywhere, bit for bit; the chunk objects
#      are in the store under refits/<id>/f/ (the END last) and "far"'s
#      link carried no chunk
#   b. the root stores one object damaged (failpoint coord.upload): the
#      head drops it, votes incomplete, and the repair round's overwrite
#      objects bring it to the target
#   c. a relay of "far" started without the objstore section refuses the
#      PLAN, naming what to fix
#   e. (dir only) an object never stored: the head skips it after 10 s,
#      votes incomplete, and the repair round fixes it
#   d. a refit that aborts (a relay damages what it applies) leaves no
#      object in the store
# Usage: objstore_refit_test.sh BACKEND DCR RELAY TRAINGEN SOURCE_DIR
#   BACKEND: dir, or s3rver (skips, 77, when s3rver is not installed)
set -euo pipefail
BACKEND=$1 DCR=$2 RELAY=$3 TRAINGEN=$4 SRC=$5
T=$(mktemp -d /tmp/dcr-objstore-refit.XXXXXX)
declare -A PID=()
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

"$TRAINGEN" --out "$T/ck" --hidden 128 --layers 2 --vocab 4000 --lr 2e-6 \
  --steps 3 >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck
umask 077
head -c 32 /dev/urandom >"$T/frame.key"
umask 022

RELAYS=(t0 n0 n1 f0 f1 f2)
read -r -a PORTS <<<"$(free_ports 8)"
case $BACKEND in
  dir) OBJSTORE="objstore: {kind: dir, path: \"$T/objects\"}" ;;
  s3rver)
    S3RVER=$SRC/tools/s3rver/node_modules/.bin/s3rver
    [[ -x $S3RVER ]] || { echo "SKIP: s3rver is not installed (tools/setup)"; exit 77; }
    "$S3RVER" -d "$T/s3" -a 127.0.0.1 -p "${PORTS[7]}" --configure-bucket dcr-test \
      --silent >"$T/s3rver.log" 2>&1 &
    PID[s3rver]=$!
    for _ in $(seq 100); do
      curl -s -o /dev/null "http://127.0.0.1:${PORTS[7]}/" && break
      sleep 0.1
    done
    export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
    OBJSTORE="objstore: {kind: s3, endpoint: \"http://127.0.0.1:${PORTS[7]}\", bucket: dcr-test, prefix: dcr/}"
    ;;
  *) fail "backend must be dir or s3rver" ;;
esac

TOPO=$T/tree.yaml
{
  echo "version: 1"
  echo "defaults: {fanout: 2, min_commit: all, auth_key_file: \"$T/frame.key\"}"
  echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
  echo "clusters:"
  echo "  - name: train"
  echo "    nodes:"
  echo "      - {name: t0, host: 127.0.0.1, port: ${PORTS[1]}, store: {kind: file, path: \"$T/t0.safetensors\"}}"
  echo "  - name: near"
  echo "    nodes:"
  echo "      - {name: n0, host: 127.0.0.1, port: ${PORTS[2]}, store: {kind: file, path: \"$T/n0.safetensors\"}}"
  echo "      - {name: n1, host: 127.0.0.1, port: ${PORTS[3]}, store: {kind: file, path: \"$T/n1.safetensors\"}}"
  echo "  - name: far"
  echo "    source: objstore"
  echo "    nodes:"
  echo "      - {name: f0, host: 127.0.0.1, port: ${PORTS[4]}, store: {kind: file, path: \"$T/f0.safetensors\"}}"
  echo "      - {name: f1, host: 127.0.0.1, port: ${PORTS[5]}, store: {kind: file, path: \"$T/f1.safetensors\"}}"
  echo "      - {name: f2, host: 127.0.0.1, port: ${PORTS[6]}, store: {kind: file, path: \"$T/f2.safetensors\"}}"
  echo "links:"
  echo "  - {from: train, to: near, bandwidth: 1Gbps, latency: 1ms}"
  echo "  - {from: train, to: far, bandwidth: 1Gbps, latency: 1ms}"
  echo "$OBJSTORE"
} >"$TOPO"

start_relay() {  # start_relay NAME [TOPOLOGY]
  local n=$1 topo=${2:-$TOPO}
  rm -f "$T/$n.ready"
  "$RELAY" --topology "$topo" --node "$n" --ready-file "$T/$n.ready" \
    >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}
for n in "${RELAYS[@]}"; do cp "$V/v0.safetensors" "$T/$n.safetensors"; done
cp "$V/v0.safetensors" "$T/base.safetensors"

expect 0 "$DCR" tree --topology "$TOPO"
grep -q "f0 .*chunks from the objstore" "$T/out" || { cat "$T/out" >&2; fail "dcr tree does not show f0 pulling"; }

# --- a. a delta refit through the store ----------------------------------
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
refit_json 0 "$TOPO" --target "$V/v1.safetensors"
json 'd["outcome"] == "committed" and d["chunks"] > 0' \
  'all(n["committed"] and n["code"] == "ok" for n in d["nodes"])'
cp "$T/out" "$T/refit1.json"
REFIT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["refit"])' "$T/out")
CHUNKS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["chunks"])' "$T/out")
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
grep -q "pulling refit $REFIT's chunks from" "$T/f0.log" || { cat "$T/f0.log" >&2; fail "f0 did not pull"; }
grep -q "pulling refit" "$T/n0.log" && fail "n0 (source: relay) pulled"
case $BACKEND in
  dir) ls "$T/objects/refits/$REFIT/f/" >"$T/objects.list" ;;
  s3rver) (cd "$T/s3/dcr-test/dcr/refits/$REFIT/f" && ls | sed -n 's/\._S3rver_object$//p') >"$T/objects.list" ;;
esac
# Every chunk, then END: one more object than chunks.
[[ $(wc -l <"$T/objects.list") -eq $((CHUNKS + 1)) ]] ||
  { grep -i "objstore\|dropping" "$T/f0.log" >&2; cat "$T/refit1.json" >&2; fail "$(wc -l <"$T/objects.list") objects for $CHUNKS chunks and END"; }
[[ $(head -1 "$T/objects.list") == 0000000000 ]] || fail "objects do not start at 0000000000"

# --- b. a damaged object: dropped, voted incomplete, repaired ----------
# The root stores its 3rd object damaged (coord.upload=corrupt@3): f0's
# frame check fails, it drops the chunk and votes incomplete naming the
# tensor; the repair round's overwrite chunks reach it as new objects.
DCR_FAILPOINTS=coord.upload=corrupt@3 refit_json 0 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "committed" and d["repair_rounds"] >= 1'
verify_all "$V/v2.safetensors" "${RELAYS[@]}"
grep -q "dropping an object of refit" "$T/f0.log" || { cat "$T/f0.log" >&2; fail "f0 did not drop the damaged object"; }

# --- c. a head without the object store refuses the PLAN -----------------
sed '/^objstore:/d; s/    source: objstore//' "$TOPO" >"$T/plain.yaml"
stop_relay f0
start_relay f0 "$T/plain.yaml"
wait_ready f0
refit_json 1 "$TOPO" --target "$V/v3.safetensors"
node_json f0 'n["code"] == "rejected" and "has none: start it with --topology naming the objstore" in n["detail"]'
verify_all "$V/v2.safetensors" f0

stop_relay f0
start_relay f0
wait_ready f0

# --- e. an object never stored (dir store only: it waits 10 s) -----------
# The root never stores its 2nd object (coord.upload=drop@2): the head
# skips it 10 s after a later one appeared, votes incomplete, and the
# repair round brings it to the target.
if [[ $BACKEND == dir ]]; then
  DCR_FAILPOINTS=coord.upload=drop@2 expect 0 "$DCR" refit --topology "$TOPO" \
    --progress never -o json --timeout 30s --target "$V/v3.safetensors"
  json 'd["outcome"] == "committed" and d["repair_rounds"] >= 1'
  grep -q "is still missing 10 s after a later object appeared" "$T/f0.log" ||
    { cat "$T/f0.log" >&2; fail "f0 did not skip the missing object"; }
  verify_all "$V/v3.safetensors" "${RELAYS[@]}"
  GOOD=$V/v3.safetensors NEXT=$V/v2.safetensors
else
  GOOD=$V/v2.safetensors NEXT=$V/v3.safetensors
fi

# --- d. an aborted refit's objects are removed ----------------------------
# n1 damages every chunk it applies: its votes stay no through the repair
# rounds, the refit aborts, and the root removes the refit's objects.
stop_relay n1
rm -f "$T/n1.ready"
DCR_FAILPOINTS=relay.apply_chunk=corrupt "$RELAY" --topology "$TOPO" --node n1 \
  --ready-file "$T/n1.ready" >>"$T/n1.log" 2>&1 &
PID[n1]=$!
wait_ready n1
refit_json 1 "$TOPO" --target "$NEXT"
json 'd["outcome"] == "aborted" and d["chunks"] > 0'
REFIT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["refit"])' "$T/out")
grep -q "pulling refit $REFIT's chunks" "$T/f0.log" || fail "f0 did not pull the aborted refit"
case $BACKEND in
  dir) left=$( (find "$T/objects/refits/$REFIT" -type f 2>/dev/null || true) | wc -l) ;;
  s3rver) left=$( (find "$T/s3/dcr-test/dcr/refits/$REFIT" -name '*._S3rver_object' 2>/dev/null || true) | wc -l) ;;
esac
[[ $left -eq 0 ]] || fail "$left objects of the aborted refit $REFIT are left"
grep -q "removed the aborted refit's [1-9][0-9]* objects" "$T/err" || { cat "$T/err" >&2; fail "the root did not remove the aborted refit's objects"; }
verify_all "$GOOD" "${RELAYS[@]}"
echo "PASS objstore_refit_$BACKEND"
